"""Verdict rule v2.1 (``lmpo.lab.rules``) on hand-made, lab.json-like studies with hand-computed numbers, and the
rule switch: the published v2 labs rebuild to their published verdicts under rule v2."""

from __future__ import annotations

import json
import math
import shutil
from pathlib import Path
from types import SimpleNamespace

import pytest

from lmpo.lab import stats as st
from lmpo.lab.claims import (
    CLAIMS,
    CLAIMS_V2_1,
    FAILS,
    HOLDS,
    INCONCLUSIVE,
    INVALID,
    MATCHED_ABLATIONS,
    NO_EFFECT,
    NOT_RUN,
    NOT_TESTABLE,
    RECIPE_ARMS,
    REFUSED,
    Check,
    Sesoi,
    baseline_value,
    judge,
)
from lmpo.lab.report import add_reward_steps, rejudge
from lmpo.lab.rules import (
    UNDECIDABLE,
    claims_for,
    cluster_comparison,
    delta_bounds,
    fisher_exact,
    fit_comparison,
    judge_all_v21,
    judge_part,
    ni_power,
    tost_power,
)
from lmpo.objectives import Objective

ROOT = Path(__file__).resolve().parents[2]
REPORT = SimpleNamespace(alpha=0.05, confidence=0.95, power=0.8)
SEEDS = 8


def _comp(diffs):
    return st.paired_comparison(list(diffs), [0.0] * len(diffs))


def _metric(values):
    return st.describe(list(values))


# ----------------------------------------------------------------------------------------------------
# The statistics, by hand
# ----------------------------------------------------------------------------------------------------


def test_fisher_exact_by_hand():
    # margins 3 of 19 diverged: P(all 3 in the 3-seed arm) = 1 / C(19, 3) = 1/969, the only table as extreme
    assert fisher_exact(3, 3, 0, 16) == pytest.approx(1 / 969)
    # 3 of 3 against 0 of 3: 1/20 for each extreme table, two-sided 0.1 (not below α = 0.05)
    assert fisher_exact(3, 3, 0, 3) == pytest.approx(0.1)
    assert fisher_exact(0, 3, 0, 3) == pytest.approx(1.0)


def _gradients(values: dict[str, list[tuple[int, float]]], metric="snr", activity=None):
    """A gradient study as lab.json stores it: per group (reference run, value) of each label."""
    n = len(next(iter(values.values())))
    snapshots = [{"step": 0, "reference_seed": values[next(iter(values))][g][0], "objectives": {
        label: {metric: {"mean": rows[g][1]}, "grad_norm": {"mean": 1.0}} for label, rows in values.items()}}
        for g in range(n)]
    return {"snapshots": snapshots, "activity": activity or {}}


def test_cluster_comparison_has_the_run_as_the_replicate():
    # run 0: d = 0.1, 0.3 → 0.2; run 1: 0.4, 0.4 → 0.4; run 2: 0.0, 0.2 → 0.1: mean 0.2333, sd 0.15275,
    # se 0.088192, t_{0.975, 2} = 4.3027 → [−0.146, 0.613]
    a = [(0, 1.1), (0, 1.3), (1, 1.4), (1, 1.4), (2, 1.0), (2, 1.2)]
    b = [(r, 1.0) for r, _ in a]
    comp = cluster_comparison(_gradients({"x": a, "y": b}), "x", "y", "snr")
    assert comp["diff"] == pytest.approx(0.233333, abs=1e-6) and comp["se"] == pytest.approx(0.088192, abs=1e-6)
    assert comp["df"] == 2 and comp["runs"] == 3 and comp["groups"] == 6
    assert comp["ci"] == pytest.approx([0.233333 - 4.302653 * 0.088192, 0.233333 + 4.302653 * 0.088192], abs=1e-5)
    # pooled over the six groups as if each were a replicate, the interval would exclude 0 (df 5): the run does not
    pooled = st.paired_comparison([v for _, v in a], [v for _, v in b])
    assert pooled["ci"][0] > 0 and comp["ci"][0] < 0


