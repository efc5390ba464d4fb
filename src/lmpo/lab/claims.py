"""The claims the lab judges, and verdict rule v2 that turns measurements into one of six outcomes.

``CLAIMS`` is the registry: one :class:`Claim` per claim made for an objective variant by its paper or by
lmpo's docs. docs/lab.md's claims table is rendered from it (:func:`claims_table_markdown`; a test keeps the
two equal), and the rule below is the one written there before any run.

**Rule v2.** A claim names its objective, its baseline, **one primary check** (the comparison that decides
it), secondary checks (reported beside it, never voting), validity preconditions and a mechanism-activity
gate. Every check carries a **smallest effect of interest** δ declared relative to the baseline's own effect
(:class:`Sesoi`: e.g. 25% of the baseline's RL accuracy gain). Gates run first, on the runs, before any
verdict:

1. **not run** — the objective or the baseline is missing from the study a check needs;
2. **invalid run** — a cell of the objective or the baseline diverged (held-out accuracy below its start by
   more than ``report.divergence_margin``) or logged non-finite values, a precondition is unmet (the
   baseline's entropy does not fall; an entropy target above the baseline's starting entropy), or δ cannot be
   computed (the baseline shows no effect to scale it by). The reason is printed;
3. **not testable here** — the activity measure of the variant (:class:`Activity`: the share of tokens whose
   gradient weight differs from the baseline's by more than a relative tolerance, or a bound's binding rate)
   is below its declared threshold: the mechanism does not act at this scale.

Then the primary checks of the remaining claims form one family, corrected with **Holm's** step-down method
(``lmpo.lab.stats.holm``). With d the mean paired difference, its t interval, its (1 − 2α) t interval
``[lo₂, hi₂]`` (the two one-sided tests) and p̃ the Holm-adjusted p-value (raw p for secondary checks):

- ``greater`` (``less`` mirrored): **no material effect** when ``−δ < lo₂`` and ``hi₂ < δ`` (equivalence: any
  effect is smaller than δ, significant or not); else **holds** when p̃ < α and d > 0; **does not hold** when
  p̃ < α and d < 0; otherwise **inconclusive**. p is the two-sided paired t-test.
- ``not_worse`` (non-inferiority with margin δ): **holds** when p̃ < α for the one-sided t-test of d > −δ
  (equivalently ``lo₂ > −δ`` unadjusted); **does not hold** when ``hi₂ < −δ``; otherwise **inconclusive**.

Beside every check the report gives ``mde``: the smallest true difference the run detects at 80% power at
level α (two-sided; one-sided for non-inferiority), so an inconclusive verdict says how far it was from
deciding.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from types import MappingProxyType
from typing import Any

from lmpo.lab import stats as st

HOLDS = "holds"
FAILS = "does not hold"
NO_EFFECT = "no material effect"
INCONCLUSIVE = "inconclusive"
NOT_TESTABLE = "not testable here"
INVALID = "invalid run"
NOT_RUN = "not run"

OUTCOMES = (HOLDS, FAILS, NO_EFFECT, INCONCLUSIVE, NOT_TESTABLE, INVALID)
"""The six verdicts of rule v2 (``NOT_RUN`` marks a claim whose cells are not in the grid)."""

RELATIONS = ("greater", "less", "not_worse")


@dataclass(frozen=True)
class Sesoi:
    """Smallest effect of interest: ``δ = fraction · |the baseline's own `of`|``.

    ``of`` is a metric of the baseline in the check's study (``study`` overrides it): training metrics are
    averaged over the baseline's seeds (``accuracy_gain`` is its RL accuracy gain, ``entropy_change`` its entropy
    fall, ``reward_gain`` its reward gain), gradient metrics over its snapshots."""

    fraction: float
    of: str
    study: str = ""

    def describe(self) -> str:
        return f"{self.fraction:.0%} of the baseline's |{self.of}|"


@dataclass(frozen=True)
class Check:
    """One measured comparison: ``study`` (``training`` or ``gradients``), ``metric`` (docs/lab.md's metric
    tables), ``relation`` (``RELATIONS``), the smallest effect of interest and what the check stands for."""

    study: str
    metric: str
    relation: str
    sesoi: Sesoi
    says: str = ""
    objective: str = ""
    """The objective this check compares (rule v2.1; empty: the claim's)."""
    baseline: str = ""
    """The baseline this check compares with, and whose value scales δ (rule v2.1; empty: the claim's)."""


@dataclass(frozen=True)
class Activity:
    """The mechanism-activity gate: the variant's ``metric`` must reach ``threshold`` for the claim to be
    testable.

    ``gradients`` / ``weight_diff_frac``: share of valid tokens whose gradient weight ``∂loss/∂logp_t`` differs
    from the claim baseline's on the same batch by more than 1% (relative), pooled over the gradient study's
    snapshots and batches. A ``training`` metric (``clip_high_frac``, ``mask_frac``, ``entropy_coef_active``,
    ``rlvcr_acting_frac``) is the mean over the variant's seeds."""

    study: str
    metric: str
    threshold: float
    says: str = ""
    against: str = ""
    """Rule v2.1: the matched ablation the gradient weights are compared with (empty: the claim's baseline)."""


@dataclass(frozen=True)
class Precondition:
    """A condition on the runs without which the comparison means nothing (unmet → invalid run).

    ``kind="trend"``: the baseline's training ``metric`` (a change over the run) differs from 0 in ``relation``'s
    direction (one-sample t-test at α, e.g. ``avg_at_k_gain`` ``greater``: its sampled pass@1 rises); with
    ``fraction`` and ``relative_to`` it must also move by at least ``fraction`` of the baseline's mean
    ``relative_to`` (``entropy_change`` ``less`` by 30% of ``entropy_start``: its entropy falls by ≥ 30%).
    ``kind="flat"``: the change is *not* significantly in ``relation``'s direction (pass@k at large k stagnates
    or falls). ``kind="parameter"``: the objective's parameter ``parameter`` (a key of ``Objective.to_dict()``) is
    at most (``relation="at_most"``) the baseline's mean training ``metric`` (an entropy target at or below the
    baseline's starting entropy)."""

    kind: str
    metric: str
    relation: str
    says: str
    parameter: str = ""
    fraction: float = 0.0
    relative_to: str = ""


@dataclass(frozen=True)
class Claim:
    name: str
    text: str
    """The claim as its source makes it."""
    source: str
    """Where the claim is made: a paper (arXiv id) or lmpo's docs."""
    objective: str
    baseline: str
    primary: Check
    secondary: tuple[Check, ...] = ()
    preconditions: tuple[Precondition, ...] = ()
    activity: Activity | None = None
    parts: tuple[Check, ...] = ()
    """Rule v2.1: further parts of a claim that makes several (each votes; the claim holds only when all hold)."""
    robustness: bool = False
    """Rule v2.1: the claim is about robustness, so the objective's divergence is its outcome, not a gate."""

    @property
    def checks(self) -> tuple[Check, ...]:
        """Every check: the primary, the further voting parts (rule v2.1), then the secondary checks."""
        return (self.primary, *self.parts, *self.secondary)

    @property
    def voting(self) -> tuple[Check, ...]:
        return (self.primary, *self.parts)


# ----------------------------------------------------------------------------------------------------
# The registry
# ----------------------------------------------------------------------------------------------------

_ACC = Check("training", "accuracy", "not_worse", Sesoi(0.25, "accuracy_gain"), "keeps held-out accuracy")
_ENTROPY_FELL = Precondition("trend", "entropy_change", "less", "the baseline's entropy falls by ≥ 30% over the run",
                             fraction=0.30, relative_to="entropy_start")
_EXPLORATION = (Precondition("trend", "avg_at_k_gain", "greater", "the baseline's sampled pass@1 (avg@k) rises"),
                Precondition("flat", "pass_at_k_gain", "greater", "the baseline's pass@k stagnates or falls"))
"""The exploration task's measured precondition (docs/lab.md): the entropy claims are judged where it holds."""
_WEIGHTS = "share of tokens whose gradient weight differs from the baseline's by > 1%"


def _acts(threshold: float = 0.05) -> Activity:
    return Activity("gradients", "weight_diff_frac", threshold, _WEIGHTS)


def _snr(says: str = "higher gradient SNR") -> Check:
    return Check("gradients", "snr", "greater", Sesoi(0.25, "snr"), says)


def _weight_var() -> Check:
    return Check("gradients", "weight_var", "less", Sesoi(0.25, "weight_var"), "lower importance-weight variance")


def _faster(base: str) -> Check:
    return Check("training", "reward_auc", "greater", Sesoi(0.25, "reward_gain"),
                 f"larger area under the reward curve than {base}")


def _entropy_claim(name: str, objective: str, what: str, source: str, activity: Activity,
                   extra: tuple[Precondition, ...] = ()) -> Claim:
    return Claim(name, f"{what} stops entropy collapse while keeping or improving accuracy.", source, objective,
                 "grpo", Check("training", "entropy_end", "greater", Sesoi(0.25, "entropy_change"),
                               "higher final entropy than GRPO"),
                 (Check("training", "pass_at_k", "greater", Sesoi(0.25, "accuracy_gain"),
                        "higher sampled pass@k (exploration)"), _ACC),
                 (_ENTROPY_FELL, *_EXPLORATION, *extra), activity)


_CLAIM_LIST = [
    Claim("ema_gradient_noise", "EMA smoothing of the token importance weights lowers the variance of the "
          "gradient.", "docs/objectives.md (token_ema level)", "ema", "grpo", _snr(), (_weight_var(),),
          activity=_acts()),
    Claim("amic_gradient_noise", "AMIC's arithmetic-mean sequence weight lowers the variance of the gradient.",
          "docs/objectives.md (sequence_arith level)", "amic", "grpo", _snr(), (_weight_var(),), activity=_acts()),
    Claim("grad_adaptive_faster", "Gradient-adaptive token credit assigns credit better and learns faster than "
          "uniform credit.", "docs/objectives.md (gradient_adaptive credit)", "grad_adaptive", "gspo",
          _faster("GSPO"), (_ACC,), activity=_acts()),
    Claim("decay_faster", "Temporal-decay credit (early tokens count more) learns faster than uniform credit.",
          "docs/objectives.md (temporal_decay credit)", "decay", "gspo", _faster("GSPO"), (_ACC,),
          activity=_acts()),
    Claim("ptrw_robust", "A Gaussian trust region (PTRW) is more robust to off-policy samples than a hard clip.",
          "docs/objectives.md (gaussian trust region)", "ptrw", "amic",
          Check("gradients", "cos_onpolicy", "greater", Sesoi(0.10, "cos_onpolicy"),
                "mean gradient closer to the on-policy direction than AMIC's hard clip"),
          (Check("training", "accuracy", "not_worse", Sesoi(0.25, "accuracy_gain"), "keeps held-out accuracy"),),
          activity=_acts()),
    Claim("asym_balance", "Sign-asymmetric clipping balances exploration (entropy) and stability (accuracy).",
          "docs/objectives.md (sign_asym trust region)", "asym", "grpo",
          Check("training", "entropy_end", "greater", Sesoi(0.25, "entropy_change"), "higher final entropy than GRPO"),
          (_ACC,), (_ENTROPY_FELL, *_EXPLORATION),
          Activity("training", "clip_high_frac", 0.01, "upper-bound binding rate (A > 0)")),
    Claim("gspo_stable_efficient", "GSPO's sequence ratio is more stable and more efficient than GRPO's token "
          "ratio, even though it clips far more tokens.", "Zheng et al. 2025, GSPO (arXiv 2507.18071)", "gspo",
          "grpo", _faster("GRPO"),
          (_snr("higher gradient SNR (stability)"),
           Check("training", "clip_frac", "greater", Sesoi(1.0, "clip_frac"), "clips more than GRPO")),
          activity=_acts()),
    _entropy_claim("dapo_entropy", "dapo", "Clip-higher (DAPO)", "Yu et al. 2025, DAPO (arXiv 2503.14476)",
                   Activity("training", "clip_high_frac", 0.01, "upper-bound binding rate (A > 0)")),
    _entropy_claim("clip_cov_entropy", "clip_cov", "Clip-Cov",
                   "Cui et al. 2025, Entropy Mechanism of RL for Reasoning LMs (arXiv 2505.22617)",
                   Activity("training", "mask_frac", 0.005, "share of tokens masked")),
    _entropy_claim("kl_cov_entropy", "kl_cov", "KL-Cov",
                   "Cui et al. 2025, Entropy Mechanism of RL for Reasoning LMs (arXiv 2505.22617)",
                   Activity("training", "mask_frac", 0.005, "share of tokens penalised")),
    _entropy_claim("adaptive_entropy_entropy", "adaptive_entropy", "Adaptive entropy control",
                   "He et al. 2025, Skywork-OR1 (arXiv 2505.22312)",
                   Activity("training", "entropy_coef_active", 0.10, "share of steps with a non-zero entropy bonus"),
                   (Precondition("parameter", "entropy_start", "at_most",
                                 "the entropy target is at or below the baseline's starting entropy",
                                 parameter="entropy_target"),)),
    Claim("cispo_faster", "Clipping the importance weight instead of the token update (CISPO) keeps every token's "
          "gradient and learns faster than a hard clip.", "MiniMax 2025, MiniMax-M1 (arXiv 2506.13585)", "cispo",
          "grpo", _faster("GRPO"), (_ACC,), activity=_acts()),
    Claim("gmpo_stable", "The geometric mean of token ratios (GMPO) is less sensitive to outlier ratios than GRPO's "
          "arithmetic mean: a steadier gradient from narrower importance weights.",
          "GMPO, geometric-mean policy optimization (arXiv 2507.20673)", "gmpo", "grpo", _snr(), (_weight_var(),),
          activity=_acts()),
    Claim("sapo_stable", "A soft sigmoid gate (SAPO) gives steadier updates than a hard clip while keeping accuracy.",
          "SAPO (arXiv 2511.20347)", "sapo", "grpo", _snr(), (_ACC,), activity=_acts()),
    Claim("rlvcr_shorter", "RLVCR teaches shorter thinking at equal accuracy.", "docs/rlvcr.md", "rlvcr", "grpo",
          Check("training", "eval_length", "less", Sesoi(0.10, "eval_length"), "shorter held-out completions"),
          (_ACC,), activity=Activity("training", "rlvcr_acting_frac", 0.05, "share of trained rows that carry "
                                                                         "a thinking advantage")),
]

CLAIMS: Mapping[str, Claim] = MappingProxyType({c.name: c for c in _CLAIM_LIST})
"""Registry of judged claims: name → Claim."""


# ----------------------------------------------------------------------------------------------------
# Rule v2.1: the same claims against matched ablations, every part voting
# ----------------------------------------------------------------------------------------------------

MATCHED_ABLATIONS: Mapping[str, Mapping[str, Any]] = MappingProxyType({
    "grpo_tm": {"preset": "grpo", "overrides": {"aggregation": "token_mean"},
                "says": "GRPO with token_mean aggregation (the aggregation of DAPO, CISPO, Clip-Cov, adaptive entropy)"},
    "grpo_tm_noclip": {"preset": "grpo", "overrides": {"aggregation": "token_mean", "trust_region": "none"},
                       "says": "GRPO with token_mean aggregation and no clip (KL-Cov's aggregation and trust region)"},
    "grpo_noclip": {"preset": "grpo", "overrides": {"trust_region": "none"},
                    "says": "GRPO without its clip (GMPO's log-clip never binds: GMPO is then unclipped too)"},
    "amic_noclip": {"preset": "amic", "overrides": {"trust_region": "none"},
                    "says": "AMIC's arithmetic-mean weight without its sequence clip"},
    "gspo_tm": {"preset": "gspo", "overrides": {"aggregation": "token_mean"},
                "says": "GSPO's loss with token_mean aggregation (ScaleRL compares loss types at one aggregation)"},
})
"""The cells rule v2.1's claims compare with: each equals its claim's objective in everything but the mechanism
(aggregation and clip included). ``label → {"preset", "overrides", "says"}``, as a lab config's objective entry."""

RECIPE_ARMS: Mapping[str, Mapping[str, Any]] = MappingProxyType({
    "grpo_zvf": {"preset": "grpo", "overrides": {}, "train": {"objective": {"filter_zero_variance": True}},
                 "says": "GRPO with zero-variance filtering (groups whose rewards are all equal are dropped)"},
    "grpo_batchnorm": {"preset": "grpo", "overrides": {}, "train": {"objective": {"advantage_options": {
        "scale": "batch"}}}, "says": "GRPO with batch-level advantage normalisation (the batch's reward std)"},
})
"""ScaleRL's recipe choices as lab cells (``label → {"preset", "overrides", "train", "says"}``, a lab config's
objective entry): each differs from GRPO in that choice only."""

REFUSED: Mapping[str, str] = MappingProxyType({
    "fp32_head_ceiling": "ScaleRL's FP32 LM head (vs bf16) raises the ceiling A: not defined here. lmpo has no "
                         "option that computes the head in FP32 while the model runs in bf16 (the logits are taken in "
                         "the model's dtype and only the log-probabilities are promoted to FP32), and the CPU lab "
                         "runs FP32 throughout, so both arms would be the same run.",
    "prompt_averaging_efficiency": "ScaleRL's prompt-level loss averaging changes efficiency B, not A: not defined "
                                   "here. lmpo's aggregations (token_mean, seq_mean_token_mean, seq_mean_token_sum, "
                                   "seq_sum_norm, token_sum) average per token, per sequence or per batch, none per "
                                   "prompt group, so the arm cannot be built.",
})
"""ScaleRL recipe claims the lab does not define, with the reason (docs/lab.md prints them)."""

STEPS = "reward_steps"
"""Rule v2.1's "faster": RL steps to a reward threshold (``lmpo.lab.report.TRAIN_METRICS``)."""


def _fewer_steps(base: str) -> Check:
    return Check("training", STEPS, "less", Sesoi(0.25, STEPS), f"reaches the reward threshold in fewer RL steps "
                 f"than {base}")


def _v21(name: str, **changes: Any) -> Claim:
    return replace(CLAIMS[name], **changes)


def _entropy_v21(name: str, baseline: str) -> Claim:
    """An entropy claim ("stops entropy collapse while keeping accuracy") with its accuracy part voting."""
    pass_k, acc = CLAIMS[name].secondary
    return _v21(name, baseline=baseline, parts=(acc,), secondary=(pass_k,))


_WEIGHTS_VS = "share of tokens whose gradient weight differs from the matched ablation's by > 1%"

_CLAIM_LIST_V2_1 = [
    _v21("ema_gradient_noise"),
    _v21("amic_gradient_noise", baseline="gspo",
         primary=Check("gradients", "snr", "greater", Sesoi(0.25, "snr"), "higher gradient SNR than GSPO (the same "
                       "sequence clip on the geometric mean)"),
         parts=(Check("gradients", "snr", "greater", Sesoi(0.25, "snr"), "the unclipped pair: AMIC's weight without "
                      "its clip has a higher SNR than GRPO without its clip", objective="amic_noclip",
                      baseline="grpo_noclip"),),
         activity=Activity("gradients", "weight_diff_frac", 0.05, _WEIGHTS_VS, against="gspo")),
    _v21("grad_adaptive_faster", primary=_fewer_steps("GSPO")),
    _v21("decay_faster", primary=_fewer_steps("GSPO")),
    _v21("ptrw_robust", robustness=True),
    _v21("asym_balance", parts=(_ACC,), secondary=()),
    _v21("gspo_stable_efficient", primary=_fewer_steps("GRPO"), parts=(_snr("higher gradient SNR (stability)"),),
         secondary=(CLAIMS["gspo_stable_efficient"].secondary[1],)),
    _entropy_v21("dapo_entropy", "grpo_tm"),
    _entropy_v21("clip_cov_entropy", "grpo_tm"),
    _entropy_v21("kl_cov_entropy", "grpo_tm_noclip"),
    _entropy_v21("adaptive_entropy_entropy", "grpo_tm"),
    _v21("cispo_faster", baseline="grpo_tm", primary=_fewer_steps("GRPO with token_mean"),
         activity=Activity("gradients", "weight_diff_frac", 0.05, _WEIGHTS_VS, against="grpo_tm")),
    _v21("gmpo_stable", baseline="grpo_noclip",
         activity=Activity("gradients", "weight_diff_frac", 0.05, _WEIGHTS_VS, against="grpo_noclip")),
    _v21("sapo_stable", parts=(_ACC,), secondary=()),
    _v21("rlvcr_shorter", parts=(_ACC,), secondary=()),
]

_SCALERL = "Khatri et al. 2025, ScaleRL (arXiv 2510.13786)"


def _fit(metric: str, relation: str, says: str, baseline: str = "") -> Check:
    """A check on the compute–performance fit (``lmpo.lab.fits``): the ceiling ``a`` (δ: 25% of the baseline's
    ``A − R0``, its fitted RL gain) or the efficiency ``b`` (δ: 25% of the baseline's ``B``), paired over seeds."""
    return Check("fits", metric, relation, Sesoi(0.25, "a_gain" if metric == "a" else "b"), says, baseline=baseline)


def _b_not_a(name: str, objective: str, what: str, activity: Activity | None = None) -> Claim:
    return Claim(name, f"{what} improves compute efficiency (a larger B) without moving the ceiling A.", _SCALERL,
                 objective, "grpo", _fit("b", "greater", "larger efficiency B than GRPO"),
                 parts=(_fit("a", "equivalent", "the same ceiling A as GRPO (within ±δ)"),), activity=activity)


_CLAIM_LIST_V2_1 += [
    Claim("cispo_ceiling", "CISPO's loss raises the asymptotic pass rate (the ceiling A) over DAPO's and GSPO's.",
          _SCALERL, "cispo", "dapo", _fit("a", "greater", "higher ceiling A than DAPO"),
          parts=(_fit("a", "greater", "higher ceiling A than GSPO's loss at CISPO's aggregation", baseline="gspo_tm"),)),
    _b_not_a("zero_variance_efficiency", "grpo_zvf", "Zero-variance filtering",
             Activity("training", "zero_var_frac", 0.05, "share of completions in zero-variance groups (what the "
                                                         "filter drops)")),
    _b_not_a("batch_norm_efficiency", "grpo_batchnorm", "Batch-level advantage normalisation"),
]

CLAIMS_V2_1: Mapping[str, Claim] = MappingProxyType({c.name: c for c in _CLAIM_LIST_V2_1})
"""The registry under rule v2.1 (:mod:`lmpo.lab.rules`): the claims of ``CLAIMS`` with their matched ablation as the
baseline, every part of a claim that makes several voting, "faster" as fewer steps to a reward threshold, and
PTRW's robustness claim decided by divergence; then ScaleRL's recipe claims, judged on the fitted ceiling A and
efficiency B (``REFUSED`` lists the ones the lab cannot build)."""


# ----------------------------------------------------------------------------------------------------
# The rule
# ----------------------------------------------------------------------------------------------------


def _finite(*xs: float) -> bool:
    return all(x is not None and math.isfinite(x) for x in xs)


def _interval(comp: Mapping[str, Any], alpha: float) -> tuple[float, float]:
    """The (1 − 2α) t interval of a comparison (the two one-sided tests' interval)."""
    d, se, df = comp.get("diff", math.nan), comp.get("se", math.nan), comp.get("df", 0) or 0
    if not (_finite(d, se) and df >= 1):
        return (math.nan, math.nan)
    half = st.student_t_ppf(1.0 - alpha, df) * se
    return (d - half, d + half)


def check_p(check: Check, comp: Mapping[str, Any], delta: float) -> float:
    """The p-value that enters Holm's family: the two-sided paired test for ``greater`` / ``less``, the one-sided
    test of ``d > −δ`` for ``not_worse``."""
    if check.relation == "not_worse":
        return st.one_sided_p(comp.get("diff", math.nan), comp.get("se", math.nan), comp.get("df", 0) or 0,
                              shift=-delta, upper=True)
    p = comp.get("p", math.nan)
    return p if p is not None else math.nan


def judge_check(check: Check, comp: Mapping[str, Any], *, alpha: float, delta: float,
                p: float | None = None) -> str:
    """Apply rule v2 (module docstring) to one comparison ``{"diff", "se", "df", "p", …}`` with smallest effect
    of interest ``delta``; ``p`` is the (Holm-adjusted) p-value, by default :func:`check_p`'s raw one."""
    if check.relation not in RELATIONS:
        raise ValueError(f"unknown relation {check.relation!r}; use one of {', '.join(RELATIONS)}")
    p = check_p(check, comp, delta) if p is None else p
    d = comp.get("diff", math.nan)
    lo2, hi2 = _interval(comp, alpha)
    if not _finite(d, lo2, hi2, delta):
        return INCONCLUSIVE
    significant = math.isfinite(p) and p < alpha
    if check.relation == "not_worse":
        if significant:
            return HOLDS
        if hi2 < -delta:
            return FAILS
        return INCONCLUSIVE
    if -delta < lo2 and hi2 < delta:
        return NO_EFFECT
    sign = 1.0 if check.relation == "greater" else -1.0
    if significant and sign * d > 0:
        return HOLDS
    if significant and sign * d < 0:
        return FAILS
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
    gates: list[dict[str, Any]] = field(default_factory=list)


def _labels_in(study: Mapping[str, Any] | None) -> set[str]:
    """The objective labels a study's results cover (training: ``metrics``; gradients: ``snapshots``)."""
    if not study:
        return set()
    if "metrics" in study:
        return set(study["metrics"])
    snapshots = study.get("snapshots") or []
    return set(snapshots[0]["objectives"]) if snapshots else set()


def baseline_value(results: Mapping[str, Any], study: str, label: str, metric: str) -> float:
    """The baseline's own value of a metric: mean over seeds (training) or over snapshots (gradients)."""
    data = results.get(study) or {}
    if study == "training":
        entry = (data.get("metrics") or {}).get(label, {}).get(metric)
        return float(entry["mean"]) if entry and entry.get("mean") is not None else math.nan
    values = [snap["objectives"][label][metric]["mean"] for snap in data.get("snapshots") or []
              if label in snap["objectives"] and snap["objectives"][label].get(metric)]
    # rule v2 as published: a snapshot where the value is undefined (nan when measured, null once stored) makes
    # the mean undefined; rule v2.1 (lmpo.lab.rules.baseline_interval) leaves such values out
    values = [math.nan if v is None else float(v) for v in values]
    return float(sum(values) / len(values)) if values else math.nan


def sesoi_delta(check: Check, claim: Claim, results: Mapping[str, Any]) -> float:
    """δ of a check: ``fraction · |baseline value of sesoi.of|`` (nan when the baseline has no such value)."""
    s = check.sesoi
    value = baseline_value(results, s.study or check.study, claim.baseline, s.of)
    return s.fraction * abs(value) if math.isfinite(value) else math.nan


def _invalid_runs(claim: Claim, results: Mapping[str, Any]) -> list[str]:
    """Reasons the objective's or the baseline's runs are invalid (divergence, non-finite values)."""
    reasons = []
    training = results.get("training") or {}
    for label in (claim.objective, claim.baseline):
        validity = (training.get("validity") or {}).get(label)
        if validity:
            if validity.get("nonfinite_seeds"):
                reasons.append(f"`{label}` logged non-finite values (seeds {validity['nonfinite_seeds']})")
            if validity.get("diverged_seeds"):
                reasons.append(f"`{label}` diverged: held-out accuracy fell more than {validity['margin']:g} below "
                               f"its start (seeds {validity['diverged_seeds']})")
    gradients = results.get("gradients") or {}
    if any(c.study == "gradients" for c in claim.checks):
        for snap in gradients.get("snapshots") or []:
            for label in (claim.objective, claim.baseline):
                row = snap["objectives"].get(label)
                norm = row.get("grad_norm", {}).get("mean") if row else None
                if row and (norm is None or not math.isfinite(norm)):  # SNR / cosine may be undefined from noise
                    reasons.append(f"`{label}`'s gradient at snapshot {snap['step']} is not finite")
                    break
    return reasons


def _precondition(pre: Precondition, claim: Claim, results: Mapping[str, Any], alpha: float) -> dict[str, Any]:
    training = results.get("training") or {}
    out: dict[str, Any] = {"says": pre.says, "kind": pre.kind, "metric": pre.metric, "relation": pre.relation}
    if pre.kind in ("trend", "flat"):
        comp = (training.get("one_sample") or {}).get(claim.baseline, {}).get(pre.metric)
        if comp is None:
            return {**out, "met": False, "measured": f"no `{pre.metric}` of `{claim.baseline}`"}
        d, p = comp.get("diff", math.nan), comp.get("p", math.nan)
        sign = -1.0 if pre.relation == "less" else 1.0
        moved = _finite(d, p) and p < alpha and sign * d > 0
        measured = f"`{claim.baseline}` {pre.metric} {st_fmt(d)} (p = {st_fmt(p)})"
        if pre.kind == "flat":
            return {**out, **comp, "met": _finite(d) and not moved, "measured": measured}
        if pre.fraction > 0:
            start = baseline_value(results, "training", claim.baseline, pre.relative_to)
            share = d / abs(start) if _finite(d, start) and start != 0 else math.nan
            moved = moved and _finite(share) and sign * share >= pre.fraction
            measured += f", {st_fmt(100 * share)}% of its {pre.relative_to}"
        return {**out, **comp, "met": moved, "measured": measured}
    if pre.kind == "parameter":
        obj = (results.get("objectives") or {}).get(claim.objective, {})
        value = obj.get(pre.parameter)
        base = baseline_value(results, "training", claim.baseline, pre.metric)
        if value is None or not math.isfinite(base):
            return {**out, "met": False, "measured": f"`{claim.objective}`.{pre.parameter} = {value}, "
                                                     f"`{claim.baseline}` {pre.metric} = {st_fmt(base)}"}
        met = float(value) <= base if pre.relation == "at_most" else float(value) >= base
        return {**out, "met": met, "parameter": pre.parameter, "value": float(value), "baseline": base,
                "measured": f"`{claim.objective}`.{pre.parameter} = {st_fmt(float(value))} vs `{claim.baseline}` "
                            f"{pre.metric} = {st_fmt(base)}"}
    raise ValueError(f"unknown precondition kind {pre.kind!r}; use 'trend', 'flat' or 'parameter'")


def activity_value(activity: Activity, claim: Claim, results: Mapping[str, Any]) -> float:
    """The variant's activity measure (see :class:`Activity`); nan when its study does not have it."""
    if activity.study == "gradients":
        gr = results.get("gradients") or {}
        entry = (gr.get("activity") or {}).get(claim.objective, {}).get(claim.baseline)
        return float(entry["mean"]) if entry and entry.get("mean") is not None else math.nan
    return baseline_value(results, "training", claim.objective, activity.metric)


def st_fmt(x: Any) -> str:
    if x is None or (isinstance(x, float) and not math.isfinite(x)):
        return "—"
    x = float(x)
    return f"{x:.3g}"


def unmet_preconditions(claim: Claim, results: Mapping[str, Any], alpha: float, gates: list[dict]) -> list[str]:
    """The reasons of the claim's unmet preconditions; every precondition's record is appended to ``gates``."""
    reasons = []
    for pre in claim.preconditions:
        record = _precondition(pre, claim, results, alpha)
        gates.append({"gate": "precondition", **record})
        if not record["met"]:
            reasons.append(f"precondition unmet: {pre.says} ({record['measured']})")
    return reasons


def _gate(claim: Claim, results: Mapping[str, Any], alpha: float) -> tuple[str | None, str, list[dict]]:
    """``(outcome, reason, gates)``: the outcome a gate imposes (None: testable) and every gate's record."""
    gates: list[dict[str, Any]] = []
    for check in claim.checks:
        study = results.get(check.study)
        if not study:
            return NOT_RUN, f"the {check.study} study was not run", gates
        missing = [x for x in (claim.objective, claim.baseline) if x not in _labels_in(study)]
        if missing:
            return NOT_RUN, f"{' and '.join(f'`{x}`' for x in missing)} not in the {check.study} study", gates
    invalid = _invalid_runs(claim, results) + unmet_preconditions(claim, results, alpha, gates)
    if invalid:
        return INVALID, "; ".join(invalid), gates
    if claim.activity is not None:
        a = claim.activity
        value = activity_value(a, claim, results)
        active = math.isfinite(value) and value >= a.threshold
        gates.append({"gate": "activity", "study": a.study, "metric": a.metric, "says": a.says, "value": value,
                      "threshold": a.threshold, "met": active})
        if not active:
            return NOT_TESTABLE, (f"the mechanism does not act: {a.says} = {st_fmt(value)} < {a.threshold:g}"), gates
    return None, "", gates


def _check_record(check: Check, claim: Claim, results: Mapping[str, Any], *, primary: bool) -> dict[str, Any]:
    comp = (results.get(check.study) or {}).get("comparisons", {}).get(claim.objective, {}).get(
        claim.baseline, {}).get(check.metric)
    delta = sesoi_delta(check, claim, results)
    record: dict[str, Any] = {"says": check.says, "study": check.study, "metric": check.metric,
                              "relation": check.relation, "primary": primary, "sesoi": check.sesoi.describe(),
                              "delta": delta, **(comp or {})}
    record["p_test"] = check_p(check, comp, delta) if comp else math.nan
    if comp and check.relation == "not_worse":  # the one-sided test's power
        record["mde"] = st.minimum_detectable_effect(comp.get("se", math.nan), comp.get("df", 0) or 0, sided=1)
    return record


def judge_all(claims: Sequence[Claim], results: Mapping[str, Any], report: Any) -> list[Verdict]:
    """The verdict of every claim: gates, then Holm's correction across the testable claims' primary checks.

    ``results``: ``{"training": …, "gradients": …, "objectives": {label: Objective.to_dict()}}`` as
    :mod:`lmpo.lab.report` builds them; ``report`` carries ``alpha``."""
    alpha = float(report.alpha)
    verdicts: list[Verdict] = []
    family: list[tuple[Verdict, dict[str, Any]]] = []
    for claim in claims:
        out = Verdict(claim.name, claim.text, claim.source, claim.objective, claim.baseline, NOT_RUN)
        outcome, reason, gates = _gate(claim, results, alpha)
        out.gates = gates
        verdicts.append(out)
        if outcome == NOT_RUN:
            out.reason = reason
            continue
        out.checks = [_check_record(c, claim, results, primary=(i == 0)) for i, c in enumerate(claim.checks)]
        if outcome is None and not math.isfinite(out.checks[0]["delta"]):
            outcome, reason = INVALID, (f"the smallest effect of interest ({claim.primary.sesoi.describe()}) is "
                                        "undefined: the baseline has no such value")
        if outcome is not None:
            out.verdict, out.reason = outcome, reason
            continue
        family.append((out, out.checks[0]))
    adjusted = st.holm([rec["p_test"] for _, rec in family])
    for (_, rec), p_adj in zip(family, adjusted):
        rec["p_holm"] = p_adj
    testable = {id(out) for out, _ in family}
    by_name = {c.name: c for c in claims}
    for out in verdicts:
        claim = by_name[out.claim]
        for rec, check in zip(out.checks, claim.checks):
            # a gated claim's checks are still shown (raw p), but they decide nothing
            p = rec.get("p_holm") if rec["primary"] and id(out) in testable else rec["p_test"]
            rec["verdict"] = judge_check(check, rec, alpha=alpha, delta=rec["delta"], p=p) if "diff" in rec \
                else INCONCLUSIVE
        if id(out) in testable:
            out.verdict = out.checks[0]["verdict"]
    return verdicts


def judge(claim: Claim, results: Mapping[str, Any], report: Any) -> Verdict:
    """One claim alone (a family of one: no multiplicity correction)."""
    return judge_all([claim], results, report)[0]


def _check_text(k: Check) -> str:
    pair = f" `{k.objective}` vs `{k.baseline}`" if k.objective or k.baseline else ""
    return f"{k.study} `{k.metric}`{pair} {k.relation} (δ = {k.sesoi.describe()})"


def claims_table_markdown(registry: Mapping[str, Claim] | None = None) -> str:
    """The claims table of docs/lab.md (generated from ``CLAIMS``, or from ``registry``: rule v2.1's
    ``CLAIMS_V2_1``, whose voting parts and divergence outcome get their own column)."""
    v21 = registry is not None
    registry = CLAIMS if registry is None else registry
    head = "primary check and further parts (all vote; Holm across claims)" if v21 else \
        "primary check (votes; Holm across claims)"
    rows = [f"| claim | source | objective vs baseline | {head} | secondary checks (reported) | gates (before any "
            "verdict) |", "|---|---|---|---|---|---|"]
    for c in registry.values():
        secondary = "; ".join(_check_text(k) for k in c.secondary) or "—"
        gates = [f"precondition: {p.says}" for p in c.preconditions]
        if c.robustness:
            gates.append("the objective's divergence is the outcome (Fisher's exact test), not a gate")
        if c.activity is not None:
            against = f" against `{c.activity.against}`" if c.activity.against else ""
            gates.append(f"activity: {c.activity.says} (`{c.activity.metric}`{against}) ≥ {c.activity.threshold:g}")
        voting = " + ".join(_check_text(k) for k in c.voting)
        rows.append(f"| `{c.name}`: {c.text} | {c.source} | `{c.objective}` vs `{c.baseline}` | "
                    f"{voting} | {secondary} | {'; '.join(gates) or '—'} |")
    return "\n".join(rows) + "\n"


__all__ = ["CLAIMS", "CLAIMS_V2_1", "MATCHED_ABLATIONS", "RECIPE_ARMS", "REFUSED", "STEPS", "FAILS", "HOLDS", "INCONCLUSIVE", "INVALID", "NOT_RUN", "NOT_TESTABLE", "NO_EFFECT", "OUTCOMES",
           "RELATIONS", "Activity", "Check", "Claim", "Precondition", "Sesoi", "Verdict", "activity_value",
           "baseline_value", "check_p", "claims_table_markdown", "judge", "judge_all", "judge_check", "sesoi_delta"]
