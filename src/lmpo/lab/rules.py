"""The verdict rules of the lab: ``v2`` (:mod:`lmpo.lab.claims`, the rule the published v2 labs were judged by) and
``v2.1``, which judges the same six outcomes (and one more) without the ways v2 misled a reader.

``report.rule`` (``lmpo lab … --rule v2.1``) chooses one; it is recorded in ``lab.json``. ``v2`` stays the default
so that a stored lab is rebuilt with the rule it was published under (``lmpo.lab.report.rejudge`` rebuilds the
verdicts of a stored ``lab.json`` under either rule).

**Rule v2.1** keeps rule v2's gates, equivalence and non-inferiority tests and Holm's correction, and changes:

1. **Matched ablations.** Each claim's baseline equals its objective in everything but the mechanism, aggregation
   and clip included (``lmpo.lab.claims.MATCHED_ABLATIONS``, ``CLAIMS_V2_1``): AMIC against GSPO (the same
   sequence clip) and, as a second part, AMIC's weight without its clip against GRPO without its clip; GMPO against
   ``grpo_noclip``; CISPO and the token_mean entropy methods against GRPO with token_mean. The gradient activity gate
   compares the gradient weights with that matched ablation (``Activity.against``), so aggregation is not counted as
   the mechanism acting. An activity that was not measured against it makes the claim **not run**.
2. **The training run is the replicate** of a gradient check: each (reference run, off-policy point, snapshot)
   group gives the estimator's statistic, groups are averaged within their reference run, and the paired
   difference gets a t interval over the runs (df = runs − 1: a cluster-robust interval; ≥ 8 reference runs give
   it ≥ 7 degrees of freedom). A group where a statistic is undefined is **not** left out (that selects groups on
   the outcome): the comparison is then undefined, and so is its verdict.
3. **Every part of a claim votes.** A claim that makes several (``Claim.parts``: "stops entropy collapse *while
   keeping accuracy*") holds only when every part holds; it does not hold when one part does not hold; it has no
   material effect when a part shows none. Every part enters Holm's family. A non-inferiority part that is not
   shown, with power below 0.8 at δ (``(1 − F_t(t_{1−α} − δ/se))``), makes the claim **cannot be decided at this
   budget** instead of inconclusive.
4. **δ in the metric compared, with its uncertainty.** "Faster" is fewer RL steps to a reward threshold
   (``reward_steps``) with δ a share of the baseline's own steps. δ = fraction × |baseline value| carries that value's
   t interval: equivalence and non-inferiority use the smaller end (δ_lo), "does not hold" for non-inferiority the
   larger (δ_hi), so an uncertain δ never makes a verdict easier. δ never comes from a non-finite value.
5. **The divergence gate is scoped** to the runs a claim's voting checks use (a gradient claim does not use its
   objective's training runs); for a robustness claim (``Claim.robustness``) divergence is the outcome: the seeds
   that diverged, objective against baseline, by Fisher's exact test in Holm's family.
6. **An endpoint the task fixes is not testable**: when the baseline's primary training metric varies over its seeds
   by less than a tenth of δ (standard deviation), no mechanism moves it on this task.
7. **Claims on the compute–performance fit.** A check of study ``fits`` compares the fitted ceiling ``a`` or
   efficiency ``b`` (``lmpo.lab.fits``) paired over seeds; a seed whose fit did not converge leaves it undefined.
   Relation ``equivalent`` states "no change" (ScaleRL's "changes B, not A"): the two one-sided tests against ±δ,
   with the same power rule as non-inferiority.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

from lmpo.lab import stats as st
from lmpo.lab.claims import (
    CLAIMS,
    CLAIMS_V2_1,
    FAILS,
    HOLDS,
    INCONCLUSIVE,
    INVALID,
    NO_EFFECT,
    NOT_RUN,
    NOT_TESTABLE,
    Check,
    Claim,
    Verdict,
    _interval,
    _labels_in,
    judge_all,
    st_fmt,
    unmet_preconditions,
)

RULES = ("v2", "v2.1")
DEFAULT_RULE = "v2"
UNDECIDABLE = "cannot be decided at this budget"
"""Rule v2.1's seventh outcome: a non-inferiority part the run is too small to show (power < ``NI_POWER``)."""
NI_POWER = 0.8
ENDPOINT_SD_FRACTION = 0.1
"""Rule v2.1, item 6: an endpoint whose baseline spread over seeds is below this share of δ is fixed by the task."""