def test_an_undefined_group_is_not_left_out():
    # no outcome-dependent selection: one undefined group leaves the comparison undefined, not a 5-group mean
    a = [(0, 1.1), (0, None), (1, 1.4), (1, 1.4), (2, 1.0), (2, 1.2)]
    b = [(r, 1.0) for r, _ in a]
    comp = cluster_comparison(_gradients({"x": a, "y": b}), "x", "y", "snr")
    assert comp["groups_undefined"] == 1 and math.isnan(comp["diff"])
    assert judge_part(Check("gradients", "snr", "greater", Sesoi(0.25, "snr")), comp, alpha=0.05, delta_lo=0.1,
                      delta_hi=0.1, p=comp["p"]) == INCONCLUSIVE


def test_delta_carries_its_interval_and_is_never_nan():
    assert delta_bounds(0.25, 0.1, [0.06, 0.14]) == pytest.approx((0.025, 0.015, 0.035))
    assert delta_bounds(0.25, 0.1, [-0.02, 0.22]) == pytest.approx((0.025, 0.0, 0.055))  # 0 inside: δ_lo = 0
    assert delta_bounds(0.25, -0.1, [math.nan, math.nan]) == pytest.approx((0.025, 0.025, 0.025))
    # v2 as published: an undefined snapshot (null in lab.json) makes δ undefined; v2.1 leaves it out
    grads = _gradients({"amic": [(0, 0.5), (0, None), (1, 0.7), (1, 0.3)]}, metric="cos_onpolicy")
    assert math.isnan(baseline_value({"gradients": grads}, "gradients", "amic", "cos_onpolicy"))
    from lmpo.lab.rules import baseline_interval

    mean, ci, dropped = baseline_interval({"gradients": grads}, "gradients", "amic", "cos_onpolicy")
    assert mean == pytest.approx(0.5) and dropped == 1  # runs: 0.5 and (0.7 + 0.3)/2


def test_uncertain_delta_never_makes_a_verdict_easier():
    check = Check("training", "reward_auc", "greater", Sesoi(0.25, "reward_gain"))
    tiny = _comp([0.01, -0.01, 0.02, 0.00, -0.02])   # 90% interval ±0.01508
    assert judge_part(check, tiny, alpha=0.05, delta_lo=0.05, delta_hi=0.05, p=tiny["p"]) == NO_EFFECT
    # the same interval with δ's lower end at 0.012 no longer shows equivalence
    assert judge_part(check, tiny, alpha=0.05, delta_lo=0.012, delta_hi=0.05, p=tiny["p"]) == INCONCLUSIVE
    ni = Check("training", "accuracy", "not_worse", Sesoi(0.25, "accuracy_gain"))
    worse = _comp([-0.030, -0.031, -0.029, -0.030, -0.032])   # hi₂ ≈ −0.0291
    assert judge_part(ni, worse, alpha=0.05, delta_lo=0.02, delta_hi=0.025, p=1.0) == FAILS
    assert judge_part(ni, worse, alpha=0.05, delta_lo=0.02, delta_hi=0.035, p=1.0) == INCONCLUSIVE


def test_non_inferiority_power_by_hand():
    # at df = 10⁴ the t is normal: δ/se = z_{0.95} + z_{0.8} = 1.6449 + 0.8416 gives power 0.8
    assert ni_power(1.0, 10_000, 1.6449 + 0.8416, 0.05) == pytest.approx(0.8, abs=2e-3)
    assert ni_power(1.0, 10_000, 1.6449, 0.05) == pytest.approx(0.5, abs=2e-3)
    # 5 seeds (df 4), se 0.01, δ 0.008: P(T₄ ≥ 2.1318 − 0.8) = P(T₄ ≥ 1.3318) ≈ 0.127
    assert ni_power(0.01, 4, 0.008, 0.05) == pytest.approx(st.student_t_sf(2.131847 - 0.8, 4), abs=1e-6)
    assert ni_power(0.01, 4, 0.008, 0.05) == pytest.approx(0.127, abs=2e-3)


