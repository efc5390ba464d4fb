"""The claims the lab judges, and the rule that turns measurements into a verdict.

``CLAIMS`` is the registry: one :class:`Claim` per claim made for an objective variant by its paper or by
lmpo's docs, each with the measurements (:class:`Check`) that decide it. docs/lab.md's claims table is
rendered from it (:func:`claims_table_markdown`; a test keeps the two equal), and the rule below is the one
written there before any published run.

**The rule.** Each check compares the claim's objective with its baseline on paired samples (the same seeds
in the training study, the same batches in the gradient study) and gives the mean paired difference, its
interval at ``report.confidence`` and a p-value (bootstrap interval and paired t-test over seeds or batches;
jackknife interval and t-test for the snapshot-level SNR and cosine). With ``lo, hi`` the interval and
``α = report.alpha``:

- ``greater`` (the objective is higher): **holds** when ``lo > 0`` and ``p < α``; **does not hold** when
  ``hi < 0`` and ``p < α`` (significantly the other way); otherwise **inconclusive at this budget**.
  ``less`` is the mirror image.
- ``not_worse`` (keeps a metric where higher is better, margin m): **holds** when ``lo > −m``; **does not
  hold** when ``hi < −m``; otherwise inconclusive.

Both ``lo`` and ``p`` are required for the directional checks because a percentile bootstrap over five seeds
is narrower than the t interval; the t-test keeps it honest. A claim **holds** when every check holds,
**does not hold** when any check does not hold, and is **inconclusive at this budget** otherwise. A claim
with a precondition on the baseline (an entropy claim needs the baseline's entropy to fall) whose
precondition is not met is inconclusive, with that reason. A claim whose objective or baseline is not in the
grid (or whose study was not run) is **not run**.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any

HOLDS = "holds"
FAILS = "does not hold"
INCONCLUSIVE = "inconclusive at this budget"
NOT_RUN = "not run"

RELATIONS = ("greater", "less", "not_worse")


@dataclass(frozen=True)
class Check:
    """One measured comparison of a claim.

    ``study`` is ``training`` or ``gradients``; ``metric`` a key of that study's per-objective results
    (docs/lab.md, "What is measured"); ``relation`` one of ``RELATIONS``; ``margin`` the non-inferiority
    margin, or the name of a report field holding it (``accuracy_margin``).
    """

    study: str
    metric: str
    relation: str
    margin: float | str = 0.0
    says: str = ""
    """What the check stands for in the claim, e.g. "stops entropy collapse"."""


@dataclass(frozen=True)
class Claim:
    name: str
    text: str
    """The claim as its source makes it."""
    source: str
    """Where the claim is made: a paper (arXiv id) or lmpo's docs."""
    objective: str
    baseline: str
    checks: tuple[Check, ...]
    precondition: Check | None = None
    """A check on the baseline alone (one-sample, against 0) that must hold for the claim to be testable."""
    precondition_says: str = ""


_ACC = Check("training", "accuracy", "not_worse", "accuracy_margin", "keeps held-out accuracy")
_ENTROPY_FELL = Check("training", "entropy_change", "less", 0.0, "the baseline's entropy falls")


def _entropy_claim(name: str, objective: str, what: str, source: str) -> Claim:
    return Claim(name, f"{what} stops entropy collapse while keeping or improving accuracy.", source, objective,
                 "grpo", (Check("training", "entropy_end", "greater", 0.0, "higher final entropy than GRPO"), _ACC),
                 precondition=_ENTROPY_FELL, precondition_says="GRPO's entropy must fall for a collapse to be stopped")


