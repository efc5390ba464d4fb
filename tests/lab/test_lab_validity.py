"""What a cell contributes to the gates: endpoints, activity measures, divergence; and the calibration rules."""

from __future__ import annotations

import json
import math

import pytest

from lmpo.lab.calibrate import suggest
from lmpo.lab.jobs import summarise_run
from lmpo.lab.report import run_validity


def _write(run_dir, evals, *, coef=None, expanded=None, acting=None, steps=10):
    rows = []
    for s in range(1, steps + 1):
        row = {"kind": "train", "step": s, "reward/mean": 0.1 * s, "entropy/mean": 0.2 - 0.01 * s,
               "tokens/valid": 100.0, "perf/step_s": 1.0}
        if coef is not None:
            row["entropy/coef"] = coef[s - 1]
        if expanded is not None:
            row["rlvcr/expanded_samples"], row["rlvcr/batch_seqs"] = expanded[s - 1]
        if acting is not None:
            row["rlvcr/acting_rows"], row["rlvcr/trained_rows"] = acting[s - 1]
        rows.append(row)
    for step, acc in evals:
        rows.append({"kind": "eval", "step": step, "eval/accuracy": acc, "eval/length_mean": 20.0 + step})
    run_dir.mkdir(parents=True, exist_ok=True)
    (run_dir / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    return summarise_run(run_dir)


def test_endpoint_is_the_mean_of_the_last_three_evaluations(tmp_path):
    s = _write(tmp_path / "a", [(0, 0.40), (2, 0.45), (4, 0.50), (6, 0.60), (8, 0.55), (10, 0.65)])
    m = s["metrics"]
    assert m["accuracy"] == pytest.approx((0.60 + 0.55 + 0.65) / 3)
    assert m["accuracy_last"] == 0.65 and m["accuracy_start"] == 0.40
    assert m["accuracy_gain"] == pytest.approx(0.2)
    assert m["accuracy_min"] == 0.45 and m["endpoint_evals"] == 3
    assert m["eval_length"] == pytest.approx(20 + (6 + 8 + 10) / 3)
    # reward windows of a tenth of 10 steps = 1 step: 0.1 → 1.0
    assert (m["reward_start"], m["reward_end"], m["reward_gain"]) == pytest.approx((0.1, 1.0, 0.9))


def test_activity_measures_of_the_training_cells(tmp_path):
    coef = [0.0] * 6 + [0.005, 0.01, 0.0, 0.005]           # 3 of 10 steps with a bonus
    expanded = [(0, 64)] * 5 + [(36, 100)] * 5            # 180 of 820 trained rows are expansions
    acting = [(0, 64)] * 5 + [(10, 80)] * 5               # 50 of 720 rows that train a token carry A_think
    m = _write(tmp_path / "b", [(0, 0.4), (10, 0.5)], coef=coef, expanded=expanded, acting=acting)["metrics"]
    assert m["entropy_coef_active"] == pytest.approx(0.3)
    assert m["rlvcr_expanded_frac"] == pytest.approx(180 / 820)
    assert m["rlvcr_acting_frac"] == pytest.approx(50 / 720)
    plain = _write(tmp_path / "c", [(0, 0.4), (10, 0.5)])["metrics"]
    assert plain["entropy_coef_active"] == 0.0 and plain["rlvcr_expanded_frac"] == 0.0
    assert plain["rlvcr_acting_frac"] == 0.0
    assert math.isnan(plain["ptrw_phi_gap"])


def test_run_validity_flags_divergence_and_non_finite_values(tmp_path):
    good = _write(tmp_path / "g", [(0, 0.40), (5, 0.35), (10, 0.42)])       # 0.05 below: within the margin
    bad = _write(tmp_path / "d", [(0, 0.40), (5, 0.20), (10, 0.01)])        # the RLVCR collapse
    skipped = dict(good, nonfinite_skipped=2)
    v = run_validity({0: good, 1: bad, 2: skipped}, 0.1)
    assert v == {"margin": 0.1, "diverged_seeds": [1], "nonfinite_seeds": [2]}


def test_calibration_rules_by_hand():
    starts = [{"seq_ratio_sd": 0.014, "length_mean": 30.0, "tokens_per_minibatch": 480.0,
               "clip_cov_band_share": 0.008, "cov_quantiles": {"0.9": 0.1, "0.98": 0.30}},
              {"seq_ratio_sd": 0.016, "length_mean": 28.0, "tokens_per_minibatch": 520.0,
               "clip_cov_band_share": 0.008, "cov_quantiles": {"0.9": 0.12, "0.98": 0.34}}]
    cells = [{"metrics": {"entropy_start": 0.10}}, {"metrics": {"entropy_start": 0.12}}]
    p = suggest(starts, cells, target_tokens=10)
    assert p["ptrw_sigma"]["value"] == pytest.approx(2 * 0.015)          # 2 × mean spread
    assert p["decay_gamma"]["value"] == pytest.approx(1 - 1 / 29)         # horizon of one completion
    assert p["entropy_target"]["value"] == pytest.approx(0.11)            # the baseline's starting entropy
    assert p["clip_cov_ratio"]["value"] == pytest.approx(10 / 500)        # 10 tokens per 500-token minibatch
    assert p["kl_cov_frac"]["value"] == pytest.approx(0.02)
    assert "0.015" in p["ptrw_sigma"]["from"]
    # 0.8% of 500 tokens = 4 per minibatch in the band (1, 5): fewer than 10 → the band starts at the quantile
    # nearest 1 − 10/500 = 0.98
    assert p["clip_cov_lb"]["value"] == pytest.approx(0.32)
    small = [dict(m, tokens_per_minibatch=100.0) for m in starts]   # 1 − 10/100 = 0.9
    assert suggest(small, cells, target_tokens=10)["clip_cov_lb"]["value"] == pytest.approx(0.11)
    wide = [dict(m, clip_cov_band_share=0.05) for m in starts]
    assert "clip_cov_lb" not in suggest(wide, cells, target_tokens=10)