def test_reward_steps_by_hand():
    # reference: reward 0 → 1 over 10 steps (start 0.0, gain 1.0 in windows of 1 step) → threshold 0.5
    ramp = [i / 9 for i in range(10)]
    cells = {"ref": {0: {"metrics": {"reward_start": 0.0, "reward_gain": 1.0},
                         "series": {"step": list(range(1, 11)), "reward": ramp}}},
             "fast": {0: {"metrics": {}, "series": {"step": list(range(1, 11)), "reward": [min(1, 2 * r) for r in ramp]}}},
             "never": {0: {"metrics": {}, "series": {"step": list(range(1, 11)), "reward": [0.1] * 10}}}}
    assert add_reward_steps(cells, "ref") == pytest.approx(0.5)
    # ramp reaches 0.5 at i = 5 (5/9 = 0.556) → step 6; twice as fast at i = 3 (0.667) → step 4; never: 11
    assert [cells[k][0]["metrics"]["reward_steps"] for k in ("ref", "fast", "never")] == [6.0, 4.0, 11.0]


# ----------------------------------------------------------------------------------------------------
# Whole claims under v2.1
# ----------------------------------------------------------------------------------------------------


def _training(obj, base, *, comps, base_metrics=None, obj_metrics=None, validity=None, seeds=None):
    base_metrics = {"accuracy_gain": [0.08] * SEEDS, "entropy_change": [-0.04] * SEEDS,
                    "entropy_start": [0.12] * SEEDS, **(base_metrics or {})}
    obj_metrics = {"clip_high_frac": [0.03] * SEEDS, "mask_frac": [0.02] * SEEDS,
                   "rlvcr_acting_frac": [0.5] * SEEDS, **(obj_metrics or {})}
    seeds = seeds or {}
    return {"metrics": {base: {"seeds": seeds.get(base, list(range(SEEDS))),
                               **{k: _metric(v) for k, v in base_metrics.items()}},
                        obj: {"seeds": seeds.get(obj, list(range(SEEDS))),
                              **{k: _metric(v) for k, v in obj_metrics.items()}}},
            "comparisons": {obj: {base: comps}},
            "one_sample": {base: {"entropy_change": _comp([-0.04, -0.05, -0.03, -0.045, -0.035]),
                                  "avg_at_k_gain": _comp([0.05, 0.06, 0.04, 0.07, 0.05]),
                                  "pass_at_k_gain": _comp([0.01, -0.02, 0.0, -0.01, 0.02])}},
            "validity": validity or {}}


ENTROPY_UP = _comp([0.020, 0.025, 0.018, 0.022, 0.021])      # δ = 25% of 0.04 = 0.01
KEEPS = _comp([0.0, 0.005, -0.005, 0.002, -0.002])           # δ = 0.02: shown
NOISY_ACC = _comp([0.03, -0.04, 0.02, -0.03, 0.01])          # se 0.0137 at 5 seeds: power at δ 0.02 ≈ 0.37
WORSE = _comp([-0.20, -0.21, -0.19, -0.20, -0.22])


def _dapo(acc, **kw):
    training = _training("dapo", "grpo_tm", comps={"entropy_end": ENTROPY_UP, "accuracy": acc,
                                                   "pass_at_k": _comp([0.0] * 5)}, **kw)
    return {"training": training, "gradients": None, "objectives": {"dapo": {}, "grpo_tm": {}}}


