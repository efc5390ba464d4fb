"""The statistics of the lab: t intervals, the paired t-test, Holm's correction, power, curve summaries, gradient SNR.

Everything here is a pure function of plain numbers (numpy arrays), seeded where it resamples, so a report
rebuilt from the same cell results gives the same numbers.

- :func:`t_interval`, :func:`paired_comparison` — the mean (of paired differences) with its Student-t interval,
  the paired t-test and the minimum detectable effect at 80% power (:func:`minimum_detectable_effect`); the verdict
  rule uses these everywhere (a percentile bootstrap over five seeds covers about 83% at a nominal 95%;
  :func:`bootstrap_ci` stays for other statistics);
- :func:`holm` — Holm's step-down adjustment across the claims' primary checks; :func:`one_sided_p` — the
  one-sided t-test of non-inferiority;
- :func:`paired_t_test` — two-sided paired t-test p-value, with the Student-t tail computed here
  (:func:`student_t_sf`, through the regularised incomplete beta function) so that no SciPy is needed;
- :func:`window_trajectory` — start / minimum / end of a noisy per-step curve (windowed means);
- :func:`gram_snr` and :func:`gram_cosine` — gradient signal-to-noise ratio and the cosine of the mean gradient
  to a reference direction, from the Gram matrix of R gradient samples (so that leaving batches out costs
  R×R arithmetic, not R gradient vectors), with delete-one jackknife intervals (:func:`jackknife_interval`,
  :func:`paired_jackknife_difference`).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

Interval = tuple[float, float]


def fmt(x, digits: int = 3) -> str:
    """A number for the report's tables: "—" for None or non-finite, scientific below 10^-digits or from 10^4."""
    if x is None or (isinstance(x, float) and not math.isfinite(x)):
        return "—"
    if isinstance(x, float) and x != 0 and (abs(x) < 10 ** -digits or abs(x) >= 10 ** 4):
        return f"{x:.{digits - 1}e}"
    return f"{x:.{digits}f}" if isinstance(x, float) else str(x)


def _array(values: Sequence[float] | np.ndarray) -> np.ndarray:
    return np.asarray(values, dtype=np.float64).reshape(-1)


def bootstrap_ci(values: Sequence[float] | np.ndarray, *, confidence: float = 0.95, resamples: int = 10_000,
                 seed: int = 0, statistic: Callable[[np.ndarray], np.ndarray] | None = None) -> Interval:
    """Percentile bootstrap interval of ``statistic`` (default: the mean) over ``values``.

    Draws ``resamples`` samples of size n with replacement (``numpy.random.default_rng(seed)``) and returns
    the ``(1 − confidence)/2`` and ``(1 + confidence)/2`` quantiles of the statistic. ``statistic`` maps a
    (resamples, n) array to (resamples,). A constant sample gives a point ``(v, v)``; fewer than two values
    give ``(nan, nan)`` (one value says nothing about its spread).
    """
    x = _array(values)
    if x.size < 2 or not np.all(np.isfinite(x)):
        return (math.nan, math.nan)
    stat = statistic or (lambda a: a.mean(axis=1))
    rng = np.random.default_rng(seed)
    idx = rng.integers(0, x.size, size=(resamples, x.size))
    dist = stat(x[idx])
    tail = (1.0 - confidence) / 2.0
    lo, hi = np.quantile(dist, [tail, 1.0 - tail])
    if np.all(x == x[0]):  # every resample is the same multiset: one value, not two rounded quantiles
        lo = hi = float(dist[0])
    return (float(lo), float(hi))


