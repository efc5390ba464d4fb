"""The verdict rule on hand-made comparisons, and the claims registry against the presets and docs/lab.md."""

from __future__ import annotations

import math
import re
from pathlib import Path
from types import SimpleNamespace

import pytest

from lmpo.lab.claims import (
    CLAIMS,
    FAILS,
    HOLDS,
    INCONCLUSIVE,
    NOT_RUN,
    Check,
    Claim,
    claims_table_markdown,
    combine,
    judge,
    judge_check,
)
from lmpo.objectives import PRESETS

ROOT = Path(__file__).resolve().parents[2]
REPORT = SimpleNamespace(alpha=0.05, accuracy_margin=0.05)


def _c(lo, hi, p, diff=None):
    return {"diff": (lo + hi) / 2 if diff is None else diff, "ci": [lo, hi], "p": p}


@pytest.mark.parametrize("comp, verdict", [
    (_c(0.1, 0.3, 0.01), HOLDS),            # interval above 0 and significant
    (_c(0.1, 0.3, 0.2), INCONCLUSIVE),      # interval above 0 but the t-test does not agree
    (_c(-0.1, 0.3, 0.01), INCONCLUSIVE),    # interval straddles 0
    (_c(-0.3, -0.1, 0.01), FAILS),          # significantly the other way
    (_c(math.nan, math.nan, math.nan), INCONCLUSIVE),
])
def test_greater(comp, verdict):
    assert judge_check(Check("training", "reward_auc", "greater"), comp, alpha=0.05, margin=0.0) == verdict


@pytest.mark.parametrize("comp, verdict", [
    (_c(-0.3, -0.1, 0.01), HOLDS), (_c(0.1, 0.3, 0.01), FAILS), (_c(-0.3, 0.1, 0.4), INCONCLUSIVE)])
def test_less(comp, verdict):
    assert judge_check(Check("gradients", "weight_var", "less"), comp, alpha=0.05, margin=0.0) == verdict


@pytest.mark.parametrize("comp, verdict", [
    (_c(-0.04, 0.10, 0.5), HOLDS),          # cannot be worse by the margin 0.05
    (_c(-0.20, -0.06, 0.01), FAILS),        # worse by more than the margin
    (_c(-0.10, 0.02, 0.5), INCONCLUSIVE),   # might be worse by more than the margin
])
def test_not_worse_uses_the_margin(comp, verdict):
    assert judge_check(Check("training", "accuracy", "not_worse", "accuracy_margin"), comp, alpha=0.05,
                       margin=0.05) == verdict


def test_combine():
    assert combine([HOLDS, HOLDS]) == HOLDS
    assert combine([HOLDS, INCONCLUSIVE]) == INCONCLUSIVE
    assert combine([HOLDS, FAILS, INCONCLUSIVE]) == FAILS
    assert combine([]) == INCONCLUSIVE


def _results(entropy_end, accuracy, baseline_change):
    training = {"metrics": {"dapo": {}, "grpo": {}},
                "comparisons": {"dapo": {"grpo": {"entropy_end": entropy_end, "accuracy": accuracy}}},
                "one_sample": {"grpo": {"entropy_change": baseline_change}}}
    return {"training": training, "gradients": None}


def test_entropy_claim_holds_only_when_the_baseline_entropy_fell():
    claim = CLAIMS["dapo_entropy"]
    up, keeps = _c(0.05, 0.2, 0.001), _c(-0.02, 0.04, 0.6)
    fell, flat = _c(-0.3, -0.1, 0.001), _c(-0.1, 0.1, 0.7)
    assert judge(claim, _results(up, keeps, fell), REPORT).verdict == HOLDS
    v = judge(claim, _results(up, keeps, flat), REPORT)
    assert v.verdict == INCONCLUSIVE and "precondition" in v.reason
    assert judge(claim, _results(_c(-0.3, -0.1, 0.001), keeps, flat), REPORT).verdict == FAILS


def test_claim_whose_objective_is_missing_is_not_run():
    v = judge(CLAIMS["rlvcr_shorter"], _results(None, None, None), REPORT)
    assert v.verdict == NOT_RUN and "`rlvcr`" in v.reason
    v = judge(CLAIMS["ema_weight_variance"], _results(None, None, None), REPORT)
    assert v.verdict == NOT_RUN and "gradients study was not run" in v.reason


def test_claims_name_presets_the_lab_runs():
    for claim in CLAIMS.values():
        for name in (claim.objective, claim.baseline):
            assert name in PRESETS or name == "rlvcr", f"claim {claim.name} names unknown objective {name}"
        for check in claim.checks + ((claim.precondition,) if claim.precondition else ()):
            assert check.relation in ("greater", "less", "not_worse")
            assert check.study in ("training", "gradients")


def test_claims_table_in_docs_is_generated_from_the_registry():
    text = (ROOT / "docs" / "lab.md").read_text(encoding="utf-8")
    match = re.search(r"<!-- claims-table:start -->\n(.*?)<!-- claims-table:end -->", text, re.S)
    assert match, "docs/lab.md lost its claims-table markers"
    assert match.group(1) == claims_table_markdown(), "docs/lab.md's claims table is stale: run `make docs`"


def test_claim_metrics_exist():
    from lmpo.lab.report import GRADIENT_METRICS, TRAIN_METRICS

    for claim in CLAIMS.values():
        for check in claim.checks + ((claim.precondition,) if claim.precondition else ()):
            known = TRAIN_METRICS if check.study == "training" else GRADIENT_METRICS
            assert check.metric in known, f"{claim.name}: unknown {check.study} metric {check.metric}"


def test_a_user_claim_is_judged_like_the_built_in_ones():
    claim = Claim("mine", "gspo learns faster", "me", "gspo", "grpo",
                  (Check("training", "reward_auc", "greater"),))
    results = {"training": {"metrics": {"gspo": {}, "grpo": {}},
                            "comparisons": {"gspo": {"grpo": {"reward_auc": _c(0.01, 0.02, 0.001)}}}}}
    assert judge(claim, results, REPORT).verdict == HOLDS