def test_two_part_claim_holds_only_when_both_parts_hold():
    claim = CLAIMS_V2_1["dapo_entropy"]
    assert claim.baseline == "grpo_tm" and [c.metric for c in claim.voting] == ["entropy_end", "accuracy"]
    v = judge_all_v21([claim], _dapo(KEEPS), REPORT)[0]
    assert v.verdict == HOLDS, v.reason
    assert [c["p_holm"] for c in v.checks[:2]] == pytest.approx(st.holm([c["p_test"] for c in v.checks[:2]]))
    v = judge_all_v21([claim], _dapo(WORSE), REPORT)[0]
    assert v.verdict == FAILS and "keeps held-out accuracy: does not hold" in v.reason
    # rule v2 calls the same runs "holds": the accuracy check did not vote
    v2 = judge(CLAIMS["dapo_entropy"], {**_dapo(WORSE), "training": {
        **_dapo(WORSE)["training"], "comparisons": {"dapo": {"grpo": _dapo(WORSE)["training"]["comparisons"]["dapo"][
            "grpo_tm"]}}, "metrics": {"grpo": _dapo(WORSE)["training"]["metrics"]["grpo_tm"],
                                      "dapo": _dapo(WORSE)["training"]["metrics"]["dapo"]},
        "one_sample": {"grpo": _dapo(WORSE)["training"]["one_sample"]["grpo_tm"]}}}, REPORT)
    assert v2.verdict == HOLDS


def test_an_underpowered_non_inferiority_part_cannot_be_decided():
    v = judge_all_v21([CLAIMS_V2_1["dapo_entropy"]], _dapo(NOISY_ACC), REPORT)[0]
    acc = v.checks[1]
    assert acc["metric"] == "accuracy" and acc["power"] < 0.8 and acc["verdict"] == INCONCLUSIVE
    assert v.verdict == UNDECIDABLE and "power" in v.reason


def test_divergence_gate_is_scoped_to_the_runs_a_claim_uses():
    # EMA's claim is about gradients measured on GRPO's reference runs: EMA's own training runs do not enter it
    grads = _gradients({"ema": [(r, 1.2 + 0.01 * g) for g, r in enumerate([0, 0, 1, 1, 2, 2])],
                        "grpo": [(r, 1.0) for r in [0, 0, 1, 1, 2, 2]]}, activity={"ema": {"grpo": {"mean": 0.6}}})
    for snap in grads["snapshots"]:
        for row in snap["objectives"].values():
            row["weight_var"] = {"mean": 0.01}
    validity = {"ema": {"margin": 0.1, "diverged_seeds": [1], "nonfinite_seeds": []}}
    results = {"training": {"metrics": {}, "comparisons": {}, "validity": validity}, "gradients": grads,
               "objectives": {}}
    v21 = judge_all_v21([CLAIMS_V2_1["ema_gradient_noise"]], results, REPORT)[0]
    assert v21.verdict == HOLDS, v21.reason
    assert v21.checks[0]["runs"] == 3 and v21.checks[0]["delta"] == pytest.approx(0.25)
    grads["comparisons"] = {"ema": {"grpo": {"snr": _comp([0.2] * 3), "weight_var": _comp([0.0] * 3)}}}
    assert judge(CLAIMS["ema_gradient_noise"], results, REPORT).verdict == INVALID  # rule v2: any divergence


def test_divergence_is_the_outcome_of_a_robustness_claim():
    claim = CLAIMS_V2_1["ptrw_robust"]
    assert claim.robustness
    validity = {"ptrw": {"margin": 0.1, "diverged_seeds": [0, 1, 2], "nonfinite_seeds": []},
                "amic": {"margin": 0.1, "diverged_seeds": [], "nonfinite_seeds": []}}
    training = _training("ptrw", "amic", comps={"accuracy": WORSE}, validity=validity,
                         seeds={"ptrw": [0, 1, 2], "amic": list(range(16))})
    grads = _gradients({"ptrw": [(0, 0.1), (1, 0.2), (2, 0.1)], "amic": [(0, 0.5), (1, 0.4), (2, 0.6)]},
                       metric="cos_onpolicy", activity={"ptrw": {"amic": {"mean": 0.4}}})
    results = {"training": training, "gradients": grads, "objectives": {}}
    v = judge_all_v21([claim], results, REPORT)[0]
    assert v.verdict == FAILS
    div = v.checks[0]
    assert div["metric"] == "diverged" and div["diverged"] == {"ptrw": [3, 3], "amic": [0, 16]}
    assert div["p_test"] == pytest.approx(1 / 969) and div["p_holm"] == pytest.approx(1 / 969)
    assert not v.checks[1]["votes"]  # the gradient check is shown beside it
    # with three baseline seeds the same divergence is not yet significant (Fisher p = 0.1)
    training["metrics"]["amic"]["seeds"] = [0, 1, 2]
    assert judge_all_v21([claim], results, REPORT)[0].verdict == INCONCLUSIVE
    assert judge(CLAIMS["ptrw_robust"], results, REPORT).verdict == INVALID  # rule v2: an invalid run