def _betacf(a: float, b: float, x: float) -> float:
    """Continued fraction of the incomplete beta function (modified Lentz; Numerical Recipes §6.4)."""
    tiny, eps = 1e-300, 1e-15
    qab, qap, qam = a + b, a + 1.0, a - 1.0
    c, d = 1.0, 1.0 - qab * x / qap
    d = 1.0 / (d if abs(d) > tiny else tiny)
    h = d
    for m in range(1, 1000):
        m2 = 2 * m
        aa = m * (b - m) * x / ((qam + m2) * (a + m2))
        d = 1.0 + aa * d
        d = 1.0 / (d if abs(d) > tiny else tiny)
        c = 1.0 + aa / c
        c = c if abs(c) > tiny else tiny
        h *= d * c
        aa = -(a + m) * (qab + m) * x / ((a + m2) * (qap + m2))
        d = 1.0 + aa * d
        d = 1.0 / (d if abs(d) > tiny else tiny)
        c = 1.0 + aa / c
        c = c if abs(c) > tiny else tiny
        delta = d * c
        h *= delta
        if abs(delta - 1.0) < eps:
            break
    return h


def betainc(a: float, b: float, x: float) -> float:
    """Regularised incomplete beta function I_x(a, b) for a, b > 0 and 0 ≤ x ≤ 1."""
    if x <= 0.0:
        return 0.0
    if x >= 1.0:
        return 1.0
    log_front = math.lgamma(a + b) - math.lgamma(a) - math.lgamma(b) + a * math.log(x) + b * math.log1p(-x)
    if x < (a + 1.0) / (a + b + 2.0):
        return math.exp(log_front) * _betacf(a, b, x) / a
    return 1.0 - math.exp(log_front) * _betacf(b, a, 1.0 - x) / b


def student_t_sf2(t: float, df: float) -> float:
    """Two-sided tail probability P(|T| ≥ |t|) of Student's t with ``df`` degrees of freedom:
    ``I_{df/(df+t²)}(df/2, 1/2)``."""
    if math.isinf(t):
        return 0.0
    return betainc(df / 2.0, 0.5, df / (df + t * t))


def student_t_sf(t: float, df: float) -> float:
    """Upper tail P(T ≥ t) of Student's t with ``df`` degrees of freedom."""
    half = 0.5 * student_t_sf2(t, df)
    return half if t >= 0 else 1.0 - half


def paired_t_test(a: Sequence[float] | np.ndarray, b: Sequence[float] | np.ndarray) -> float:
    """Two-sided p-value of the paired t-test of mean(a − b) = 0 (pairs: the same seed or the same batch).

    Identical samples give p = 1; differences that are all equal and non-zero (an exact shift) give p = 0;
    fewer than two pairs give nan.
    """
    d = _array(a) - _array(b)
    if d.size < 2 or not np.all(np.isfinite(d)):
        return math.nan
    mean = float(d.mean())
    sd = float(d.std(ddof=1))
    if sd == 0.0:
        return 1.0 if mean == 0.0 else 0.0
    t = mean / (sd / math.sqrt(d.size))
    return student_t_sf2(t, d.size - 1)


def student_t_ppf(q: float, df: float) -> float:
    """Quantile of Student's t: the t with ``P(T ≤ t) = q`` (``0 < q < 1``), from :func:`student_t_quantile`."""
    if q == 0.5:
        return 0.0
    t = student_t_quantile(2.0 * min(q, 1.0 - q), df)
    return t if q > 0.5 else -t


def minimum_detectable_effect(se: float, df: float, *, alpha: float = 0.05, power: float = 0.8,
                              sided: int = 2) -> float:
    """Smallest true difference a t-test at level ``alpha`` detects with probability ``power``.

    ``(t_{1−α/s, df} + t_{power, df}) · se`` with s = ``sided`` (2: a two-sided test, 1: a one-sided one, such as
    non-inferiority): the usual normal-shift approximation of the non-central t, written with t quantiles so that
    it stays honest for few seeds. nan when ``se`` or ``df`` is not usable.
    """
    if not (math.isfinite(se) and df >= 1):
        return math.nan
    return (student_t_ppf(1.0 - alpha / sided, df) + student_t_ppf(power, df)) * se


