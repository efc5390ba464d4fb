"""Built-in tasks (deterministic, held-out split disjoint) and file / dataset loaders with their errors."""

import json

import pytest

from lmpo.rewards import REWARDS
from lmpo.tasks import (
    TASKS,
    Example,
    load_file_task,
    load_hf_task,
    load_task,
    make_task,
    split_examples,
)


@pytest.mark.parametrize("name", ["addition", "reversal", "countdown"])
def test_builtin_deterministic_and_disjoint(name):
    task = make_task(name, num_train=2000, num_eval=100)
    train0, train0_again, train1 = task.train_examples(0), task.train_examples(0), task.train_examples(1)
    assert train0 == train0_again and train0 != train1 and len(train0) == 2000
    held_out = make_task(name, num_train=10, num_eval=100).eval_examples()
    assert held_out == task.eval_examples() and len({ex.prompt for ex in held_out}) == 100
    held_prompts = {ex.prompt for ex in held_out}
    for seed in range(3):
        assert not held_prompts & {ex.prompt for ex in task.train_examples(seed)}
    # the reference completion scores 1.0 under the task's accuracy reward
    ref = [task.reference_completion(ex) for ex in held_out]
    scores = REWARDS[task.accuracy_reward]([e.prompt for e in held_out], ref, [e.answer for e in held_out])
    assert scores == [1.0] * 100
    for reward, weight in task.default_rewards:
        assert reward in REWARDS and weight > 0


def test_addition_values_and_digit_range():
    task = make_task("addition", min_digits=2, max_digits=3, num_train=500)
    for ex in task.train_examples(0):
        a, b = ex.prompt[:-1].split("+")
        assert int(a) + int(b) == int(ex.answer) and ex.meta == {"a": int(a), "b": int(b)}
        assert 2 <= len(a) <= 3 and 2 <= len(b) <= 3
    with pytest.raises(ValueError, match="min_digits"):
        make_task("addition", min_digits=3, max_digits=2)


def test_reversal_and_countdown_examples():
    ex = make_task("reversal").train_examples(0)[0]
    text = ex.prompt[len("rev ") : -1]
    assert ex.prompt == f"rev {text}=" and ex.answer == text[::-1]
    cd = make_task("countdown").train_examples(0)[0]
    numbers, target = cd.prompt[:-1].split(">")
    assert int(target) == int(cd.answer) and sorted(map(int, numbers.split())) == sorted(cd.meta["numbers"])


def test_eval_larger_than_space_is_refused():
    with pytest.raises(ValueError, match="num_eval"):
        make_task("addition", max_digits=1, num_eval=80).eval_examples()  # 100 distinct prompts


def test_unknown_task_lists_builtins():
    with pytest.raises(ValueError, match="addition"):
        make_task("no-such-task")
    assert {"addition", "reversal", "countdown"} <= set(TASKS)


def test_task_families_resolve_prefixed_names(monkeypatch):
    from lmpo.config import ConfigError
    from lmpo.tasks import TASK_FAMILIES, Example, TaskFamily, load_task, register_task_family, task_family
    from lmpo.trainer.config import config_from_dict

    monkeypatch.setitem(TASK_FAMILIES, "fam", TaskFamily("fam", "lmpo.tasks.base:ListTask"))
    held_out = [Example("1+1=", "2")]
    task = make_task("fam/pairs", train=held_out, eval=held_out)
    assert task.name == "pairs" and task.eval_examples() == held_out  # the factory got the name after the prefix
    assert load_task("fam/pairs", train=[], eval=held_out).eval_examples() == held_out  # not taken for a hub name
    assert task_family("fam/pairs") is TASK_FAMILIES["fam"] and task_family("fam/") is None
    config_from_dict({"task": {"name": "fam/pairs"}}).task.validate()
    with pytest.raises(ValueError, match="already registered"):
        register_task_family("fam", "x:y")
    with pytest.raises(ValueError, match="task families"):
        make_task("famm/pairs")
    monkeypatch.setitem(TASK_FAMILIES, "fam", TaskFamily("fam", "lmpo.tasks.base:ListTask", requires="lmpo_no_such"))
    with pytest.raises(ValueError, match=r"pip install 'lmpo\[lmpo_no_such\]'"):
        make_task("fam/pairs", train=[], eval=[])
    with pytest.raises(ConfigError, match=r"`task.name` = 'fam/pairs' needs the lmpo_no_such package"):
        config_from_dict({"task": {"name": "fam/pairs"}}).task.validate()


ROWS = [{"question": f"{i}*2=", "answer": str(2 * i), "level": i % 3} for i in range(40)]


def _write(tmp_path, fmt):
    path = tmp_path / f"data.{fmt}"
    if fmt == "json":
        path.write_text(json.dumps(ROWS))
    elif fmt == "jsonl":
        path.write_text("\n".join(json.dumps(r) for r in ROWS) + "\n")
    else:
        import pyarrow as pa
        import pyarrow.parquet as pq

        pq.write_table(pa.Table.from_pylist(ROWS), path)
    return path