def test_activity_is_measured_against_the_matched_ablation():
    claim = CLAIMS_V2_1["cispo_faster"]
    steps = _comp([-10.0, -12.0, -9.0, -11.0, -10.0])
    training = _training("cispo", "grpo_tm", comps={"reward_steps": steps, "accuracy": KEEPS},
                         base_metrics={"reward_steps": [40.0, 42.0, 38.0, 41.0, 39.0, 40.0, 40.0, 40.0]})
    # against GRPO (another aggregation) the weights differ on 61% of tokens; against its matched ablation on 0.4%
    activity = {"cispo": {"grpo": {"mean": 0.61}}}
    results = {"training": training, "gradients": {"snapshots": [], "activity": activity}, "objectives": {}}
    v = judge_all_v21([claim], results, REPORT)[0]
    assert v.verdict == NOT_RUN and "matched ablation `grpo_tm`" in v.reason
    activity["cispo"]["grpo_tm"] = {"mean": 0.004}
    v = judge_all_v21([claim], results, REPORT)[0]
    assert v.verdict == NOT_TESTABLE and "0.004" in v.reason
    activity["cispo"]["grpo_tm"] = {"mean": 0.3}
    v = judge_all_v21([claim], results, REPORT)[0]
    assert v.verdict == HOLDS, v.reason
    assert v.checks[0]["metric"] == "reward_steps" and v.checks[0]["delta"] == pytest.approx(10.0)


def test_an_endpoint_the_task_fixes_is_not_testable():
    claim = CLAIMS_V2_1["rlvcr_shorter"]
    fixed = [29.70, 29.72, 29.68, 29.71, 29.69, 29.70, 29.71, 29.69]   # sd 0.013, δ = 10% of 29.7 = 2.97
    training = _training("rlvcr", "grpo", comps={"eval_length": _comp([0.01, -0.02, 0.0, 0.01, -0.01]),
                                                 "accuracy": KEEPS}, base_metrics={"eval_length": fixed})
    v = judge_all_v21([claim], {"training": training, "gradients": None, "objectives": {}}, REPORT)[0]
    assert v.verdict == NOT_TESTABLE and "does not move" in v.reason
    training["metrics"]["grpo"]["eval_length"] = _metric([20.0, 35.0, 28.0, 31.0, 25.0, 33.0, 29.0, 27.0])
    v = judge_all_v21([claim], {"training": training, "gradients": None, "objectives": {}}, REPORT)[0]
    assert v.verdict == NO_EFFECT, v.reason  # a movable endpoint, unmoved by RLVCR: equivalence


