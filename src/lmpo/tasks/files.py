"""Tasks from local JSON / JSONL / Parquet files and from Hugging Face ``datasets``.

Rows need a prompt field and an answer field (names configurable); every other field is kept in
``Example.meta`` and reaches reward functions as a keyword argument (TRL's convention). The held-out split
is a seeded random ``eval_fraction`` of the rows, or a separate file / split when given.

Both of TRL's dataset formats are read: a prompt is a string (standard) or a list of ``{"role", "content"}``
messages (conversational, rendered later by the policy's chat template: ``lmpo.tasks.chat``). A row without
the answer field may give its reference as TRL's ``completion`` column instead (a string, or a list of
messages whose last ``content`` is the answer).
"""

from __future__ import annotations

import json
import os
import random
from collections.abc import Iterable, Mapping
from typing import Any

from lmpo.tasks.base import TASKS, Example, ListTask, make_task, task_family
from lmpo.tasks.chat import is_conversation

FILE_FORMATS = (".json", ".jsonl", ".parquet")


def read_rows(path: str) -> list[dict[str, Any]]:
    if not os.path.isfile(path):
        raise FileNotFoundError(
            f"task file {path!r} does not exist (working directory: {os.getcwd()}); give a path to a "
            f"{' / '.join(FILE_FORMATS)} file with one prompt and one answer per row"
        )
    ext = os.path.splitext(path)[1].lower()
    if ext in (".jsonl", ".json"):
        raw = open(path, "rb").read()
        try:
            text = raw.decode("utf-8")
        except UnicodeDecodeError as e:
            raise ValueError(f"task file {path!r} is not UTF-8 text (byte offset {e.start}: "
                             f"{raw[e.start:e.start + 4]!r}); re-encode it as UTF-8, e.g. "
                             "`iconv -f GB18030 -t UTF-8`") from None
    if ext == ".jsonl":
        rows = []
        for line_no, line in enumerate(text.splitlines(), 1):
            if line.strip():
                try:
                    rows.append(json.loads(line))
                except json.JSONDecodeError as e:
                    raise ValueError(f"{path}: line {line_no} is not valid JSON ({e})") from e
        return rows
    if ext == ".json":
        try:
            data = json.loads(text)
        except json.JSONDecodeError as e:
            raise ValueError(f"{path} is not valid JSON (line {e.lineno}, column {e.colno}: {e.msg})") from None
        if isinstance(data, dict):
            # {"data": [...]} / {"train": [...]} wrappers, or a column dict {"prompt": [...], "answer": [...]}
            lists = {k: v for k, v in data.items() if isinstance(v, list)}
            if len(lists) == 1:
                data = next(iter(lists.values()))
            elif lists and len({len(v) for v in lists.values()}) == 1:
                keys = list(lists)
                data = [dict(zip(keys, vals)) for vals in zip(*lists.values())]
        if not isinstance(data, list):
            raise ValueError(f"{path}: expected a JSON list of objects (rows), got {type(data).__name__}")
        return data
    if ext == ".parquet":
        try:
            import pyarrow.parquet as pq
        except ImportError as e:
            raise ImportError(f"reading {path} needs pyarrow: pip install 'lmpo[data]'") from e
        return pq.read_table(path).to_pylist()
    raise ValueError(f"task file {path!r} has an unsupported extension {ext!r}; accepted: {FILE_FORMATS}")


def _scalar_text(value: Any, where: str, what: str, fix: str) -> str:
    """``value`` as text when it is a string or a number; a null, list or object is refused (``str()`` would turn it
    into ``'None'`` or its repr, which no reward function matches)."""
    if isinstance(value, str) or (isinstance(value, (int, float)) and not isinstance(value, bool)):
        return str(value)
    kind = "null" if value is None else f"a {'list' if isinstance(value, list) else type(value).__name__}"
    shown = repr(value) if len(repr(value)) <= 60 else repr(value)[:57] + "..."
    raise ValueError(f"{where} is {kind} ({shown}); {what} must be a string or a number. {fix}")


def _answer(row: Mapping[str, Any], answer_field: str, where: str) -> tuple[str, str] | None:
    """(the column used, the reference answer) of a row, or None when it has neither field."""
    fix = "Fix or drop the row, or set answer_field to the column that holds the reference answer."
    if answer_field in row:
        return answer_field, _scalar_text(row[answer_field], f"{where} field {answer_field!r}", "an answer", fix)
    if "completion" in row:  # TRL's prompt-completion format: the completion is the reference
        completion = row["completion"]
        if is_conversation(completion):
            return "completion", _scalar_text(completion[-1]["content"], f"{where} field 'completion' (last message)",
                                              "an answer", fix)
        return "completion", _scalar_text(completion, f"{where} field 'completion'", "an answer", fix)
    return None