@pytest.mark.parametrize("fmt", ["json", "jsonl", "parquet"])
def test_file_task_formats(tmp_path, fmt):
    path = _write(tmp_path, fmt)
    task = load_file_task(str(path), prompt_field="question", eval_fraction=0.25, split_seed=0)
    train, held = task.train_examples(), task.eval_examples()
    assert len(train) == 30 and len(held) == 10
    assert not {e.prompt for e in train} & {e.prompt for e in held}
    assert {e.prompt for e in train} | {e.prompt for e in held} == {r["question"] for r in ROWS}
    first = next(e for e in train + held if e.prompt == "3*2=")
    assert first == Example("3*2=", "6", {"level": 0})
    # the same split whatever the format
    assert (
        held
        == load_file_task(
            str(_write(tmp_path, "jsonl")), prompt_field="question", eval_fraction=0.25
        ).eval_examples()
    )


def test_file_task_template_and_eval_file(tmp_path):
    path = _write(tmp_path, "jsonl")
    eval_path = tmp_path / "eval.jsonl"
    eval_path.write_text(json.dumps(ROWS[0]) + "\n" + json.dumps(ROWS[1]) + "\n")
    task = load_file_task(str(path), eval_path=str(eval_path), prompt_template="Q: {question} L{level}")
    assert [e.prompt for e in task.eval_examples()] == ["Q: 0*2= L0", "Q: 1*2= L1"]
    assert len(task.train_examples()) == 38
    assert load_task(str(path), prompt_field="question").eval_examples()


def test_file_task_errors(tmp_path):
    missing = tmp_path / "nope.jsonl"
    with pytest.raises(FileNotFoundError) as err:
        load_file_task(str(missing))
    assert str(missing) in str(err.value) and ".parquet" in str(err.value)
    path = _write(tmp_path, "jsonl")
    with pytest.raises(KeyError) as err:
        load_file_task(str(path))  # default prompt_field "prompt" is absent
    assert "'prompt'" in str(err.value) and "question" in str(err.value) and "prompt_field" in str(err.value)
    bad = tmp_path / "data.csv"
    bad.write_text("a,b\n")
    with pytest.raises(ValueError, match="unsupported extension"):
        load_file_task(str(bad))
    with pytest.raises(ValueError, match="eval_fraction"):
        load_file_task(str(path), prompt_field="question", eval_fraction=1.0)
    broken = tmp_path / "broken.jsonl"
    broken.write_text('{"prompt": "a", "answer": "b"}\n{oops\n')
    with pytest.raises(ValueError, match="line 2"):
        load_file_task(str(broken))


@pytest.mark.parametrize(("row", "field", "kind"), [
    ({"prompt": "1+1=", "answer": None}, "answer", "null"),
    ({"prompt": "1+1=", "answer": [2]}, "answer", "a list"),
    ({"prompt": "1+1=", "answer": {"value": 2}}, "answer", "a dict"),
    ({"prompt": None, "answer": "2"}, "prompt", "null"),
    ({"prompt": ["1+1="], "answer": "2"}, "prompt", "a list"),
    ({"prompt": "1+1=", "completion": None}, "completion", "null"),
])
def test_file_rows_that_are_not_text_are_refused(tmp_path, row, field, kind):
    """A null, list or object where text belongs is refused naming the file, row and field; str() would have made
    it 'None' or a repr that no reward matches."""
    path = tmp_path / "rows.jsonl"
    path.write_text(json.dumps({"prompt": "2+2=", "answer": 4}) + "\n" + json.dumps(row) + "\n")
    with pytest.raises(ValueError, match=rf"rows.jsonl: row 1 field '{field}'.* is {kind} "):
        load_file_task(str(path))


def test_split_drops_train_rows_sharing_a_held_out_prompt():
    examples = [Example("same", "1"), Example("same", "1")] + [Example(str(i), "x") for i in range(8)]
    for seed in range(5):
        train, held = split_examples(examples, 0.3, seed)
        assert not {e.prompt for e in train} & {e.prompt for e in held}


def test_hf_task_from_saved_dataset(tmp_path):
    datasets = pytest.importorskip("datasets")
    ds = datasets.Dataset.from_list(ROWS)
    ds.save_to_disk(str(tmp_path / "single"))
    task = load_hf_task(str(tmp_path / "single"), prompt_field="question", eval_fraction=0.25)
    assert len(task.train_examples()) == 30 and len(task.eval_examples()) == 10
    dd = datasets.DatasetDict({"train": ds.select(range(30)), "test": ds.select(range(30, 40))})
    dd.save_to_disk(str(tmp_path / "dict"))
    task = load_hf_task(str(tmp_path / "dict"), split="train", eval_split="test", prompt_field="question")
    assert [e.prompt for e in task.eval_examples()] == [r["question"] for r in ROWS[30:]]
    with pytest.raises(KeyError, match="splits"):
        load_hf_task(str(tmp_path / "dict"), split="validation", prompt_field="question")