_CLAIM_LIST = [
    Claim("ema_weight_variance", "EMA smoothing of the token importance weights lowers their variance.",
          "docs/objectives.md (token_ema level)", "ema", "grpo",
          (Check("gradients", "weight_var", "less", 0.0, "lower importance-weight variance"),)),
    Claim("ema_gradient_noise", "EMA smoothing of the token importance weights lowers the variance of the gradient.",
          "docs/objectives.md (token_ema level)", "ema", "grpo",
          (Check("gradients", "snr", "greater", 0.0, "higher gradient SNR"),)),
    Claim("amic_weight_variance", "The arithmetic mean of the token weights (AMIC) has a lower variance than "
          "GRPO's token weights.", "docs/objectives.md (sequence_arith level)", "amic", "grpo",
          (Check("gradients", "weight_var", "less", 0.0, "lower importance-weight variance"),)),
    Claim("amic_gradient_noise", "AMIC's sequence weight lowers the variance of the gradient.", "docs/objectives.md (sequence_arith level)",
          "amic", "grpo", (Check("gradients", "snr", "greater", 0.0, "higher gradient SNR"),)),
    Claim("grad_adaptive_faster", "Gradient-adaptive token credit assigns credit better and learns faster than "
          "uniform credit.", "docs/objectives.md (gradient_adaptive credit)", "grad_adaptive", "gspo",
          (Check("training", "reward_auc", "greater", 0.0, "larger area under the reward curve than GSPO"),)),
    Claim("decay_faster", "Temporal-decay credit (early tokens count more) learns faster than uniform credit.",
          "docs/objectives.md (temporal_decay credit)", "decay", "gspo",
          (Check("training", "reward_auc", "greater", 0.0, "larger area under the reward curve than GSPO"),)),
    Claim("ptrw_robust", "A Gaussian trust region (PTRW) is more robust to off-policy samples than a hard clip.",
          "docs/objectives.md (gaussian trust region)", "ptrw", "amic",
          (Check("gradients", "cos_onpolicy", "greater", 0.0,
                 "mean gradient closer to the on-policy direction than AMIC's hard clip"),
           Check("training", "accuracy", "not_worse", "accuracy_margin", "keeps held-out accuracy"))),
    Claim("asym_balance", "Sign-asymmetric clipping balances exploration (entropy) and stability (accuracy).",
          "docs/objectives.md (sign_asym trust region)", "asym", "grpo",
          (Check("training", "entropy_end", "greater", 0.0, "higher final entropy than GRPO"), _ACC)),
    Claim("gspo_stable_efficient", "GSPO's sequence ratio is more stable and more efficient than GRPO's token "
          "ratio, even though it clips far more tokens.", "Zheng et al. 2025, GSPO (arXiv 2507.18071)", "gspo",
          "grpo",
          (Check("training", "clip_frac", "greater", 0.0, "clips more than GRPO"),
           Check("gradients", "snr", "greater", 0.0, "higher gradient SNR (stability)"),
           Check("training", "reward_auc", "greater", 0.0, "larger area under the reward curve (efficiency)"))),
    _entropy_claim("dapo_entropy", "dapo", "Clip-higher (DAPO)", "Yu et al. 2025, DAPO (arXiv 2503.14476)"),
    _entropy_claim("clip_cov_entropy", "clip_cov", "Clip-Cov",
                   "Cui et al. 2025, Entropy Mechanism of RL for Reasoning LMs (arXiv 2505.22617)"),
    _entropy_claim("kl_cov_entropy", "kl_cov", "KL-Cov",
                   "Cui et al. 2025, Entropy Mechanism of RL for Reasoning LMs (arXiv 2505.22617)"),
    _entropy_claim("adaptive_entropy_entropy", "adaptive_entropy", "Adaptive entropy control",
                   "He et al. 2025, Skywork-OR1 (arXiv 2505.22312)"),
    Claim("cispo_faster", "Clipping the importance weight instead of the token update (CISPO) keeps every token's "
          "gradient and learns faster than a hard clip.", "MiniMax 2025, MiniMax-M1 (arXiv 2506.13585)", "cispo", "grpo",
          (Check("training", "reward_auc", "greater", 0.0, "larger area under the reward curve than GRPO"), _ACC)),
    Claim("gmpo_stable", "The geometric mean of token ratios (GMPO) is less sensitive to outlier ratios than GRPO's "
          "arithmetic mean: narrower importance weights and a steadier gradient.",
          "GMPO, geometric-mean policy optimization (arXiv 2507.20673)", "gmpo", "grpo",
          (Check("gradients", "weight_var", "less", 0.0, "lower importance-weight variance"),
           Check("gradients", "snr", "greater", 0.0, "higher gradient SNR"))),
    Claim("sapo_stable", "A soft sigmoid gate (SAPO) gives steadier updates than a hard clip while keeping accuracy.",
          "SAPO (arXiv 2511.20347)", "sapo", "grpo",
          (Check("gradients", "snr", "greater", 0.0, "higher gradient SNR"), _ACC)),
    Claim("rlvcr_shorter", "RLVCR teaches shorter thinking at equal accuracy.", "docs/rlvcr.md", "rlvcr", "grpo",
          (Check("training", "eval_length", "less", 0.0, "shorter held-out completions than GRPO"), _ACC)),
]

CLAIMS: Mapping[str, Claim] = MappingProxyType({c.name: c for c in _CLAIM_LIST})
"""Registry of judged claims: name → Claim."""


# ----------------------------------------------------------------------------------------------------
# The rule
# ----------------------------------------------------------------------------------------------------


def margin_of(check: Check, report: Any) -> float:
    return float(getattr(report, check.margin)) if isinstance(check.margin, str) else float(check.margin)