def registry(rule: str) -> Mapping[str, Claim]:
    """The claims a rule judges (v2: ``CLAIMS``; v2.1: ``CLAIMS_V2_1``)."""
    if rule not in RULES:
        raise ValueError(f"unknown verdict rule {rule!r}; use one of {', '.join(RULES)}")
    return CLAIMS if rule == "v2" else CLAIMS_V2_1


def claims_for(rule: str, names: Sequence[str] = ()) -> list[Claim]:
    """The claims of ``rule``'s registry named in ``names`` (every claim when empty)."""
    reg = registry(rule)
    return [reg[n] for n in names] if names else list(reg.values())


def judge_rule(rule: str, claims: Sequence[Claim], results: Mapping[str, Any], report: Any) -> list[Verdict]:
    """The verdicts of ``claims`` under ``rule``."""
    registry(rule)
    return judge_all(claims, results, report) if rule == "v2" else judge_all_v21(claims, results, report)


# ----------------------------------------------------------------------------------------------------
# Statistics of rule v2.1
# ----------------------------------------------------------------------------------------------------


def fisher_exact(k1: int, n1: int, k2: int, n2: int) -> float:
    """Two-sided p of Fisher's exact test for k1 of n1 against k2 of n2: the probability, with the margins fixed,
    of a table at most as likely as the one observed (hypergeometric). 3 of 3 against 0 of 16: 1/969."""
    k, n = k1 + k2, n1 + n2
    if n1 == 0 or n2 == 0:
        return math.nan

    def prob(x: int) -> float:
        return math.comb(n1, x) * math.comb(n2, k - x) / math.comb(n, k)

    observed = prob(k1)
    return min(1.0, sum(prob(x) for x in range(max(0, k - n2), min(k, n1) + 1) if prob(x) <= observed * (1 + 1e-9)))


def _groups(gradients: Mapping[str, Any], label: str, metric: str) -> list[tuple[Any, float]]:
    """``(reference run, value)`` per group of the gradient study (nan where the statistic is undefined)."""
    out = []
    for snap in gradients.get("snapshots") or []:
        row = (snap.get("objectives") or {}).get(label)
        if row is None:
            return []
        value = (row.get(metric) or {}).get("mean")
        out.append((snap.get("reference_seed"), math.nan if value is None else float(value)))
    return out


def _by_run(pairs: list[tuple[Any, float]]) -> list[float]:
    runs: dict[Any, list[float]] = {}
    for run, value in pairs:
        runs.setdefault(run, []).append(value)
    return [sum(v) / len(v) for _, v in sorted(runs.items(), key=lambda kv: str(kv[0]))]


def cluster_comparison(gradients: Mapping[str, Any], objective: str, baseline: str, metric: str, *,
                       confidence: float = 0.95, alpha: float = 0.05, power: float = 0.8) -> dict[str, Any]:
    """Paired difference of a gradient statistic with the training run as the replicate (rule v2.1, item 2).

    Per group g: ``d_g = a_g − b_g`` (each estimator's statistic on the same batches); per reference run r the mean
    ``D_r`` of its groups; ``diff``, ``ci``, ``se``, ``df = runs − 1``, ``p`` and ``mde`` from the t interval of the
    ``D_r``. Undefined in any group → the whole comparison is undefined (``groups_undefined`` counts them)."""
    a, b = _groups(gradients, objective, metric), _groups(gradients, baseline, metric)
    if not a or len(a) != len(b):
        return {}
    pairs = [(run, va - vb) for (run, va), (_, vb) in zip(a, b)]
    undefined = sum(not math.isfinite(d) for _, d in pairs)
    runs = _by_run(pairs)
    base = {"groups": len(pairs), "groups_undefined": undefined, "runs": len(runs), "replicate": "reference run"}
    if undefined:
        return {**base, "diff": math.nan, "ci": [math.nan, math.nan], "se": math.nan, "df": 0, "n": len(runs),
                "p": math.nan, "mde": math.nan}
    return {**base, **st.paired_comparison(runs, [0.0] * len(runs), confidence=confidence, alpha=alpha, power=power)}


