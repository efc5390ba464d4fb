"""Tasks from local JSON / JSONL / Parquet files and from Hugging Face ``datasets``.

Rows need a prompt field and an answer field (names configurable); every other field is kept in
``Example.meta`` and reaches reward functions as a keyword argument (TRL's convention). The held-out split
is a seeded random ``eval_fraction`` of the rows, or a separate file / split when given.
"""

from __future__ import annotations

import json
import os
import random
from collections.abc import Iterable, Mapping
from typing import Any

from lmpo.tasks.base import Example, ListTask

FILE_FORMATS = (".json", ".jsonl", ".parquet")


def _read_rows(path: str) -> list[dict[str, Any]]:
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


def rows_to_examples(
    rows: Iterable[Mapping[str, Any]],
    prompt_field: str = "prompt",
    answer_field: str = "answer",
    prompt_template: str | None = None,
    source: str = "data",
) -> list[Example]:
    """Rows (dicts) -> ``Example`` list; ``prompt_template`` like ``"Q: {question}\\nA:"`` formats the row."""
    examples = []
    for i, row in enumerate(rows):
        if not isinstance(row, Mapping):
            raise ValueError(f"{source}: row {i} is a {type(row).__name__}, expected an object with fields")
        for field_name in (answer_field,) if prompt_template else (prompt_field, answer_field):
            if field_name not in row:
                raise KeyError(
                    f"{source}: row {i} has no field {field_name!r}; fields present: {sorted(row)}. "
                    f"Set prompt_field / answer_field to the right column names."
                )
        if prompt_template:
            try:
                prompt = prompt_template.format(**row)
            except KeyError as e:
                raise KeyError(
                    f"{source}: prompt_template {prompt_template!r} uses field {e.args[0]!r} missing from row "
                    f"{i}; fields present: {sorted(row)}"
                ) from None
        else:
            prompt = str(row[prompt_field])
        meta = {k: v for k, v in row.items() if k not in (prompt_field, answer_field)}
        examples.append(Example(prompt=prompt, answer=str(row[answer_field]), meta=meta))
    if not examples:
        raise ValueError(f"{source}: no rows")
    return examples


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
    eval_prompts = {ex.prompt for ex in eval_ex}
    # Duplicated prompts would leak the held-out answer into training.
    train_ex = [examples[i] for i in sorted(order[num_eval:]) if examples[i].prompt not in eval_prompts]
    return train_ex, eval_ex


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
    examples = rows_to_examples(_read_rows(path), prompt_field, answer_field, prompt_template, source=path)
    if eval_path is not None:
        eval_ex = rows_to_examples(
            _read_rows(eval_path), prompt_field, answer_field, prompt_template, source=eval_path
        )
        eval_prompts = {ex.prompt for ex in eval_ex}
        train_ex = [ex for ex in examples if ex.prompt not in eval_prompts]
    else:
        train_ex, eval_ex = split_examples(examples, eval_fraction, split_seed)
    return ListTask(
        name=os.path.basename(path),
        train=train_ex,
        eval=eval_ex,
        default_rewards=default_rewards,
        accuracy_reward=accuracy_reward,
    )


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
    try:
        import datasets
    except ImportError as e:
        raise ImportError(
            f"loading dataset {name!r} needs the datasets package: pip install 'lmpo[data]'"
        ) from e

    def load(which: str):
        if os.path.isdir(name):
            ds = datasets.load_from_disk(name)
            if isinstance(ds, datasets.DatasetDict):
                if which not in ds:
                    raise KeyError(f"dataset {name!r} has no split {which!r}; splits: {sorted(ds)}")
                ds = ds[which]
            return ds
        return datasets.load_dataset(name, subset, split=which)

    source = f"{name}[{split}]"
    examples = rows_to_examples(load(split), prompt_field, answer_field, prompt_template, source=source)
    if eval_split is not None:
        eval_ex = rows_to_examples(
            load(eval_split), prompt_field, answer_field, prompt_template, source=f"{name}[{eval_split}]"
        )
        eval_prompts = {ex.prompt for ex in eval_ex}
        train_ex = [ex for ex in examples if ex.prompt not in eval_prompts]
    else:
        train_ex, eval_ex = split_examples(examples, eval_fraction, split_seed)
    return ListTask(
        name=name,
        train=train_ex,
        eval=eval_ex,
        default_rewards=default_rewards,
        accuracy_reward=accuracy_reward,
    )


def load_task(name_or_path: str, **options: Any):
    """One entry point: a built-in task name, a local file, a saved dataset directory or a hub dataset name.

    ``options`` go to the task class (built-ins) or to ``load_file_task`` / ``load_hf_task``.
    """
    from lmpo.tasks.base import TASKS, make_task

    if name_or_path in TASKS:
        return make_task(name_or_path, **options)
    if os.path.splitext(name_or_path)[1].lower() in FILE_FORMATS:
        return load_file_task(name_or_path, **options)
    if os.path.isdir(name_or_path) or "/" in name_or_path:
        return load_hf_task(name_or_path, **options)
    raise ValueError(
        f"task {name_or_path!r} is not a built-in task ({sorted(TASKS)}), a {'/'.join(FILE_FORMATS)} file, "
        "or a dataset directory / Hugging Face 'org/name'"
    )
