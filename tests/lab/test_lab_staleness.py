"""The staleness study (lmpo.lab.staleness): its verdicts on synthetic results, its label checks, and a tiny
staleness lab end to end (async cells inside lab worker processes, reproducible by schedule)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time

import pytest
import yaml
from lab_helpers import smoke_config, without_timings

from lmpo.lab import lab_config_from_dict, run_lab
from lmpo.lab.claims import FAILS, HOLDS, INVALID, NOT_TESTABLE
from lmpo.lab.grid import validate_lab_config
from lmpo.lab.report import training_study
from lmpo.lab.staleness import staleness_study, table_markdown
from lmpo.trainer.config import ConfigError

TASK = "thinking_addition"
SEEDS = range(8)


def _summary(seed: int, accuracy: float, *, start: float = 0.4, low: float | None = None, **metrics) -> dict:
    """A cell's summary as lmpo.lab.jobs.summarise_run writes it, with the metrics the study reads."""
    m = {"accuracy": accuracy, "accuracy_start": start, "accuracy_gain": accuracy - start,
         "accuracy_min": start if low is None else low, "nonfinite_values": 0.0, **metrics}
    curve = [0.1, 0.2, 0.3]
    return {"metrics": m, "series": {"step": [1, 2, 3], "reward": curve, "entropy": curve, "clip_frac": curve,
                                     "length": curve}, "eval": {"step": [0, 3], "accuracy": [start, accuracy]}}


def _cell(shift: float, **kw) -> dict:
    # the baseline's accuracy varies by seed; a cell follows it, shifted, with a little paired noise
    return {s: _summary(s, 0.6 + 0.02 * (s % 4) + shift + 0.003 * ((-1) ** s), **kw) for s in SEEDS}


def _study(summaries: dict) -> dict:
    labels = list(summaries)
    cfg = lab_config_from_dict({"grid": {"objectives": [{"label": x, "preset": "grpo"} for x in labels],
                                         "seeds": list(SEEDS)}, "report": {"baseline": "k0_none"}})
    return staleness_study(training_study(cfg, summaries), {x: {} for x in labels}, cfg.report)


def test_verdicts_on_synthetic_results_cover_every_outcome():
    base = {s: _summary(s, 0.6 + 0.02 * (s % 4), mismatch_kl=1e-6) for s in SEEDS}  # RL gain 0.23: δ = 0.0575
    diverged = _cell(0.0, is_truncated_frac=0.05, mismatch_kl=0.02)
    diverged[3] = _summary(3, 0.66, low=0.2, is_truncated_frac=0.05, mismatch_kl=0.02)  # 0.2 below its start
    study = _study({
        "k0_none": base,
        "k1_tis": _cell(0.0, is_truncated_frac=0.02, mismatch_kl=0.01),     # equal accuracy: non-inferior
        "k2_tis": _cell(-0.15, is_truncated_frac=0.04, mismatch_kl=0.03),   # 0.15 worse: inferior beyond δ
        "k4_mis": _cell(0.0, is_masked_frac=0.0, mismatch_kl=0.05),         # the mask never acts
        "k4_tis": diverged,
        "k1_none": _cell(0.0, mismatch_kl=1e-5),                            # not stale enough to be off-policy
        "k2_none": _cell(0.0, mismatch_kl=0.03),
    })
    got = {v["objective"]: v["verdict"] for v in study["verdicts"]}
    assert got == {"k1_none": NOT_TESTABLE, "k1_tis": HOLDS, "k2_none": HOLDS, "k2_tis": FAILS,
                   "k4_mis": NOT_TESTABLE, "k4_tis": INVALID}
    # one Holm family of the testable cells' primary checks (three of them)
    holm = [v["checks"][0]["p_holm"] for v in study["verdicts"] if v["verdict"] in (HOLDS, FAILS)]
    assert len(holm) == 3 and all(p is not None for p in holm)
    reasons = {v["objective"]: v["reason"] for v in study["verdicts"]}
    assert "diverged" in reasons["k4_tis"] and "[3]" in reasons["k4_tis"]
    assert "is_masked_frac" in reasons["k4_mis"] or "masked" in reasons["k4_mis"]
    assert study["rows"][4]["tis"]["diverged_seeds"] == [3]
    assert study["rows"][2]["tis"]["diff"] == pytest.approx(-0.15, abs=1e-9)

    table = "\n".join(table_markdown(study))
    assert table.splitlines()[0] == "| k | none | tis | mis | seq_mask |"
    rows = {line.split("|")[1].strip(): line for line in table.splitlines()[2:]}
    assert set(rows) == {"0", "1", "2", "4"}
    assert "baseline" in rows["0"] and "no-op" in rows["0"]
    assert f"**{FAILS}**" in rows["2"] and f"**{INVALID}**" in rows["4"] and f"**{NOT_TESTABLE}**" in rows["4"]
    assert "KL 0.030" in rows["2"] and "is_truncated_frac 0.040" in rows["2"]


def test_a_grid_without_the_baseline_is_no_staleness_study():
    assert _study({"k1_tis": _cell(0.0), "grpo": _cell(0.0)}) is None