def _fits_of(results: Mapping[str, Any], label: str) -> dict[str, Any]:
    return ((((results.get("training") or {}).get("fits") or {}).get("objectives") or {}).get(label) or {}).get(
        "fits") or {}


def fit_comparison(results: Mapping[str, Any], objective: str, baseline: str, metric: str, *,
                   confidence: float = 0.95, alpha: float = 0.05, power: float = 0.8) -> dict[str, Any]:
    """Paired difference of a fitted parameter (``a``: the ceiling, ``b``: the efficiency) over the seeds both
    objectives ran (``lmpo.lab.fits``). A common seed whose fit did not converge on either side leaves the
    comparison undefined (``seeds_unfit``): leaving it out would select seeds on the outcome."""
    a, b = _fits_of(results, objective), _fits_of(results, baseline)
    common = sorted(set(a) & set(b), key=str)
    if not common:
        return {}
    unfit = [s for s in common if a[s].get("status") != "converged" or b[s].get("status") != "converged"]
    base = {"seeds": len(common), "seeds_unfit": len(unfit), "replicate": "seed"}
    if unfit:
        return {**base, "diff": math.nan, "ci": [math.nan, math.nan], "se": math.nan, "df": 0, "n": len(common),
                "p": math.nan, "mde": math.nan}
    return {**base, **st.paired_comparison([float(a[s][metric]) for s in common], [float(b[s][metric]) for s in common],
                                           confidence=confidence, alpha=alpha, power=power)}


def baseline_interval(results: Mapping[str, Any], study: str, label: str, metric: str,
                      confidence: float = 0.95) -> tuple[float, list[float], int]:
    """The baseline's own value of ``metric`` with its t interval: ``(mean, ci, dropped)``. Training: over its seeds;
    gradients: over its reference runs (each the mean of its groups). Non-finite values never enter (``dropped``
    counts them), so δ is never nan while any value is finite."""
    if study == "fits":  # "a_gain": the fitted ceiling's RL gain A − R0; otherwise the fitted parameter
        fits = [f for f in _fits_of(results, label).values() if f.get("status") == "converged"]
        entry = {}
        values = [f["a"] - f["r0"] if metric == "a_gain" else f[metric] for f in fits]
    elif study == "training":
        entry = ((results.get("training") or {}).get("metrics") or {}).get(label, {}).get(metric) or {}
        values = [v for v in entry.get("values") or [] if v is not None]
    else:
        pairs = _groups(results.get("gradients") or {}, label, metric)
        finite = [(r, v) for r, v in pairs if math.isfinite(v)]
        values, dropped = _by_run(finite), len(pairs) - len(finite)
        ti = st.t_interval(values, confidence=confidence) if values else {"mean": math.nan, "ci": [math.nan] * 2}
        return ti["mean"], ti["ci"], dropped
    finite = [float(v) for v in values if math.isfinite(float(v))]
    if not finite:
        mean = entry.get("mean")
        return (math.nan if mean is None else float(mean)), [math.nan, math.nan], len(values)
    ti = st.t_interval(finite, confidence=confidence)
    return ti["mean"], ti["ci"], len(values) - len(finite)


def delta_bounds(fraction: float, mean: float, ci: Sequence[float]) -> tuple[float, float, float]:
    """``(δ, δ_lo, δ_hi)``: fraction × |mean| and fraction × the ends of |interval| nearest to and farthest from 0
    (δ_lo = 0 when the interval holds 0; both = δ when there is no interval)."""
    if not (mean is not None and math.isfinite(mean)):
        return (math.nan, math.nan, math.nan)
    delta = fraction * abs(mean)
    lo, hi = (ci or [math.nan, math.nan])[:2]
    if not (lo is not None and hi is not None and math.isfinite(lo) and math.isfinite(hi)):
        return (delta, delta, delta)
    near = 0.0 if lo <= 0.0 <= hi else min(abs(lo), abs(hi))
    return (delta, fraction * near, fraction * max(abs(lo), abs(hi)))