def rows_to_examples(
    rows: Iterable[Mapping[str, Any]],
    prompt_field: str = "prompt",
    answer_field: str = "answer",
    prompt_template: str | None = None,
    source: str = "data",
) -> list[Example]:
    """Rows (dicts) -> ``Example`` list; ``prompt_template`` like ``"Q: {question}\\nA:"`` formats the row.

    A conversational prompt (a list of role/content messages) becomes ``Example.messages`` with an empty
    ``prompt`` until ``lmpo.tasks.render_prompts`` renders it with the policy's chat template.
    """
    examples = []
    for i, row in enumerate(rows):
        if not isinstance(row, Mapping):
            raise ValueError(f"{source}: row {i} is a {type(row).__name__}, expected an object with fields")
        if not prompt_template and prompt_field not in row:
            raise KeyError(
                f"{source}: row {i} has no field {prompt_field!r}; fields present: {sorted(row)}. "
                f"Set prompt_field / answer_field to the right column names."
            )
        answer = _answer(row, answer_field, f"{source}: row {i}")
        if answer is None:
            raise KeyError(
                f"{source}: row {i} has no field {answer_field!r} (nor TRL's 'completion'); fields present: "
                f"{sorted(row)}. Set answer_field to the column holding the reference answer."
            )
        answer_column, answer_text = answer
        messages = None
        if prompt_template:
            try:
                prompt = prompt_template.format(**row)
            except KeyError as e:
                raise KeyError(
                    f"{source}: prompt_template {prompt_template!r} uses field {e.args[0]!r} missing from row "
                    f"{i}; fields present: {sorted(row)}"
                ) from None
        elif is_conversation(row[prompt_field]):
            prompt, messages = "", [dict(m) for m in row[prompt_field]]
        else:
            prompt = _scalar_text(row[prompt_field], f"{source}: row {i} field {prompt_field!r}", "a prompt (or a "
                                  "list of {role, content} messages)", "Fix or drop the row, or set prompt_field to "
                                  "the column that holds the prompt.")
        # TRL passes neither the prompt nor the reference completion to reward functions as a column
        meta = {k: v for k, v in row.items() if k not in (prompt_field, answer_column, "completion")}
        examples.append(Example(prompt=prompt, answer=answer_text, meta=meta, messages=messages))
    if not examples:
        raise ValueError(f"{source}: no rows")
    return examples


def prompt_key(example: Example) -> str:
    """What identifies a prompt when splits are kept apart: its text, or its conversation when it has one."""
    if example.messages is not None:
        return json.dumps(example.messages, sort_keys=True, ensure_ascii=False, default=str)
    return example.prompt


def _without(examples: list[Example], held_out: list[Example]) -> list[Example]:
    keys = {prompt_key(ex) for ex in held_out}
    return [ex for ex in examples if prompt_key(ex) not in keys]


def split_examples(
    examples: list[Example], eval_fraction: float, seed: int = 0
) -> tuple[list[Example], list[Example]]:
    """Seeded split into (train, eval); rows whose prompt is in eval are removed from train."""
    if not 0.0 < eval_fraction < 1.0:
        raise ValueError(
            f"eval_fraction={eval_fraction} must be in (0, 1); use eval_path for a separate file"
        )
    order = list(range(len(examples)))
    random.Random(seed).shuffle(order)
    num_eval = max(1, round(eval_fraction * len(examples)))
    if num_eval >= len(examples):
        raise ValueError(
            f"eval_fraction={eval_fraction} leaves no training rows out of {len(examples)}; lower it"
        )
    eval_ex = [examples[i] for i in sorted(order[:num_eval])]
    # Duplicated prompts would leak the held-out answer into training.
    train_ex = _without([examples[i] for i in sorted(order[num_eval:])], eval_ex)
    return train_ex, eval_ex


def task_from_rows(
    rows: Iterable[Mapping[str, Any]],
    eval_rows: Iterable[Mapping[str, Any]] | None = None,
    *,
    name: str = "data",
    prompt_field: str = "prompt",
    answer_field: str = "answer",
    eval_fraction: float = 0.1,
    prompt_template: str | None = None,
    split_seed: int = 0,
    default_rewards: tuple[tuple[str, float], ...] = (("exact_match", 1.0),),
    accuracy_reward: str = "exact_match",
    eval_name: str | None = None,
) -> ListTask:
    """A task from rows in memory: a list of dicts or a ``datasets.Dataset`` (standard or conversational).

    The held-out split is ``eval_rows`` when given (their prompts are removed from training), else a
    ``split_seed``-seeded ``eval_fraction`` of ``rows``.

    >>> task = task_from_rows(datasets.load_from_disk("my_data")["train"])
    """
    examples = rows_to_examples(rows, prompt_field, answer_field, prompt_template, source=name)
    if eval_rows is not None:
        eval_ex = rows_to_examples(eval_rows, prompt_field, answer_field, prompt_template,
                                   source=eval_name or f"{name} (held-out rows)")
        train_ex = _without(examples, eval_ex)
    else:
        train_ex, eval_ex = split_examples(examples, eval_fraction, split_seed)
    return ListTask(name=name, train=train_ex, eval=eval_ex, default_rewards=default_rewards,
                    accuracy_reward=accuracy_reward)


