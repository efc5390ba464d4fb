"""The compute–performance fit (ScaleRL's sigmoid) against known curves, its refusals, and the coverage of its
intervals over seeds on simulated data."""

from __future__ import annotations

import math

import numpy as np
import pytest

from lmpo.lab.fits import (
    SigmoidFit,
    compare_fits,
    compute_curve,
    fit_over_seeds,
    fit_sigmoid,
    fit_study,
    sigmoid,
)

COMPUTE = np.linspace(0, 100, 21)


def test_sigmoid_by_hand():
    # C = C_mid: half the gain; C → 0: R0; C = 2·C_mid with B = 1: R0 + (A − R0)·2/3
    assert sigmoid([0.0, 30.0, 60.0], 0.3, 0.9, 1.0, 30.0) == pytest.approx([0.3, 0.6, 0.3 + 0.6 * 2 / 3])


@pytest.mark.parametrize(("a", "b", "c_mid"), [(0.8, 1.5, 30.0), (0.55, 0.7, 12.0), (0.95, 4.0, 50.0)])
def test_fit_recovers_known_parameters(a, b, c_mid):
    fit = fit_sigmoid(COMPUTE, sigmoid(COMPUTE, 0.3, a, b, c_mid))
    assert fit.converged, fit.reason
    assert (fit.a, fit.b, fit.c_mid) == pytest.approx((a, b, c_mid), rel=1e-3)
    assert fit.r0 == 0.3 and fit.num_points == 20


def test_fit_recovers_parameters_under_noise():
    rng = np.random.default_rng(0)
    fit = fit_sigmoid(COMPUTE, sigmoid(COMPUTE, 0.3, 0.8, 1.5, 30.0) + rng.normal(0, 0.005, COMPUTE.size))
    assert fit.converged
    assert fit.a == pytest.approx(0.8, abs=0.02) and fit.b == pytest.approx(1.5, rel=0.2)


def test_a_curve_that_never_passes_its_midpoint_is_unbounded_not_a_number():
    early = COMPUTE[:6]
    fit = fit_sigmoid(early, sigmoid(early, 0.3, 0.8, 1.5, 300.0))
    assert fit.status == "unbounded" and "C_mid" in fit.reason
    assert math.isnan(fit.a) and math.isnan(fit.b)


def test_a_flat_curve_is_not_fitted():
    fit = fit_sigmoid(COMPUTE, np.full(COMPUTE.size, 0.3))
    assert not fit.converged and math.isnan(fit.a)


@pytest.mark.parametrize(("compute", "score", "reason"), [
    ([1.0, 2.0, 3.0], [0.1, 0.2, 0.3], "compute 0"),
    ([0.0, 1.0, 2.0], [0.1, 0.2, 0.3], "at least 3"),
    ([0.0, 1.0, 2.0, 3.0], [0.1, 0.2, math.nan, 0.3], "non-finite"),
])
def test_fit_refuses_what_it_cannot_fit(compute, score, reason):
    fit = fit_sigmoid(compute, score)
    assert fit.status == "failed" and reason in fit.reason


def test_fit_needs_one_score_per_compute():
    with pytest.raises(ValueError, match="one score per compute"):
        fit_sigmoid([0.0, 1.0], [0.1])


def _simulated_seeds(rng, n_seeds, a=0.8, b=1.5, c_mid=30.0, sd_a=0.03, sd_b=0.15, noise=0.01):
    return {s: (COMPUTE, sigmoid(COMPUTE, 0.3, a + rng.normal(0, sd_a), b + rng.normal(0, sd_b), c_mid)
                + rng.normal(0, noise, COMPUTE.size)) for s in range(n_seeds)}


@pytest.mark.slow
def test_intervals_over_seeds_cover_at_their_nominal_rate():
    """Each simulated lab: 8 seeds whose true A and B vary around (0.8, 1.5), with evaluation noise. Over 120
    labs the 95% t intervals must cover the true mean on 88–100% of them (the 99.9% binomial band around 0.95;
    an interval that ignored the seeds' spread, or a z interval at 4 seeds, falls below it)."""
    rng = np.random.default_rng(0)
    labs = 120
    covered = {"a": 0, "b": 0}
    for _ in range(labs):
        summary = fit_over_seeds(_simulated_seeds(rng, 8))
        for name, truth in (("a", 0.8), ("b", 1.5)):
            lo, hi = summary[name]["ci"]
            covered[name] += lo <= truth <= hi
    assert 0.88 <= covered["a"] / labs <= 1.0, covered
    assert 0.88 <= covered["b"] / labs <= 1.0, covered


def test_an_unbounded_seed_leaves_no_interval_and_says_which():
    rng = np.random.default_rng(1)
    curves = _simulated_seeds(rng, 4)
    curves[2] = (COMPUTE, np.full(COMPUTE.size, 0.3))  # this seed learned nothing
    summary = fit_over_seeds(curves)
    assert summary["a"]["ci"] is None and summary["a"]["mean"] is None
    assert "1 of 4 seeds" in summary["a"]["reason"] and "seed 2" in summary["a"]["reason"]


def test_compare_fits_gives_the_paired_difference():
    rng = np.random.default_rng(2)
    base = {s: fit_sigmoid(COMPUTE, sigmoid(COMPUTE, 0.3, 0.7 + rng.normal(0, 0.01), 1.5, 30.0)) for s in range(6)}
    # the same seeds with the ceiling raised by exactly 0.1 and the efficiency unchanged
    higher = {s: fit_sigmoid(COMPUTE, sigmoid(COMPUTE, 0.3, f.a + 0.1, f.b, f.c_mid)) for s, f in base.items()}
    diff = compare_fits(higher, base)
    assert diff["a"]["mean"] == pytest.approx(0.1, abs=1e-3)
    assert diff["a"]["ci"][0] < 0.1 < diff["a"]["ci"][1] or diff["a"]["ci"] == pytest.approx([0.1, 0.1], abs=1e-3)
    assert diff["b"]["mean"] == pytest.approx(0.0, abs=1e-2)
    failed = {**base, 0: SigmoidFit("unbounded", 0.3, reason="x")}
    assert compare_fits(higher, failed)["a"]["ci"] is None


def test_compute_curve_sums_completion_tokens_to_each_evaluation():
    summary = {"series": {"step": [1, 2, 3, 4], "length": [10.0, 20.0, math.nan, 40.0]},
               "eval": {"step": [0, 2, 4], "accuracy": [0.1, 0.2, 0.3]}}
    # 0 at the start; 10 + 20 by step 2; a non-finite step counts 0: 10 + 20 + 0 + 40 by step 4
    assert compute_curve(summary) == ([0.0, 30.0, 70.0], [0.1, 0.2, 0.3])


def test_fit_study_fits_every_objective_and_compares_with_the_baseline():
    rng = np.random.default_rng(3)
    steps = list(range(1, 101))

    def summary(a):
        acc = sigmoid(COMPUTE * 10, 0.3, a + rng.normal(0, 0.01), 1.5, 300.0)
        return {"series": {"step": steps, "length": [10.0] * 100},
                "eval": {"step": [int(c) for c in COMPUTE], "accuracy": list(acc)}}

    study = fit_study({"grpo": {s: summary(0.7) for s in range(4)}, "cispo": {s: summary(0.8) for s in range(4)}},
                      ["grpo"])
    assert study["objectives"]["grpo"]["a"]["mean"] == pytest.approx(0.7, abs=0.02)
    assert study["comparisons"]["cispo"]["grpo"]["a"]["mean"] == pytest.approx(0.1, abs=0.02)
    assert "grpo" not in study["comparisons"]