def ni_power(se: float, df: float, delta: float, alpha: float) -> float:
    """Power of the one-sided non-inferiority test at a true difference of 0: ``P(T ≥ t_{1−α,df} − δ/se)``."""
    if not (math.isfinite(se) and math.isfinite(delta) and df >= 1) or se <= 0:
        return math.nan
    return st.student_t_sf(st.student_t_ppf(1.0 - alpha, df) - delta / se, df)


def tost_power(se: float, df: float, delta: float, alpha: float) -> float:
    """Power of the equivalence test (two one-sided tests, margin ±δ) at a true difference of 0:
    ``1 − 2·P(T ≥ δ/se − t_{1−α,df})``, at least 0."""
    if not (math.isfinite(se) and math.isfinite(delta) and df >= 1) or se <= 0:
        return math.nan
    return max(0.0, 1.0 - 2.0 * st.student_t_sf(delta / se - st.student_t_ppf(1.0 - alpha, df), df))


def judge_part(check: Check, comp: Mapping[str, Any], *, alpha: float, delta_lo: float, delta_hi: float,
               p: float) -> str:
    """One part under rule v2.1: rule v2's tests (``lmpo.lab.claims.judge_check``) with δ's uncertainty carried —
    equivalence and non-inferiority against δ_lo, "does not hold" for non-inferiority against δ_hi. Relation
    ``equivalent`` (a claim of no change, e.g. "B but not A"): holds when the TOST p (``p``) is below α and the
    (1 − 2α) interval lies inside ±δ_lo; does not hold when that interval lies outside ±δ_hi."""
    d = comp.get("diff", math.nan)
    lo2, hi2 = _interval(comp, alpha)
    finite = all(x is not None and math.isfinite(x) for x in (d, lo2, hi2, delta_lo, delta_hi))
    if not finite:
        return INCONCLUSIVE
    significant = p is not None and math.isfinite(p) and p < alpha
    if check.relation == "not_worse":
        return HOLDS if significant else FAILS if hi2 < -delta_hi else INCONCLUSIVE
    if check.relation == "equivalent":  # the claim is "no change": the (1 − 2α) interval inside ±δ_lo holds
        if significant and delta_lo > 0 and -delta_lo < lo2 and hi2 < delta_lo:
            return HOLDS
        return FAILS if lo2 > delta_hi or hi2 < -delta_hi else INCONCLUSIVE
    if delta_lo > 0 and -delta_lo < lo2 and hi2 < delta_lo:
        return NO_EFFECT
    sign = 1.0 if check.relation == "greater" else -1.0
    if significant:
        return HOLDS if sign * d > 0 else FAILS if sign * d < 0 else INCONCLUSIVE
    return INCONCLUSIVE


# ----------------------------------------------------------------------------------------------------
# Rule v2.1
# ----------------------------------------------------------------------------------------------------


def _pair(check: Check, claim: Claim) -> tuple[str, str]:
    return check.objective or claim.objective, check.baseline or claim.baseline


def _missing(check: Check, claim: Claim, results: Mapping[str, Any]) -> str:
    study = (results.get("training") or {}).get("fits") if check.study == "fits" else results.get(check.study)
    if not study:
        return f"the {check.study} study was not run"
    labels = set(study.get("objectives") or {}) if check.study == "fits" else _labels_in(study)
    missing = [x for x in _pair(check, claim) if x not in labels]
    return f"{' and '.join(f'`{x}`' for x in missing)} not in the {check.study} study" if missing else ""