def judge_check(check: Check, comparison: Mapping[str, Any], *, alpha: float, margin: float) -> str:
    """Apply the rule (module docstring) to one comparison ``{"diff", "ci": [lo, hi], "p"}``."""
    lo, hi = comparison["ci"]
    p = comparison.get("p", math.nan)
    if not (math.isfinite(lo) and math.isfinite(hi)):
        return INCONCLUSIVE
    significant = math.isfinite(p) and p < alpha
    if check.relation == "greater":
        if lo > 0 and significant:
            return HOLDS
        if hi < 0 and significant:
            return FAILS
        return INCONCLUSIVE
    if check.relation == "less":
        if hi < 0 and significant:
            return HOLDS
        if lo > 0 and significant:
            return FAILS
        return INCONCLUSIVE
    if check.relation == "not_worse":
        if lo > -margin:
            return HOLDS
        if hi < -margin:
            return FAILS
        return INCONCLUSIVE
    raise ValueError(f"unknown relation {check.relation!r}; use one of {', '.join(RELATIONS)}")


def combine(verdicts: list[str]) -> str:
    """Every check holds → holds; any does not hold → does not hold; otherwise inconclusive."""
    if any(v == FAILS for v in verdicts):
        return FAILS
    if verdicts and all(v == HOLDS for v in verdicts):
        return HOLDS
    return INCONCLUSIVE


@dataclass
class Verdict:
    claim: str
    text: str
    source: str
    objective: str
    baseline: str
    verdict: str
    checks: list[dict[str, Any]] = field(default_factory=list)
    reason: str = ""


def _labels_in(study: Mapping[str, Any]) -> set[str]:
    """The objective labels a study's results cover (training: ``metrics``; gradients: ``snapshots``)."""
    if "metrics" in study:
        return set(study["metrics"])
    snapshots = study.get("snapshots") or []
    return set(snapshots[0]["objectives"]) if snapshots else set()


def judge(claim: Claim, results: Mapping[str, Any], report: Any) -> Verdict:
    """The verdict of one claim from the lab's results.

    ``results`` maps ``(study)`` → ``{"comparisons": {objective: {baseline: {metric: comparison}}},
    "one_sample": {objective: {metric: comparison}}}`` as :mod:`lmpo.lab.report` builds them.
    """
    out = Verdict(claim.name, claim.text, claim.source, claim.objective, claim.baseline, NOT_RUN)
    verdicts = []
    for check in claim.checks:
        study = results.get(check.study)
        comp = None
        if study is not None:
            comp = study.get("comparisons", {}).get(claim.objective, {}).get(claim.baseline, {}).get(check.metric)
        if comp is None:
            if study is None:
                out.reason = f"the {check.study} study was not run"
            else:
                present = _labels_in(study)
                missing = [x for x in (claim.objective, claim.baseline) if x not in present]
                out.reason = (f"{' and '.join(f'`{x}`' for x in missing)} not in the {check.study} study"
                              if missing else f"no {check.study} `{check.metric}` comparison")
            return out
        v = judge_check(check, comp, alpha=report.alpha, margin=margin_of(check, report))
        out.checks.append({"says": check.says, "study": check.study, "metric": check.metric,
                           "relation": check.relation, "margin": margin_of(check, report), **comp, "verdict": v})
        verdicts.append(v)
    out.verdict = combine(verdicts)
    if claim.precondition is not None:
        pre = claim.precondition
        study = results.get(pre.study) or {}
        comp = study.get("one_sample", {}).get(claim.baseline, {}).get(pre.metric)
        met = comp is not None and judge_check(pre, comp, alpha=report.alpha, margin=margin_of(pre, report)) == HOLDS
        out.checks.append({"says": claim.precondition_says, "study": pre.study, "metric": pre.metric,
                           "relation": pre.relation, "margin": margin_of(pre, report), **(comp or {}),
                           "verdict": HOLDS if met else INCONCLUSIVE, "precondition": True})
        if not met and out.verdict != FAILS:
            out.verdict = INCONCLUSIVE
            out.reason = f"precondition not met: {claim.precondition_says}"
    return out


def claims_table_markdown() -> str:
    """The claims table of docs/lab.md: claim, objective vs baseline, checks (generated from ``CLAIMS``)."""
    rows = ["| claim | source | objective vs baseline | checks (all must hold) |", "|---|---|---|---|"]
    for c in CLAIMS.values():
        checks = "; ".join(f"{k.study} `{k.metric}` {k.relation}"
                           + (f" (margin `{k.margin}`)" if isinstance(k.margin, str) else "")
                           for k in c.checks)
        if c.precondition is not None:
            checks += f"; precondition: baseline `{c.precondition.metric}` {c.precondition.relation} 0"
        rows.append(f"| `{c.name}`: {c.text} | {c.source} | `{c.objective}` vs `{c.baseline}` | {checks} |")
    return "\n".join(rows) + "\n"


__all__ = ["CLAIMS", "FAILS", "HOLDS", "INCONCLUSIVE", "NOT_RUN", "RELATIONS", "Check", "Claim", "Verdict",
           "claims_table_markdown", "combine", "judge", "judge_check"]