def test_a_missing_part_is_not_run_unless_a_measured_part_decides():
    claim = CLAIMS_V2_1["amic_gradient_noise"]
    runs = [0, 0, 1, 1, 2, 2]
    grads = _gradients({"amic": [(r, 1.01 + 0.001 * g) for g, r in enumerate(runs)], "gspo": [(r, 1.0) for r in runs]},
                       activity={"amic": {"gspo": {"mean": 0.4}}})
    for snap in grads["snapshots"]:
        for row in snap["objectives"].values():
            row["weight_var"] = {"mean": 0.01}
    v = judge_all_v21([claim], {"training": None, "gradients": grads, "objectives": {}}, REPORT)[0]
    assert v.verdict == NO_EFFECT, v.reason   # +0.0035 ± 0.005 within δ = 0.25: decided without the unclipped pair
    assert v.checks[1]["verdict"] == NOT_RUN and "amic_noclip" in v.checks[1]["not_run"]
    for snap in grads["snapshots"]:
        snap["objectives"]["amic"]["snr"]["mean"] += 0.5
    v = judge_all_v21([claim], {"training": None, "gradients": grads, "objectives": {}}, REPORT)[0]
    assert v.verdict == NOT_RUN and "the unclipped pair" in v.reason


def test_matched_ablations_share_the_objectives_aggregation_and_clip():
    def build(label):  # the CPU lab's `rlvcr` arm is GRPO with RLVCR's trainer section
        entry = MATCHED_ABLATIONS.get(label) or RECIPE_ARMS.get(label) or {
            "preset": "grpo" if label == "rlvcr" else label, "overrides": {}}
        return Objective.preset(entry["preset"], **entry["overrides"])

    for claim in CLAIMS_V2_1.values():
        for check in claim.voting:
            obj, base = build(check.objective or claim.objective), build(check.baseline or claim.baseline)
            assert obj.aggregation == base.aggregation, (claim.name, check.metric)
    for name in ("amic_gradient_noise", "gmpo_stable"):  # the clip is matched too, not only the aggregation
        claim = CLAIMS_V2_1[name]
        for check in claim.voting:
            obj, base = build(check.objective or claim.objective), build(check.baseline or claim.baseline)
            assert (obj.trust_region == "none") == (base.trust_region == "none"), name
    assert CLAIMS_V2_1["amic_gradient_noise"].baseline == "gspo"
    assert CLAIMS_V2_1["gmpo_stable"].baseline == "grpo_noclip"
    assert CLAIMS_V2_1["cispo_faster"].baseline == "grpo_tm"
    for claim in CLAIMS_V2_1.values():  # δ is declared in the metric compared (or its change over the run)
        for check in claim.checks:
            assert check.sesoi.of in (check.metric, f"{check.metric}_gain", "entropy_change", "accuracy_gain") or (
                check.metric == "entropy_end" and check.sesoi.of == "entropy_change"), (claim.name, check.metric)


# ----------------------------------------------------------------------------------------------------
# Claims on the compute–performance fit (ScaleRL's recipe)
# ----------------------------------------------------------------------------------------------------


def _fits(per_label: dict[str, list[tuple[float, float]]], r0=0.3, unfit=()):
    """A training study whose fits hold (A, B) per seed of each label (R0 = ``r0``)."""
    objectives = {label: {"fits": {str(s): {"status": "unbounded" if (label, s) in unfit else "converged", "r0": r0,
                                            "a": a, "b": b} for s, (a, b) in enumerate(rows)}}
                  for label, rows in per_label.items()}
    metrics = {label: {"seeds": list(range(len(rows))), "zero_var_frac": _metric([0.3] * len(rows))}
               for label, rows in per_label.items()}
    return {"training": {"metrics": metrics, "comparisons": {}, "validity": {}, "fits": {"objectives": objectives}},
            "gradients": None, "objectives": {}}