def _record(check: Check, claim: Claim, results: Mapping[str, Any], rp: Any, *, primary: bool,
            votes: bool) -> dict[str, Any]:
    obj, base = _pair(check, claim)
    rec: dict[str, Any] = {"says": check.says, "study": check.study, "metric": check.metric,
                           "relation": check.relation, "primary": primary, "votes": votes, "objective": obj,
                           "baseline": base, "sesoi": check.sesoi.describe()}
    missing = _missing(check, claim, results)
    if missing:
        return {**rec, "not_run": missing}
    conf, alpha, power = float(getattr(rp, "confidence", 0.95)), float(rp.alpha), float(getattr(rp, "power", 0.8))
    s = check.sesoi
    mean, ci, dropped = baseline_interval(results, s.study or check.study, base, s.of, conf)
    rec["delta"], rec["delta_lo"], rec["delta_hi"] = delta_bounds(s.fraction, mean, ci)
    rec["delta_dropped"] = dropped
    if check.study == "gradients":
        comp = cluster_comparison(results["gradients"], obj, base, check.metric, confidence=conf, alpha=alpha,
                                  power=power)
    elif check.study == "fits":
        comp = fit_comparison(results, obj, base, check.metric, confidence=conf, alpha=alpha, power=power)
    else:
        comp = (results["training"].get("comparisons") or {}).get(obj, {}).get(base, {}).get(check.metric) or {}
    rec.update(comp)
    if not comp:
        return {**rec, "not_run": f"no `{check.metric}` comparison of `{obj}` with `{base}`"}
    rec["p_test"] = _p(check, comp, rec["delta_lo"])
    se, df = comp.get("se", math.nan), comp.get("df", 0) or 0
    if check.relation == "not_worse":
        rec["mde"] = st.minimum_detectable_effect(se, df, alpha=alpha, power=power, sided=1)
        rec["power"] = ni_power(se, df, rec["delta_lo"], alpha)
    elif check.relation == "equivalent":
        rec["power"] = tost_power(se, df, rec["delta_lo"], alpha)
    return rec


def _p(check: Check, comp: Mapping[str, Any], delta: float) -> float:
    """The p entering Holm's family: two-sided for greater / less, one-sided of d > −δ for non-inferiority, the
    larger of the two one-sided p (d > −δ, d < δ) for equivalence."""
    d, se, df = comp.get("diff", math.nan), comp.get("se", math.nan), comp.get("df", 0) or 0
    if check.relation in ("not_worse", "equivalent"):
        if not math.isfinite(delta):
            return math.nan
        lower = st.one_sided_p(d, se, df, shift=-delta, upper=True)
        return lower if check.relation == "not_worse" else max(lower, st.one_sided_p(d, se, df, shift=delta,
                                                                                     upper=False))
    p = comp.get("p")
    return math.nan if p is None else float(p)


def _runs_used(claim: Claim) -> set[str]:
    """The labels whose training runs a claim's voting checks use (rule v2.1, item 5)."""
    return {label for c in claim.voting if c.study in ("training", "fits") for label in _pair(c, claim)}


def _divergence(claim: Claim, results: Mapping[str, Any], alpha: float) -> dict[str, Any] | None:
    """A robustness claim's outcome record when its objective or baseline diverged on some seed (else None)."""
    training = results.get("training") or {}
    validity, metrics = training.get("validity") or {}, training.get("metrics") or {}
    counts = {}
    for label in (claim.objective, claim.baseline):
        seeds = (metrics.get(label) or {}).get("seeds") or []
        counts[label] = (len((validity.get(label) or {}).get("diverged_seeds") or []), len(seeds))
    (k1, n1), (k2, n2) = counts[claim.objective], counts[claim.baseline]
    if k1 + k2 == 0 or not n1 or not n2:
        return None
    diff = k1 / n1 - k2 / n2
    return {"says": "diverges on fewer seeds than the baseline (divergence is the outcome of a robustness claim)",
            "study": "training", "metric": "diverged", "relation": "less", "primary": True, "votes": True,
            "objective": claim.objective, "baseline": claim.baseline, "sesoi": "—", "diff": diff,
            "diverged": {claim.objective: [k1, n1], claim.baseline: [k2, n2]}, "ci": [math.nan, math.nan],
            "p_test": fisher_exact(k1, n1, k2, n2), "test": "Fisher's exact test (two-sided)"}


