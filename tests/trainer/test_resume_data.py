"""``lmpo train --resume RUN`` and ``lmpo eval RUN`` read a run directory as data: a copied run writes to itself, a
stored config makes lmpo import nothing, and a newest checkpoint that does not load falls back to the previous one."""

from __future__ import annotations

import hashlib
import io
import json
import shutil
from contextlib import redirect_stderr, redirect_stdout
from pathlib import Path

import pytest
import yaml

from lmpo.cli import main

ROWS = [{"prompt": f"{a}+{b}=", "answer": str(a + b)} for a in range(4) for b in range(4)]


def _run(argv: list[str]) -> tuple[int, str]:
    """(exit status, stdout and stderr together) of one ``lmpo`` command."""
    out = io.StringIO()
    with redirect_stderr(out), redirect_stdout(out):
        code = main(argv)
    return code, out.getvalue()


@pytest.fixture(scope="module")
def finished_run(tmp_path_factory):
    """A two-step run of a file task with a checkpoint after each step."""
    root = tmp_path_factory.mktemp("resume_data")
    (root / "rows.jsonl").write_text("".join(json.dumps(r) + "\n" for r in ROWS))
    cfg = {"model": {"name": "tiny"}, "task": {"name": "file", "path": str(root / "rows.jsonl"), "eval_examples": 2},
           "rollout": {"completions_per_prompt": 2, "max_new_tokens": 2},
           "loop": {"steps": 2, "prompts_per_step": 2, "seqs_per_microbatch": 4, "device": "cpu"},
           "eval": {"at_start": False}, "checkpoint": {"every_steps": 1},
           "logging": {"run_dir": str(root / "run"), "progress_bar": False, "tensorboard": False, "plots": False}}
    (root / "train.yaml").write_text(yaml.safe_dump(cfg))
    code, out = _run(["train", str(root / "train.yaml")])
    assert code == 0, out
    return root / "run"


def _listing(run: Path) -> dict[str, bytes]:
    return {p.relative_to(run).as_posix(): p.read_bytes() for p in sorted(run.rglob("*")) if p.is_file()}


@pytest.mark.slow
def test_a_copied_run_resumes_into_itself(finished_run, tmp_path):
    copy = tmp_path / "copy"
    shutil.copytree(finished_run, copy)
    before = _listing(finished_run)
    code, out = _run(["train", "--resume", str(copy), "--loop.steps", "3"])
    assert code == 0, out
    assert (copy / "checkpoints" / "step_00000003").is_dir()
    assert _listing(finished_run) == before  # the run the copy was made from is not touched
    assert yaml.safe_load((copy / "config.yaml").read_text())["logging"]["run_dir"] == str(copy)


@pytest.mark.slow
def test_a_stored_config_imports_no_code(finished_run, tmp_path, monkeypatch):
    marker = tmp_path / "imported"
    (tmp_path / "planted_reward.py").write_text(f"open({str(marker)!r}, 'w').close()\n"
                                                "def score(completions, **kw):\n    return [0.0] * len(completions)\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    copy = tmp_path / "copy"
    shutil.copytree(finished_run, copy)
    stored = yaml.safe_load((copy / "config.yaml").read_text())
    stored["rewards"]["functions"] = ["exact_match", "planted_reward:score"]
    stored["task"]["options"] = {"accuracy_reward": "planted_reward:score"}
    (copy / "config.yaml").write_text(yaml.safe_dump(stored))
    code, out = _run(["train", "--resume", str(copy), "--loop.steps", "3", "--logging.run_dir", str(copy)])
    assert code == 2, out
    assert "`rewards.functions[1]` = 'planted_reward:score' comes from" in out and "Traceback" not in out
    code, out = _run(["eval", str(copy), "--n", "2", "--device", "cpu"])
    assert code == 2, out
    assert "--accuracy-reward planted_reward:score" in out
    assert not marker.exists(), "a run directory's config made lmpo import a module"


def _damage_keeping_manifest(checkpoint: Path, name: str) -> None:
    """Cut ``name`` short and record the cut bytes in the manifest: a file damaged before its manifest was written."""
    data = (checkpoint / name).read_bytes()[:200]
    (checkpoint / name).write_bytes(data)
    manifest = json.loads((checkpoint / "manifest.json").read_text())
    manifest["files"][name] = {"bytes": len(data), "sha256": hashlib.sha256(data).hexdigest()}
    (checkpoint / "manifest.json").write_text(json.dumps(manifest))


@pytest.mark.slow
def test_a_broken_newest_checkpoint_falls_back_to_the_previous_one(finished_run, tmp_path):
    copy = tmp_path / "copy"
    shutil.copytree(finished_run, copy)
    newest = copy / "checkpoints" / "step_00000002"
    _damage_keeping_manifest(newest, "model.safetensors")
    here = ["--loop.steps", "3", "--logging.run_dir", str(copy)]
    code, out = _run(["train", "--resume", str(newest), *here])  # a checkpoint the user names: no fallback
    assert code == 2 and "model.safetensors is not valid safetensors" in out, out
    code, out = _run(["train", "--resume", str(copy), *here])
    assert code == 0, out
    warnings = [ln for ln in out.splitlines() if ln.startswith("warning: checkpoint")]
    assert len(warnings) == 1 and str(newest) in warnings[0], out
    assert f"resumed from {copy / 'checkpoints' / 'step_00000001'} at step 1" in out
    rows = [json.loads(ln) for ln in (copy / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows if r["kind"] == "train"] == [1, 2, 3]  # step 2 again, once