def test_fit_comparison_by_hand_and_without_unfit_seeds():
    # A: 0.80, 0.82, 0.78 against 0.70, 0.71, 0.69 → d = 0.10, 0.11, 0.09: mean 0.10, sd 0.01, se 0.005774, df 2
    results = _fits({"x": [(0.80, 1.0), (0.82, 1.0), (0.78, 1.0)], "y": [(0.70, 1.0), (0.71, 1.0), (0.69, 1.0)]})
    comp = fit_comparison(results, "x", "y", "a")
    assert comp["diff"] == pytest.approx(0.10) and comp["se"] == pytest.approx(0.005774, abs=1e-6)
    assert comp["df"] == 2 and comp["seeds"] == 3 and comp["seeds_unfit"] == 0
    results = _fits({"x": [(0.80, 1.0), (0.82, 1.0), (0.78, 1.0)], "y": [(0.70, 1.0), (0.71, 1.0), (0.69, 1.0)]},
                    unfit={("y", 1)})
    comp = fit_comparison(results, "x", "y", "a")
    assert comp["seeds_unfit"] == 1 and math.isnan(comp["diff"])  # not a two-seed mean of the seeds that fitted


def test_equivalence_part_and_its_power_by_hand():
    eq = Check("fits", "a", "equivalent", Sesoi(0.25, "a_gain"))
    tiny = _comp([0.01, -0.01, 0.02, 0.00, -0.02])   # 90% interval ±0.01508; TOST p at δ 0.05 ≈ 0.001
    assert judge_part(eq, tiny, alpha=0.05, delta_lo=0.05, delta_hi=0.05, p=0.001) == HOLDS
    assert judge_part(eq, tiny, alpha=0.05, delta_lo=0.01, delta_hi=0.01, p=0.4) == INCONCLUSIVE
    moved = _comp([0.30, 0.32, 0.28, 0.31, 0.29])
    assert judge_part(eq, moved, alpha=0.05, delta_lo=0.05, delta_hi=0.1, p=1.0) == FAILS
    # df 10⁴ (normal): δ/se = 1.6449 + 1.2816 → 1 − 2·P(Z ≥ 1.2816) = 0.8; δ/se = 1.6449 → 0
    assert tost_power(1.0, 10_000, 1.6449 + 1.2816, 0.05) == pytest.approx(0.8, abs=2e-3)
    assert tost_power(1.0, 10_000, 1.0, 0.05) == 0.0


def test_cispo_ceiling_claim_compares_loss_types_at_one_aggregation():
    claim = CLAIMS_V2_1["cispo_ceiling"]
    assert claim.baseline == "dapo" and claim.parts[0].baseline == "gspo_tm"
    up = [(0.80, 1.0), (0.82, 1.1), (0.78, 0.9), (0.81, 1.0)]
    low = [(0.70, 1.0), (0.71, 1.1), (0.69, 0.9), (0.70, 1.0)]
    v = judge_all_v21([claim], _fits({"cispo": up, "dapo": low, "gspo_tm": low}), REPORT)[0]
    assert v.verdict == HOLDS, v.reason
    assert v.checks[0]["delta"] == pytest.approx(0.25 * 0.40)   # 25% of DAPO's fitted gain A − R0 = 0.40
    v = judge_all_v21([claim], _fits({"cispo": up, "dapo": low}), REPORT)[0]
    assert v.verdict == NOT_RUN and "gspo_tm" in v.reason


def test_efficiency_not_ceiling_claims_need_both_parts():
    claim = CLAIMS_V2_1["zero_variance_efficiency"]
    assert [c.metric for c in claim.voting] == ["b", "a"] and claim.parts[0].relation == "equivalent"
    base = [(0.70, 1.00), (0.71, 1.05), (0.69, 0.95), (0.70, 1.02), (0.70, 0.98), (0.71, 1.00)]
    steeper_same = [(a + d, b + 0.8) for (a, b), d in zip(base, (0.001, -0.001, 0.0, 0.002, -0.002, 0.0))]
    v = judge_all_v21([claim], _fits({"grpo_zvf": steeper_same, "grpo": base}), REPORT)[0]
    assert v.verdict == HOLDS, v.reason
    higher = [(a + 0.2, b + 0.8) for (a, b) in base]  # it moves the ceiling too: the "not A" part fails
    v = judge_all_v21([claim], _fits({"grpo_zvf": higher, "grpo": base}), REPORT)[0]
    assert v.verdict == FAILS and "the same ceiling A as GRPO (within ±δ): does not hold" in v.reason
    noisy = [(a + d, b + 0.8) for (a, b), d in zip(base, (0.15, -0.12, 0.1, -0.14, 0.13, -0.1))]
    v = judge_all_v21([claim], _fits({"grpo_zvf": noisy, "grpo": base}), REPORT)[0]
    assert v.verdict == UNDECIDABLE and "power" in v.reason
    inactive = _fits({"grpo_zvf": steeper_same, "grpo": base})
    inactive["training"]["metrics"]["grpo_zvf"]["zero_var_frac"] = _metric([0.01] * 6)
    assert judge_all_v21([claim], inactive, REPORT)[0].verdict == NOT_TESTABLE  # nothing to filter