def _gate_v21(claim: Claim, results: Mapping[str, Any], rp: Any) -> tuple[str | None, str, list[dict]]:
    alpha = float(rp.alpha)
    gates: list[dict[str, Any]] = []
    reasons = []
    training = results.get("training") or {}
    for label in sorted(_runs_used(claim)):
        validity = (training.get("validity") or {}).get(label) or {}
        if validity.get("nonfinite_seeds"):
            reasons.append(f"`{label}` logged non-finite values (seeds {validity['nonfinite_seeds']})")
        if validity.get("diverged_seeds") and not (claim.robustness and label == claim.objective):
            reasons.append(f"`{label}` diverged: held-out accuracy fell more than {validity['margin']:g} below its "
                           f"start (seeds {validity['diverged_seeds']})")
    gradient_labels = {x for c in claim.voting if c.study == "gradients" for x in _pair(c, claim)}
    for snap in (results.get("gradients") or {}).get("snapshots") or [] if gradient_labels else []:
        bad = [x for x in sorted(gradient_labels) if x in snap["objectives"]
               and not _finite_num((snap["objectives"][x].get("grad_norm") or {}).get("mean"))]
        if bad:
            reasons.append(f"`{bad[0]}`'s gradient at snapshot {snap['step']} is not finite")
            break
    reasons += unmet_preconditions(claim, results, alpha, gates)
    if reasons:
        return INVALID, "; ".join(reasons), gates
    a = claim.activity
    if a is not None:
        against = a.against or claim.baseline
        if a.study == "gradients":
            entry = ((results.get("gradients") or {}).get("activity") or {}).get(claim.objective, {}).get(against)
            if not entry or entry.get("mean") is None:
                return NOT_RUN, (f"the activity of `{claim.objective}` against its matched ablation `{against}` "
                                 f"(`{a.metric}`) was not measured"), gates
            value = float(entry["mean"])
        else:
            entry = (training.get("metrics") or {}).get(claim.objective, {}).get(a.metric) or {}
            value = math.nan if entry.get("mean") is None else float(entry["mean"])
        active = math.isfinite(value) and value >= a.threshold
        gates.append({"gate": "activity", "study": a.study, "metric": a.metric, "says": a.says, "against": against,
                      "value": value, "threshold": a.threshold, "met": active})
        if not active:
            return NOT_TESTABLE, f"the mechanism does not act: {a.says} = {st_fmt(value)} < {a.threshold:g}", gates
    return None, "", gates


def _finite_num(x: Any) -> bool:
    return x is not None and math.isfinite(float(x))


def _endpoint_fixed(claim: Claim, rec: dict[str, Any], results: Mapping[str, Any]) -> str:
    """Item 6: the reason the primary training endpoint cannot move on this task ("" when it can)."""
    if claim.primary.study != "training" or not _finite_num(rec.get("delta")):
        return ""
    entry = ((results.get("training") or {}).get("metrics") or {}).get(rec["baseline"], {}).get(
        claim.primary.metric) or {}
    values = [float(v) for v in entry.get("values") or [] if _finite_num(v)]
    if len(values) < 2:
        return ""
    mean = sum(values) / len(values)
    sd = math.sqrt(sum((v - mean) ** 2 for v in values) / (len(values) - 1))
    if sd < ENDPOINT_SD_FRACTION * rec["delta"]:
        return (f"the endpoint does not move on this task: `{rec['baseline']}`'s {claim.primary.metric} varies by "
                f"{st_fmt(sd)} (sd over seeds) against δ = {st_fmt(rec['delta'])}")
    return ""


def _combine(parts: list[dict[str, Any]], alpha: float) -> tuple[str, str]:
    """The claim's outcome from its voting parts (rule v2.1, item 3) and the reason when it is not plain."""
    calls = [p["verdict"] for p in parts]
    named = [f"{p['says']}: {p['verdict']}" for p in parts]
    if FAILS in calls:
        return FAILS, ("; ".join(named) if len(parts) > 1 else "")
    if NO_EFFECT in calls:
        return NO_EFFECT, ("; ".join(named) if len(parts) > 1 else "")
    if all(c == HOLDS for c in calls):
        return HOLDS, ""
    if NOT_RUN in calls:
        return NOT_RUN, "; ".join(f"{p['says']}: not run ({p['not_run']})" if p["verdict"] == NOT_RUN
                                  else f"{p['says']}: {p['verdict']}" for p in parts)
    weak = [p for p in parts if p["relation"] in ("not_worse", "equivalent") and p["verdict"] != HOLDS
            and _finite_num(p.get("power")) and p["power"] < NI_POWER]
    if weak:
        p = weak[0]
        others = f"; {'; '.join(named)}" if len(parts) > 1 else ""
        return UNDECIDABLE, (f"{p['says']}: power {p['power']:.2f} < {NI_POWER:g} at δ = {st_fmt(p['delta_lo'])} "
                             f"(MDE {st_fmt(p.get('mde'))}){others}")
    return INCONCLUSIVE, ("; ".join(named) if len(parts) > 1 else "")