def load_file_task(
    path: str,
    prompt_field: str = "prompt",
    answer_field: str = "answer",
    eval_fraction: float = 0.1,
    eval_path: str | None = None,
    prompt_template: str | None = None,
    split_seed: int = 0,
    default_rewards: tuple[tuple[str, float], ...] = (("exact_match", 1.0),),
    accuracy_reward: str = "exact_match",
) -> ListTask:
    """A task from a local ``.json`` (list of objects), ``.jsonl`` or ``.parquet`` file.

    The held-out split is ``eval_path`` when given, else a ``split_seed``-seeded ``eval_fraction`` of rows.
    """
    task = task_from_rows(
        read_rows(path), read_rows(eval_path) if eval_path is not None else None, name=path,
        eval_name=eval_path, prompt_field=prompt_field, answer_field=answer_field, eval_fraction=eval_fraction,
        prompt_template=prompt_template, split_seed=split_seed, default_rewards=default_rewards,
        accuracy_reward=accuracy_reward)
    task.name = os.path.basename(path)
    return task


def load_split(name: str, which: str, subset: str | None):
    try:
        import datasets
    except ImportError as e:
        raise ImportError(
            f"loading dataset {name!r} needs the datasets package: pip install 'lmpo[data]'"
        ) from e
    if os.path.isdir(name):
        ds = datasets.load_from_disk(name)
        if isinstance(ds, datasets.DatasetDict):
            if which not in ds:
                raise KeyError(f"dataset {name!r} has no split {which!r}; splits: {sorted(ds)}")
            ds = ds[which]
        return ds
    return datasets.load_dataset(name, subset, split=which)


def load_hf_task(
    name: str,
    split: str = "train",
    eval_split: str | None = None,
    prompt_field: str = "prompt",
    answer_field: str = "answer",
    eval_fraction: float = 0.1,
    prompt_template: str | None = None,
    subset: str | None = None,
    split_seed: int = 0,
    default_rewards: tuple[tuple[str, float], ...] = (("exact_match", 1.0),),
    accuracy_reward: str = "exact_match",
) -> ListTask:
    """A task from a Hugging Face dataset: a hub name (needs network, cached by ``datasets``) or a local
    directory written by ``Dataset.save_to_disk`` / ``DatasetDict.save_to_disk``.

    The held-out split is ``eval_split`` when given, else a seeded ``eval_fraction`` of ``split``.
    """
    task = task_from_rows(
        load_split(name, split, subset), load_split(name, eval_split, subset) if eval_split is not None else None,
        name=f"{name}[{split}]", eval_name=f"{name}[{eval_split}]", prompt_field=prompt_field,
        answer_field=answer_field, eval_fraction=eval_fraction, prompt_template=prompt_template,
        split_seed=split_seed, default_rewards=default_rewards, accuracy_reward=accuracy_reward)
    task.name = name
    return task


#: what ``load_task``'s ``kind`` may say the name is (None: guess from the name)
TASK_KINDS = ("builtin", "file", "hf")


def load_task(name_or_path: str, kind: str | None = None, **options: Any):
    """The one task loader: a built-in task name, a local file, a saved dataset directory or a hub dataset name.

    ``kind`` says which (``"builtin"``, ``"file"``, ``"hf"``, as the trainer's ``task.name`` does); None guesses it
    from the name: a registered task, a ``FILE_FORMATS`` extension, a directory or an ``org/name``.
    ``options`` go to the task class (built-ins) or to ``load_file_task`` / ``load_hf_task``.
    """
    if kind is None:
        if name_or_path in TASKS or task_family(name_or_path):
            kind = "builtin"
        elif os.path.splitext(name_or_path)[1].lower() in FILE_FORMATS:
            kind = "file"
        elif os.path.isdir(name_or_path) or "/" in name_or_path:
            kind = "hf"
        else:
            raise ValueError(
                f"task {name_or_path!r} is not a built-in task ({sorted(TASKS)}), a {'/'.join(FILE_FORMATS)} file, "
                "or a dataset directory / Hugging Face 'org/name'"
            )
    if kind == "builtin":
        return make_task(name_or_path, **options)
    if kind == "file":
        return load_file_task(name_or_path, **options)
    if kind == "hf":
        return load_hf_task(name_or_path, **options)
    raise ValueError(f"kind={kind!r} must be one of {TASK_KINDS} or None")