def test_recipe_choices_the_lab_cannot_build_are_refused_with_a_reason():
    assert set(REFUSED) == {"fp32_head_ceiling", "prompt_averaging_efficiency"}
    assert not set(REFUSED) & set(CLAIMS_V2_1)
    assert "FP32" in REFUSED["fp32_head_ceiling"] and "CPU" in REFUSED["fp32_head_ceiling"]
    from lmpo.objectives.parts import AGGREGATIONS

    assert not any("prompt" in name for name in AGGREGATIONS.names())  # the day one exists, define the claim


# ----------------------------------------------------------------------------------------------------
# The switch
# ----------------------------------------------------------------------------------------------------


def test_v2_1_claims_name_cells_and_metrics_the_lab_has():
    from lmpo.lab.report import GRADIENT_METRICS, TRAIN_METRICS
    from lmpo.objectives import PRESETS

    cells = set(PRESETS) | set(MATCHED_ABLATIONS) | set(RECIPE_ARMS) | {"rlvcr"}
    known = {"training": TRAIN_METRICS, "gradients": GRADIENT_METRICS, "fits": {"a": "", "b": ""}}
    for claim in CLAIMS_V2_1.values():
        for check in claim.checks:
            assert {claim.objective, claim.baseline, check.objective or claim.objective,
                    check.baseline or claim.baseline} <= cells, claim.name
            assert check.metric in known[check.study] and check.relation in (
                "greater", "less", "not_worse", "equivalent"), (claim.name, check.metric)
        if claim.activity is not None:
            assert claim.activity.metric in known[claim.activity.study], claim.name


def test_rule_names_are_checked():
    assert [c.name for c in claims_for("v2")] == list(CLAIMS) == list(CLAIMS_V2_1)[:len(CLAIMS)]
    with pytest.raises(ValueError, match="v2.1"):
        claims_for("v3")


@pytest.mark.parametrize("lab", ["v2/cpu", "v2/explore", "staleness"])
def test_published_v2_labs_rebuild_to_their_published_verdicts(tmp_path, lab):
    # `lmpo lab LAB.yaml --report-only` on a published lab (lab.json only, no job results): rule v2 by default
    from lmpo import cli

    src = ROOT / "docs" / "lab" / lab
    shutil.copy(src / "lab.json", tmp_path / "lab.json")
    published = json.loads((src / "lab.json").read_text())
    assert cli.main(["lab", str(src / "lab.yaml"), "--report-only", "--dir", str(tmp_path)]) == 0
    rebuilt = json.loads((tmp_path / "lab.json").read_text())
    assert rebuilt["rule"] == "v2" and rebuilt["config"]["report"]["rule"] == "v2"
    for task, data in published["tasks"].items():
        assert rebuilt["tasks"][task]["verdicts"] == data["verdicts"]  # every number, not only the outcome
        if data.get("staleness"):
            assert {k: v for k, v in rebuilt["tasks"][task]["staleness"].items() if k != "rule"} == data["staleness"]
    assert "(rule v2)" in (tmp_path / "lab.md").read_text()
    v21 = rejudge(published, "v2.1")
    assert v21["rule"] == "v2.1" and published.get("rule") is None  # the stored report is not changed
