"""Completion logs (lmpo.trainer.run.completions): the JSONL table, TensorBoard text, `lmpo show`, resume."""

from __future__ import annotations

import json

import pytest
from trainer_helpers import make_trainer

from lmpo.cli import main
from lmpo.trainer.run.completions import CompletionLog, read_completions


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    run_dir = tmp_path_factory.mktemp("completions") / "run"
    make_trainer(run_dir, logging={"completions_every_steps": 1, "completions_per_step": 5, "tensorboard": True},
                 loop={"steps": 2}).train()
    return run_dir


def test_records_hold_the_rollout_with_its_rewards(run):
    rows = [json.loads(line) for line in (run / "completions.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == [1] * 5 + [2] * 5
    for r in rows:
        assert set(r) == {"step", "group", "prompt", "completion", "answer", "reward", "rewards", "advantage",
                          "correct", "length"}
        # the config's rewards: exact_match + length_penalty, weights 1 and 1
        assert r["reward"] == pytest.approx(r["rewards"]["exact_match"] + r["rewards"]["length_penalty"], abs=1e-6)
        assert r["correct"] == (r["completion"].strip() == r["answer"])
        assert r["prompt"].endswith("=")
    first_group = [r for r in rows if r["step"] == 1 and r["group"] == 0]
    assert len(first_group) == 4  # G = 4: one whole group, then the next one's first row
    assert sum(r["advantage"] for r in first_group) == pytest.approx(0.0, abs=1e-5)  # GRPO: zero mean in a group


def test_tensorboard_gets_the_table(run):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    acc = EventAccumulator(str(run / "tensorboard"), size_guidance={"tensors": 0})
    acc.Reload()
    tags = acc.Tags()["tensors"]
    assert any(t.startswith("completions") for t in tags), tags
    events = acc.Tensors(next(t for t in tags if t.startswith("completions")))
    assert [e.step for e in events] == [1, 2]
    assert "| step | group | reward |" in events[0].tensor_proto.string_val[0].decode()


def test_lmpo_show(run, capsys):
    assert main(["show", str(run)]) == 0
    out = capsys.readouterr().out
    assert out.startswith("step 2: 5 completions") and out.count("[group ") == 5
    assert main(["show", str(run), "--step", "1"]) == 0
    assert capsys.readouterr().out.startswith("step 1: 5 completions")
    assert main(["show", str(run), "--step", "7"]) == 2
    err = capsys.readouterr().err
    assert "--step 7: " in err and "logged steps: 1, 2" in err


def test_a_resumed_run_drops_the_steps_after_its_checkpoint(run, tmp_path):
    copy = tmp_path / "run"
    copy.mkdir()
    (copy / "completions.jsonl").write_bytes((run / "completions.jsonl").read_bytes())
    log = CompletionLog(copy, every_steps=1, per_step=5, start_step=1)
    log.close()
    step, records = read_completions(copy)
    assert step == 1 and len(records) == 5
    with pytest.raises(Exception, match="has no completions.jsonl"):
        read_completions(tmp_path)
