"""`lmpo sac train / sample / gate` end to end on the bundled sample corpus (no /work/shared access)."""

from __future__ import annotations

import argparse
import json

import pytest

from lmpo.cli import SAC_COMMANDS
from lmpo.textagent.env import sample_text_path
from lmpo.textagent.sac import cli as sac_cli
from sac_helpers import SMALL_CORPUS_ARGS


def main(argv: list[str]) -> int:
    """``lmpo sac …`` through the SAC register functions only (the full router imports every layer)."""
    parser = argparse.ArgumentParser(prog="lmpo")
    sub = parser.add_subparsers(dest="command").add_parser("sac").add_subparsers(dest="sac_command")
    for name in ("train", "sample", "gate"):
        module, func = SAC_COMMANDS[name].split(":")
        assert module == "lmpo.textagent.sac.cli"
        getattr(sac_cli, func)(sub, name)
    args = parser.parse_args(argv)
    return int(args.func(args) or 0)


@pytest.mark.slow
def test_cli_train_sample_gate(tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("LMPO_CACHE_DIR", str(tmp_path / "cache"))
    run = tmp_path / "run"
    args = [
        "sac", "train", "--run-dir", str(run), "--quiet", "--trace", "3",
        "--corpus", str(sample_text_path()), "--heldout_fraction", "0.25", "--num_envs", "2",
        "--total_env_steps", "120", "--learning_starts", "32", "--log_every_updates", "10",
        "--eval_every_updates", "20",
        "--threads", "1", "--eval_max_positions", "200", "--eval_generations", "2", "--eval_generation_chars", "8",
        "--eval_rollout_episodes", "4",
        "--net.embed_dim", "16", "--net.gru_hidden", "32", "--net.policy_hidden", "32", "--net.q_hidden", "32",
        "--net.action_embed_dim", "16", "--replay.transitions_per_batch", "32",
        "--env.window_chars", "8", "--env.max_steps", "16", "--env.nce_pretrain_steps", "5",
        "--env.use_jieba_lexicon", "false", *SMALL_CORPUS_ARGS,
    ]
    assert main(args) == 0
    out = capsys.readouterr().out
    assert out.count("Step 0") == 3 and "held-out top-1" in out
    summary = json.loads((run / "summary.json").read_text())
    ev = summary["eval"]
    assert summary["env_steps"] == 120 and summary["updates"] > 0
    assert 0.0 <= ev["agent"]["top1"] <= ev["agent"]["top3"] <= 1.0
    assert ev["baseline"]["top1"] == max(b["top1"] for b in ev["baseline_by_order"].values())
    assert ev["compliance"]["illegal_rate"] == 0.0  # the hard mask: sampling never picks an illegal action
    rows = [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines()]
    assert rows and "norm/cov_mean" in rows[-1] and "reward/cov" in rows[-1]
    # in-training held-out evaluation: every 20 updates (every second log row), same numbers as the final one
    evals = [r for r in rows if "quality/heldout_top1" in r]
    assert [r["step/updates"] for r in evals] == [u for u in (20, 40, 60, 80) if u <= summary["updates"]]
    assert summary["heldout_top1_curve"] == [[r["step/updates"], r["quality/heldout_top1"]] for r in evals]

    # --resume --eval-only re-evaluates the checkpoint from the saved config and gives the same numbers
    (run / "summary.json").unlink()
    assert main(["sac", "train", "--run-dir", str(run), "--resume", "--eval-only", "--quiet"]) == 0
    again = json.loads((run / "summary.json").read_text())
    assert again["updates"] == summary["updates"] and again["eval"]["agent"] == ev["agent"]
    capsys.readouterr()

    assert main(["sac", "sample", str(run), "--prompt", "的", "--max-new-chars", "5", "--greedy"]) == 0
    text = capsys.readouterr().out.strip()
    assert text.startswith("的") and 1 <= len(text) <= 6

    # one run is not enough for the gate: it must say FAIL (exit 1), and write both reports
    assert main(["sac", "gate", str(run), "--out", str(tmp_path / "gate")]) == 1
    gate = json.loads((tmp_path / "gate" / "gate.json").read_text())
    assert gate["overall"] == "FAIL"
    assert (tmp_path / "gate" / "gate.md").read_text().startswith("**Gate: FAIL**")


def test_resume_is_bit_exact_on_the_text_env(tmp_path, monkeypatch):
    import torch

    from lmpo.textagent.sac.config import TrainConfig, apply_overrides
    from lmpo.textagent.sac.train import Trainer

    monkeypatch.setenv("LMPO_CACHE_DIR", str(tmp_path / "cache"))
    cfg = apply_overrides(TrainConfig(), {
        "corpus": str(sample_text_path()), "heldout_fraction": 0.25, "num_envs": 2, "learning_starts": 32,
        "checkpoint_every_updates": 0, "threads": 1,
        "net": {"embed_dim": 16, "gru_hidden": 32, "policy_hidden": 32, "q_hidden": 32, "action_embed_dim": 16},
        "replay": {"transitions_per_batch": 32, "teacher_anneal_env_steps": 60},
        "env": {"window_chars": 8, "max_steps": 16, "nce_pretrain_steps": 5, "use_jieba_lexicon": False},
    })

    def params(t: Trainer) -> torch.Tensor:
        return torch.cat([p.detach().flatten() for p in [*t.agent.policy.parameters(), *t.agent.critic.parameters()]])

    a = Trainer(cfg, tmp_path / "a", progress=False)
    a.run(max_updates=24)
    b = Trainer(cfg, tmp_path / "b", progress=False)
    b.run(max_updates=12)  # saves at exit
    c = Trainer(cfg, tmp_path / "b", progress=False)
    c.load()
    c.run(max_updates=24)
    assert c.env_steps == a.env_steps
    assert torch.equal(params(a), params(c))
    assert a.bundle.envs[0].history == c.bundle.envs[0].history  # the environments resumed too
    # training time is counted across the resume, and time_budget_s judges the whole run
    assert c.seconds_before > b.seconds_before > 0.0
    e = Trainer(apply_overrides(cfg, {"time_budget_s": c.seconds_before / 2}), tmp_path / "b", progress=False)
    e.load()
    assert e.run(max_updates=48)["stop_reason"] == "time_budget_s" and e.agent.updates == 24
    # held-out evaluation during training reads the policy only: the run is unchanged bit for bit
    cfg_eval = apply_overrides(cfg, {"eval_every_updates": 8, "log_every_updates": 8, "eval_max_positions": 50})
    d = Trainer(cfg_eval, tmp_path / "d", progress=False)
    d.run(max_updates=24)
    assert len([r for r in d.history if "quality/heldout_top1" in r]) == 3
    assert torch.equal(params(a), params(d))