def judge_all_v21(claims: Sequence[Claim], results: Mapping[str, Any], report: Any) -> list[Verdict]:
    """Rule v2.1 (module docstring) on the studies ``results`` (as :func:`lmpo.lab.claims.judge_all` takes them)."""
    alpha = float(report.alpha)
    verdicts: list[Verdict] = []
    family: list[dict[str, Any]] = []
    voting: dict[int, list[dict[str, Any]]] = {}
    for claim in claims:
        out = Verdict(claim.name, claim.text, claim.source, claim.objective, claim.baseline, NOT_RUN)
        verdicts.append(out)
        missing = _missing(claim.primary, claim, results)
        if missing:
            out.reason = missing
            continue
        outcome, reason, out.gates = _gate_v21(claim, results, report)
        n_vote = len(claim.voting)
        out.checks = [_record(c, claim, results, report, primary=(i == 0), votes=(i < n_vote))
                      for i, c in enumerate(claim.checks)]
        parts = out.checks[:n_vote]
        if outcome is None and claim.robustness:
            diverged = _divergence(claim, results, alpha)
            if diverged is not None:  # divergence decides; the primary check is still shown
                for rec in out.checks:
                    rec["primary"] = rec["votes"] = False
                out.checks.insert(0, diverged)
                parts = [diverged]
        if outcome is None and "not_run" not in parts[0]:
            if not _finite_num(parts[0].get("delta")) and parts[0]["metric"] != "diverged":
                outcome, reason = INVALID, (f"the smallest effect of interest ({claim.primary.sesoi.describe()}) "
                                            "is undefined: the baseline has no such value")
            else:
                reason = _endpoint_fixed(claim, parts[0], results)
                outcome = NOT_TESTABLE if reason else None
        if outcome is not None:
            out.verdict, out.reason = outcome, reason
            continue
        voting[id(out)] = parts
        family += [p for p in parts if "not_run" not in p]
    for rec, p_adj in zip(family, st.holm([rec["p_test"] for rec in family])):
        rec["p_holm"] = p_adj
    by_name = {c.name: c for c in claims}
    for out in verdicts:
        claim = by_name[out.claim]
        checks = {id(r): c for r, c in zip([r for r in out.checks if r.get("metric") != "diverged"], claim.checks)}
        for rec in out.checks:
            if "not_run" in rec:
                rec["verdict"] = NOT_RUN
            elif rec.get("metric") == "diverged":
                rec["verdict"] = _divergence_call(rec, alpha)
            elif "diff" in rec:
                p = rec.get("p_holm", rec["p_test"])
                rec["verdict"] = judge_part(checks[id(rec)], rec, alpha=alpha, delta_lo=rec["delta_lo"],
                                            delta_hi=rec["delta_hi"], p=p)
            else:
                rec["verdict"] = INCONCLUSIVE
        if id(out) in voting:
            out.verdict, out.reason = _combine(voting[id(out)], alpha)
    return verdicts


def _divergence_call(rec: dict[str, Any], alpha: float) -> str:
    p = rec.get("p_holm", rec["p_test"])
    if not (_finite_num(p) and p < alpha):
        return INCONCLUSIVE
    return FAILS if rec["diff"] > 0 else HOLDS


def stored_results(report: Mapping[str, Any], task: str) -> dict[str, Any]:
    """The studies of one task of a stored ``lab.json`` as the verdict rules take them."""
    data = report["tasks"][task]
    return {"training": data.get("training"), "gradients": data.get("gradients"),
            "objectives": {label: o["objective"] for label, o in (report.get("objectives") or {}).items()}}


__all__ = ["DEFAULT_RULE", "ENDPOINT_SD_FRACTION", "NI_POWER", "RULES", "UNDECIDABLE", "baseline_interval",
           "claims_for", "cluster_comparison", "delta_bounds", "fisher_exact", "fit_comparison", "judge_all_v21",
           "judge_part", "judge_rule", "ni_power", "registry", "stored_results", "tost_power"]
