"""`lmpo plot` writes PNGs for several runs; `lmpo train` runs from the command line and rejects bad configs."""

from __future__ import annotations

import json

from lmpo.cli import main
from lmpo.plots import plot_runs


def _fake_run(path, slope: float):
    path.mkdir(parents=True)
    with open(path / "metrics.jsonl", "w") as fh:
        for step in range(1, 6):
            fh.write(json.dumps({"step": step, "kind": "train", "reward/mean": slope * step, "reward/accuracy": 0.1 * step,
                                 "entropy/mean": 1.0 / step, "clip/low_frac": 0.01, "clip/high_frac": 0.02,
                                 "kl/behaviour_k3": 0.001 * step}) + "\n")
        fh.write(json.dumps({"step": 5, "kind": "eval", "eval/accuracy": 0.5}) + "\n")


def test_plot_overlays_runs_and_writes_pngs(tmp_path):
    _fake_run(tmp_path / "a", 1.0)
    _fake_run(tmp_path / "b", 2.0)
    paths = plot_runs([tmp_path / "a", tmp_path / "b"], tmp_path / "out")
    assert sorted(p.name for p in paths) == ["accuracy.png", "clip_fraction.png", "entropy.png", "kl.png", "reward.png"]
    for p in paths:
        assert p.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and p.stat().st_size > 1000


def test_plot_cli(tmp_path, capsys):
    _fake_run(tmp_path / "a", 1.0)
    assert main(["plot", str(tmp_path / "a"), "--out", str(tmp_path / "png")]) == 0
    assert "reward.png" in capsys.readouterr().out
    assert main(["plot", str(tmp_path / "missing")]) == 2


def test_train_cli_bad_config_exits_2_with_message(tmp_path, capsys):
    cfg = tmp_path / "c.yaml"
    cfg.write_text(f"logging:\n  run_dir: {tmp_path / 'run'}\n")
    assert main(["train", str(cfg), "--objective.preset", "nope"]) == 2
    err = capsys.readouterr().err
    assert "objective.preset" in err and "'nope'" in err
    assert not (tmp_path / "run").exists()  # nothing was started


def test_train_cli_runs_with_overrides(tmp_path, capsys):
    run = tmp_path / "run"
    args = ["train", "--model.name", "tiny", "--task.options", "{min_digits: 1, max_digits: 1, num_eval: 10}",
            "--task.eval_examples", "4", "--loop.steps", "1", "--loop.prompts_per_step", "2",
            "--rollout.completions_per_prompt", "2", "--rollout.max_new_tokens", "2", "--logging.run_dir", str(run),
            "--logging.progress_bar", "false", "--logging.tensorboard", "false", "--loop.num_threads", "1",
            "--objective.preset", "dapo"]
    assert main(args) == 0
    out = capsys.readouterr().out
    assert "run directory" in out and "seqs_per_step=4" in out
    assert (run / "config.yaml").exists() and (run / "checkpoints" / "step_00000001" / "model.safetensors").exists()
    assert "preset: dapo" in (run / "config.yaml").read_text()
    assert (run / "plots" / "reward.png").read_bytes()[:4] == b"\x89PNG"  # every run ends with its plots


def test_train_cli_resume_continues_from_latest_checkpoint(tmp_path, capsys):
    run = tmp_path / "run"
    base = ["train", "--task.options", "{min_digits: 1, max_digits: 1, num_eval: 10}", "--task.eval_examples", "4",
            "--loop.prompts_per_step", "2", "--rollout.completions_per_prompt", "2", "--rollout.max_new_tokens", "2",
            "--logging.run_dir", str(run), "--logging.progress_bar", "false", "--logging.tensorboard", "false",
            "--loop.num_threads", "1", "--checkpoint.every_steps", "1", "--checkpoint.keep_last", "0",
            "--logging.plots", "false"]
    assert main(base + ["--loop.steps", "1"]) == 0
    assert main(base + ["--loop.steps", "2", "--resume"]) == 0
    assert "resumed from" in capsys.readouterr().out
    steps = [json.loads(line)["step"] for line in (run / "metrics.jsonl").read_text().splitlines()
             if json.loads(line)["kind"] == "train"]
    assert steps == [1, 2]
    assert sorted(p.name for p in (run / "checkpoints").iterdir()) == ["step_00000001", "step_00000002"]