def _staleness_lab(lab_dir, model_dir, objectives, seeds=(0, 1), **sections) -> dict:
    train = {**smoke_config(lab_dir, model_dir)["train"], "sft": {"steps": 0}}
    return smoke_config(lab_dir, model_dir, grid={"objectives": objectives, "seeds": list(seeds)},
                        gradients={"enabled": False}, report={"baseline": "k0_none"},
                        lab={"sampled_eval_k": 0, "checkpoint_every_steps": 2, **sections.pop("lab", {})},
                        train=train, **sections)


K1_TIS = {"label": "k1_tis", "preset": "grpo", "overrides": {"correction": "tis", "is_max": 2.0},
          "train": {"rollout": {"async_staleness": 1}}}
K0 = {"label": "k0_none", "preset": "grpo", "train": {"rollout": {"record_logprobs": True}}}


def test_labels_must_say_what_the_cells_do(tmp_path, small_model_dir):
    wrong_k = {**K1_TIS, "train": {"rollout": {"async_staleness": 2}}}
    with pytest.raises(ConfigError, match=r"'k1_tis'.*async_staleness = 2"):
        validate_lab_config(lab_config_from_dict(_staleness_lab(tmp_path, small_model_dir, [K0, wrong_k])))
    wrong_correction = {**K1_TIS, "overrides": {"correction": "mis"}}
    with pytest.raises(ConfigError, match=r"'k1_tis'.*correction='mis'"):
        validate_lab_config(lab_config_from_dict(_staleness_lab(tmp_path, small_model_dir, [K0, wrong_correction])))


@pytest.mark.slow
def test_a_staleness_lab_runs_in_worker_processes_and_reproduces(tmp_path, small_model_dir):
    """k0_none and k1_tis (seed 0) in two lab worker processes at once (the k1 cell spawns its rollout worker):
    the report prints the staleness table; the same k1 cell run inline in a fresh lab gives the same numbers
    (the schedule, not the timing, decides), and so does one killed mid-cell and resumed; a re-run skips every
    job; a changed correction is refused."""
    cfg = lab_config_from_dict(_staleness_lab(tmp_path / "lab", small_model_dir, [K0, K1_TIS], seeds=(0,),
                                              lab={"jobs": 2}))
    result = run_lab(cfg)
    assert sorted(result.ran) == sorted(f"train/{TASK}/{x}/seed0" for x in ("k0_none", "k1_tis"))
    md = (tmp_path / "lab" / "lab.md").read_text()
    assert "### Staleness study (rule v2)" in md and "| k | none | tis | mis | seq_mask |" in md
    assert "registry's claims (docs/lab.md) are not run" in md
    stale = result.report["tasks"][TASK]["staleness"]
    assert [v["objective"] for v in stale["verdicts"]] == ["k1_tis"]
    summary = json.loads((tmp_path / "lab" / "cells" / TASK / "k1_tis" / "seed0" / "summary.json").read_text())
    assert summary["metrics"]["mismatch_kl"] > 0  # stale rollouts: the sampler is not the trained policy
    k0 = json.loads((tmp_path / "lab" / "cells" / TASK / "k0_none" / "seed0" / "summary.json").read_text())
    assert k0["metrics"]["mismatch_kl"] == 0.0  # on CPU the in-process sampler scores exactly as the trainer

    inline = run_lab(lab_config_from_dict(_staleness_lab(tmp_path / "inline", small_model_dir, [K1_TIS, K0],
                                                         seeds=(0,))), inline=True)
    again = json.loads((tmp_path / "inline" / "cells" / TASK / "k1_tis" / "seed0" / "summary.json").read_text())
    assert inline.ran and without_timings(again["metrics"]) == without_timings(summary["metrics"])

    # killed inside the stale cell (after its step-2 checkpoint, which holds the k earlier weight versions) and
    # run again: the resumed cell ends with the uninterrupted cell's numbers
    killed = tmp_path / "killed"
    path = tmp_path / "killed.yaml"
    path.write_text(yaml.safe_dump(_staleness_lab(killed, small_model_dir, [K1_TIS, K0], seeds=(0,))))
    cell = killed / "cells" / TASK / "k1_tis" / "seed0"
    proc = subprocess.Popen([sys.executable, "-m", "lmpo.cli", "lab", str(path), "--inline"],
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, start_new_session=True)
    deadline = time.monotonic() + 600
    try:
        while not (cell / "run" / "checkpoints" / "step_00000002").exists() and proc.poll() is None \
                and time.monotonic() < deadline:
            time.sleep(0.002)
    finally:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
    assert (cell / "run" / "checkpoints" / "step_00000002").exists(), "the cell wrote no step-2 checkpoint in 600 s"
    assert not (cell / "summary.json").exists(), "the lab finished the cell before it could be killed"
    resumed = run_lab(lab_config_from_dict(yaml.safe_load(path.read_text())), inline=True)
    assert f"train/{TASK}/k1_tis/seed0" in resumed.ran
    after = json.loads((cell / "summary.json").read_text())
    assert after["resumed_from_step"] >= 2
    assert without_timings(after["metrics"]) == without_timings(summary["metrics"])

    assert run_lab(cfg, inline=True).ran == []
    changed = _staleness_lab(tmp_path / "lab", small_model_dir, [K0, {**K1_TIS, "overrides": {"correction": "tis",
                                                                                            "is_max": 3.0}}],
                             seeds=(0,))
    with pytest.raises(ConfigError, match="different configuration"):
        run_lab(lab_config_from_dict(changed), inline=True)