def t_interval(values: Sequence[float] | np.ndarray, *, confidence: float = 0.95) -> dict[str, float | list[float]]:
    """``{"mean", "ci", "se", "df", "n"}``: the mean ± ``t_{(1+confidence)/2, n−1}`` · s/√n.

    The interval of the mean that holds its level for a handful of seeds (a percentile bootstrap over five
    values covers about 83% at a nominal 95%). A constant sample gives a point; fewer than two values, nan."""
    x = _array(values)
    n = int(x.size)
    if n < 2 or not np.all(np.isfinite(x)):
        mean = float(x.mean()) if n and np.all(np.isfinite(x)) else math.nan
        return {"mean": mean, "ci": [math.nan, math.nan], "se": math.nan, "df": max(n - 1, 0), "n": n}
    if np.all(x == x[0]):  # an exact constant: a point, not a rounding-error interval
        return {"mean": float(x[0]), "ci": [float(x[0]), float(x[0])], "se": 0.0, "df": n - 1, "n": n}
    mean, se = float(x.mean()), float(x.std(ddof=1)) / math.sqrt(n)
    half = student_t_quantile(1.0 - confidence, n - 1) * se if se > 0 else 0.0
    return {"mean": mean, "ci": [mean - half, mean + half], "se": se, "df": n - 1, "n": n}


def paired_comparison(a: Sequence[float], b: Sequence[float], *, confidence: float = 0.95, alpha: float = 0.05,
                      power: float = 0.8, resamples: int | None = None,
                      seed: int | None = None) -> dict[str, float | list[float]]:
    """Paired difference a − b over seeds (or batches): ``diff``, its t interval ``ci``, ``se``, ``df``, ``n``,
    the two-sided paired t-test ``p`` and ``mde``, the smallest difference that a two-sided test at ``alpha``
    detects with probability ``power`` at this spread (:func:`minimum_detectable_effect`).

    ``resamples`` and ``seed`` are accepted for callers of the bootstrap version and ignored: every interval of
    the verdict rule is a t interval (docs/lab.md, "Statistics")."""
    d = _array(a) - _array(b)
    ti = t_interval(d, confidence=confidence)
    return {"diff": ti["mean"], "ci": ti["ci"], "se": ti["se"], "df": ti["df"], "n": ti["n"],
            "p": paired_t_test(a, b), "mde": minimum_detectable_effect(ti["se"], ti["df"], alpha=alpha,
                                                                       power=power)}


def describe(values: Sequence[float], *, confidence: float = 0.95, resamples: int | None = None,
             seed: int | None = None) -> dict[str, float | list[float]]:
    """Mean, t interval and the values themselves (non-finite values are dropped and counted)."""
    x = _array(values)
    finite = x[np.isfinite(x)]
    ti = t_interval(finite, confidence=confidence)
    return {"mean": ti["mean"], "ci": ti["ci"], "values": [float(v) for v in x],
            "dropped": int(x.size - finite.size)}


def one_sided_p(diff: float, se: float, df: float, *, shift: float = 0.0, upper: bool = True) -> float:
    """p-value of the one-sided t-test of ``diff > shift`` (``upper``) or ``diff < shift``: ``P(T ≥ (diff −
    shift)/se)``, mirrored for ``upper=False``. An exact value (se = 0) gives 0 or 1; unusable input, nan."""
    if not (math.isfinite(diff) and math.isfinite(se) and df >= 1):
        return math.nan
    z = (diff - shift) if upper else (shift - diff)
    if se == 0.0:
        return 0.0 if z > 0 else 1.0
    return student_t_sf(z / se, df)


def holm(p_values: Sequence[float]) -> list[float]:
    """Holm's step-down adjusted p-values (family-wise error ≤ α when the adjusted values are held to α).

    Sort the m finite p-values, ``p_(1) ≤ … ≤ p_(m)``; the adjusted ``p̃_(k) = max_{j ≤ k} min(1, (m − j + 1)·p_(j))``.
    nan stays nan and does not count in m. Example: (0.01, 0.04, 0.03) → (0.03, 0.06, 0.06)."""
    p = [float(x) for x in p_values]
    finite = sorted((v, i) for i, v in enumerate(p) if math.isfinite(v))
    m = len(finite)
    out = [math.nan] * len(p)
    running = 0.0
    for k, (v, i) in enumerate(finite):
        running = max(running, min(1.0, (m - k) * v))
        out[i] = running
    return out


# ----------------------------------------------------------------------------------------------------
# Curves
# ----------------------------------------------------------------------------------------------------


def window_size(num_steps: int) -> int:
    """The window of :func:`window_trajectory`: a tenth of the run, at least one step."""
    return max(1, num_steps // 10)


def window_trajectory(values: Sequence[float]) -> dict[str, float]:
    """``start`` (mean of the first w values), ``min`` (smallest w-step moving average) and ``end`` (mean of
    the last w values) of a per-step curve, w = :func:`window_size`; nan for an empty curve."""
    x = _array(values)
    x = x[np.isfinite(x)]
    if x.size == 0:
        return {"start": math.nan, "min": math.nan, "end": math.nan}
    w = window_size(x.size)
    moving = np.convolve(x, np.ones(w) / w, mode="valid")
    return {"start": float(x[:w].mean()), "min": float(moving.min()), "end": float(x[-w:].mean())}


def last_mean(values: Sequence[float], count: int) -> float:
    """Mean of the last ``count`` finite values of a series (an endpoint that is not one noisy evaluation);
    nan when the series has fewer than ``count`` finite values."""
    x = _array(values)
    x = x[np.isfinite(x)]
    return float(x[-count:].mean()) if count >= 1 and x.size >= count else math.nan


def curve_area(values: Sequence[float]) -> float:
    """Area under a per-step curve divided by its length: the mean value over the run (nan when empty).

    Two runs of equal length compare as their areas do; a run that learns earlier has the larger area."""
    x = _array(values)
    x = x[np.isfinite(x)]
    return float(x.mean()) if x.size else math.nan


def band(curves: Sequence[Sequence[float]], *, confidence: float = 0.95, **_: Any) -> dict[str, list[float]]:
    """Pointwise mean and t interval over seeds of equal-length curves (one row per seed)."""
    x = np.asarray(curves, dtype=np.float64)
    mean, lo, hi = [], [], []
    for j in range(x.shape[1] if x.ndim == 2 else 0):
        col = x[:, j][np.isfinite(x[:, j])]
        ti = t_interval(col, confidence=confidence)
        mean.append(ti["mean"])
        lo.append(ti["ci"][0])
        hi.append(ti["ci"][1])
    return {"mean": mean, "lo": lo, "hi": hi}


# ----------------------------------------------------------------------------------------------------
# Gradient statistics from Gram matrices
# ----------------------------------------------------------------------------------------------------


def _resampled(gram: np.ndarray, idx: np.ndarray | None) -> np.ndarray:
    """(M, R, R) Gram matrices of M resamples (rows of ``idx``); M = 1 for ``idx=None``."""
    g = np.asarray(gram, dtype=np.float64)
    if idx is None:
        return g[None]
    idx = np.atleast_2d(idx)
    return g[idx[:, :, None], idx[:, None, :]]


def gram_snr(gram: np.ndarray, idx: np.ndarray | None = None) -> float | np.ndarray:
    """Signal-to-noise ratio ``‖E g‖² / E‖g − E g‖²`` of R gradient samples from their Gram matrix.

    ``gram[i, j] = <g_i, g_j>``. With ḡ the sample mean and ``V = Σ_i ‖g_i − ḡ‖² / (R − 1)`` the unbiased total
    variance, ``‖ḡ‖²`` overestimates ``‖E g‖²`` by ``V / R``, so the estimate is ``(‖ḡ‖² − V/R) / V``: zero in
    expectation when the mean gradient is 0 (it can come out negative), and the plain ratio minus 1/R
    otherwise. ``idx`` picks subsets or resamples of the samples: (m,) gives one value, (M, m) an array of M
    (nan where a subset has no variance).
    """
    g = _resampled(gram, idx)
    r = g.shape[-1]
    if r < 2:
        return math.nan
    mean_sq = g.sum(axis=(1, 2)) / (r * r)
    total_var = (np.trace(g, axis1=1, axis2=2) - r * mean_sq) / (r - 1)
    with np.errstate(divide="ignore", invalid="ignore"):
        out = np.where(total_var > 0, (mean_sq - total_var / r) / total_var, np.nan)
    return float(out[0]) if idx is None or np.ndim(idx) == 1 else out


def gram_cosine(gram: np.ndarray, dots: np.ndarray, ref_sq_norm: float, idx: np.ndarray | None = None, *,
                ref_noise: float = 0.0) -> float | np.ndarray:
    """Cosine between the mean of R gradient samples and a reference direction g*, bias-corrected.

    ``gram`` (R, R) as in :func:`gram_snr`, ``dots[i] = <g_i, g*>``, ``ref_sq_norm = ‖g*‖²``; ``idx`` as in
    :func:`gram_snr`. Noise inflates both norms: ``E‖ḡ‖² = ‖E g‖² + V/R`` (V the total variance, estimated from
    the Gram matrix) and, when g* is itself a mean of noisy samples, ``E‖g*‖² = ‖E g*‖² + ref_noise``
    (:func:`mean_noise` of the reference's Gram matrix). The cosine uses the corrected norms,
    ``mean_i <g_i, g*> / √((‖ḡ‖² − V/R)(‖g*‖² − ref_noise))`` (the numerator is unbiased: g* comes from other
    batches), so a noisier estimator is not reported as less aligned only for its noise. Undefined (nan) where a
    corrected squared norm is smaller than the noise removed from it (an SNR below 1/R), where the ratio is
    mostly noise; like any bias-corrected ratio it can still leave [−1, 1] slightly."""
    g = _resampled(gram, idx)
    d = np.asarray(dots, dtype=np.float64)
    d = d[None] if idx is None else d[np.atleast_2d(idx)]
    r = g.shape[-1]
    mean_sq = g.sum(axis=(1, 2)) / (r * r)
    total_var = (np.trace(g, axis1=1, axis2=2) - r * mean_sq) / (r - 1) if r > 1 else np.zeros_like(mean_sq)
    signal = mean_sq - total_var / r
    ref = float(ref_sq_norm) - float(ref_noise)
    # a corrected norm smaller than the noise it had removed is mostly noise itself, and the ratio explodes:
    # undefined there (for R = 16 batches: an SNR below 1/16)
    usable = (signal >= total_var / r) & (ref >= float(ref_noise)) & (signal > 0) & (ref > 0)
    with np.errstate(divide="ignore", invalid="ignore"):
        out = np.where(usable, d.mean(1) / np.sqrt(np.abs(signal) * abs(ref)), np.nan)
    return float(out[0]) if idx is None or np.ndim(idx) == 1 else out


def mean_noise(gram: np.ndarray) -> float:
    """``V/R``: the part of ``‖ḡ‖²`` that is noise, for the mean ḡ of R samples with Gram matrix ``gram``."""
    g = np.asarray(gram, dtype=np.float64)
    r = g.shape[0]
    if r < 2:
        return 0.0
    mean_sq = g.sum() / (r * r)
    return float((np.trace(g) - r * mean_sq) / (r - 1) / r)


def student_t_quantile(p_two_sided: float, df: float) -> float:
    """t > 0 with ``P(|T| ≥ t) = p_two_sided`` for Student's t with ``df`` degrees of freedom (bisection)."""
    lo, hi = 0.0, 1.0
    while student_t_sf2(hi, df) > p_two_sided:
        hi *= 2.0
    for _ in range(200):
        mid = 0.5 * (lo + hi)
        if student_t_sf2(mid, df) > p_two_sided:
            lo = mid
        else:
            hi = mid
    return 0.5 * (lo + hi)


def _delete_one(n: int) -> np.ndarray:
    """(n, n − 1) index rows: row i holds every sample but i."""
    return np.array([np.delete(np.arange(n), i) for i in range(n)])


def jackknife(stat: Callable[[np.ndarray | None], Any], n: int) -> tuple[float, float]:
    """Point estimate ``stat(None)`` and its delete-one jackknife standard error over n samples.

    ``stat(idx)`` computes the statistic from the samples ``idx``: all of them for ``None``, and one value per
    row of an (M, m) index array (:func:`gram_snr` and :func:`gram_cosine` work this way). The jackknife
    standard error is ``√((n−1)/n · Σ_i (θ_(i) − θ̄)²)`` over the n leave-one-out estimates θ_(i).
    """
    point = float(stat(None))
    values = np.asarray(stat(_delete_one(n)), dtype=np.float64)
    if n < 2 or not np.all(np.isfinite(values)):
        return point, math.nan
    return point, float(math.sqrt((n - 1) / n * np.sum((values - values.mean()) ** 2)))


def jackknife_interval(stat: Callable[[np.ndarray | None], Any], n: int, *,
                       confidence: float = 0.95) -> dict[str, float | list[float]]:
    """``{"mean", "ci", "se"}``: the statistic of all n samples ± the t quantile (n − 1 degrees of freedom)
    times its jackknife standard error."""
    point, se = jackknife(stat, n)
    half = student_t_quantile(1.0 - confidence, n - 1) * se if math.isfinite(se) else math.nan
    return {"mean": point, "ci": [point - half, point + half], "se": se}


def paired_jackknife_difference(stat_a: Sequence[Callable[[np.ndarray | None], Any]],
                                stat_b: Sequence[Callable[[np.ndarray | None], Any]], sizes: Sequence[int], *,
                                confidence: float = 0.95, alpha: float = 0.05,
                                power: float = 0.8) -> dict[str, float | list[float]]:
    """Difference of a statistic between two estimators measured on the same samples, pooled over groups.

    For each group k (a policy snapshot with ``sizes[k]`` batches), ``stat_a[k]`` and ``stat_b[k]`` compute
    the statistic of estimator a and b as in :func:`jackknife`. The difference is the mean over groups of
    ``d_k = a_k − b_k``; each d_k's standard error comes from deleting the same sample from both estimators
    (paired), and ``se = √(Σ_k se_k²) / K``. Interval ``d ± t·se`` and two-sided p-value of ``d / se`` with
    Student's t at ``min(sizes) − 1`` degrees of freedom; identical estimators give d = 0 and p = 1. A group
    whose statistic (or a leave-one-out value of it) is undefined — the bias-corrected cosine of a group that is
    mostly noise — is left out, and counted in ``groups_left_out``.
    """
    points, variances, used = [], [], []
    for fa, fb, n in zip(stat_a, stat_b, sizes):
        point, se = jackknife(lambda idx, fa=fa, fb=fb: np.asarray(fa(idx)) - np.asarray(fb(idx)), n)
        if math.isfinite(point) and math.isfinite(se):  # a group where the statistic is undefined is left out
            points.append(point)
            variances.append(se * se)
            used.append(n)
    k = len(points)
    diff = float(np.mean(points)) if k else math.nan
    se = math.sqrt(sum(variances)) / k if k else math.nan
    df = min(used) - 1 if used else 0
    base = {"diff": diff, "se": se, "df": df, "n": int(sum(used)), "groups": k, "groups_left_out": len(sizes) - k,
            "mde": minimum_detectable_effect(se, df, alpha=alpha, power=power)}
    if not (math.isfinite(diff) and math.isfinite(se)) or df < 1:
        return {**base, "ci": [math.nan, math.nan], "p": math.nan}
    if se == 0.0:
        return {**base, "ci": [diff, diff], "p": 1.0 if diff == 0.0 else 0.0}
    half = student_t_quantile(1.0 - confidence, df) * se
    return {**base, "ci": [diff - half, diff + half], "p": student_t_sf2(diff / se, df)}


__all__ = ["band", "betainc", "bootstrap_ci", "curve_area", "describe", "gram_cosine", "gram_snr", "holm",
           "jackknife", "jackknife_interval", "last_mean", "mean_noise", "minimum_detectable_effect", "one_sided_p",
           "paired_comparison", "paired_jackknife_difference", "paired_t_test", "student_t_ppf",
           "student_t_quantile", "student_t_sf", "student_t_sf2", "t_interval", "window_size",
           "window_trajectory"]
