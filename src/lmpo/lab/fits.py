"""Compute–performance fits: the sigmoid of ScaleRL (Khatri et al. 2025, arXiv 2510.13786) per run, with intervals
over seeds.

    R(C) = R0 + (A − R0) / (1 + (C_mid / C)^B)

``C`` is training compute (any monotone unit: RL steps, tokens, CPU-seconds), ``R`` a bounded score such as
held-out accuracy, ``R0`` the score before RL (fixed, not fitted: the first point of the curve), ``A`` the ceiling
the curve approaches, ``B`` > 0 the efficiency (how sharply it rises around its midpoint) and ``C_mid`` the compute
at which half of the gain ``A − R0`` is reached. ScaleRL separates what moves ``A`` (the loss type, FP32 logits)
from what only moves ``B`` (aggregation, normalisation, curriculum); a claim may name either as its check.

How a curve is fitted (:func:`fit_sigmoid`): least squares by variable projection. For a fixed ``(B, C_mid)`` the
model is linear in ``A − R0`` (``R − R0 = (A − R0)·g(C)``, ``g = 1/(1 + (C_mid/C)^B)``), so ``A`` has a closed form
(clamped to ``[lower, upper]``); the two remaining parameters are searched on a log grid, and Levenberg–Marquardt
refines the best grid point inside the search range. No starting guess to choose, so no fit that depends on one.

A fit is **converged** only when the data pin every parameter: the best ``B`` and ``C_mid`` lie inside the search
range (not on its edge, where the squared error keeps falling towards infinity), ``A`` lies strictly inside its
bounds, and ``C_mid`` is at most ``max_extrapolation`` times the largest observed compute (a midpoint far beyond
the data makes the ceiling an extrapolation). Otherwise the fit is **unbounded** (or **failed** for too few or
non-finite points) and carries no number for the reader: :func:`fit_over_seeds` then reports the interval as
missing with the reason, never a value.

Intervals (:func:`fit_over_seeds`): each seed is fitted on its own and the Student-t interval is taken over the
per-seed ``A`` (and ``B``); the replicate is the training run, as everywhere in the lab. :func:`compare_fits`
gives the paired difference of two objectives on common seeds. ``tests/lab/test_lab_fits.py`` checks on simulated
curves that the fit recovers known ``A`` and ``B`` and that the intervals cover at their nominal rate.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass
from typing import Any

import numpy as np

from lmpo.lab import stats as st

FIT_STATUSES = ("converged", "unbounded", "failed")


def sigmoid(compute: np.ndarray | Sequence[float], r0: float, a: float, b: float, c_mid: float) -> np.ndarray:
    """``R(C) = R0 + (A − R0) / (1 + (C_mid / C)^B)``, elementwise; ``R(0) = R0``."""
    c = np.asarray(compute, dtype=np.float64)
    with np.errstate(divide="ignore", over="ignore"):
        ratio = np.where(c > 0, (c_mid / np.where(c > 0, c, 1.0)) ** b, np.inf)
    return r0 + (a - r0) / (1.0 + ratio)


@dataclass(frozen=True)
class SigmoidFit:
    """One curve's fit. ``a``, ``b``, ``c_mid`` are NaN unless ``status == "converged"``; ``reason`` says why not."""

    status: str
    r0: float
    a: float = math.nan
    b: float = math.nan
    c_mid: float = math.nan
    rmse: float = math.nan
    num_points: int = 0
    reason: str = ""

    @property
    def converged(self) -> bool:
        return self.status == "converged"

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def _project(g: np.ndarray, y: np.ndarray, r0: float, lower: float, upper: float) -> tuple[np.ndarray, np.ndarray]:
    """For candidate shapes ``g`` (K, N) and targets ``y`` (N,): the least-squares ``A`` (K,) clamped to its bounds
    and the squared errors (K,)."""
    dy = y - r0
    gg = np.einsum("kn,kn->k", g, g)
    gain = np.einsum("kn,n->k", g, dy) / np.maximum(gg, 1e-300)
    a = np.clip(r0 + gain, lower, upper)
    resid = dy[None, :] - (a - r0)[:, None] * g
    return a, np.einsum("kn,kn->k", resid, resid)


def _shapes(c: np.ndarray, log_b: np.ndarray, log_m: np.ndarray) -> np.ndarray:
    """``g = 1/(1 + (C_mid/C)^B)`` for K candidate ``(log B, log C_mid)`` pairs: (K, N), computed in log space so
    that huge ratios do not overflow."""
    z = np.exp(log_b).reshape(-1, 1) * (log_m.reshape(-1, 1) - np.log(c)[None, :])
    return np.exp(-np.logaddexp(0.0, z))


def _grid_search(c: np.ndarray, y: np.ndarray, r0: float, lower: float, upper: float,
                 log_b: np.ndarray, log_m: np.ndarray) -> tuple[float, float]:
    lb, lm = np.meshgrid(log_b, log_m, indexing="ij")
    _, sse = _project(_shapes(c, lb.reshape(-1), lm.reshape(-1)), y, r0, lower, upper)
    k = int(np.argmin(sse))
    return float(lb.reshape(-1)[k]), float(lm.reshape(-1)[k])


def _refine(c: np.ndarray, y: np.ndarray, r0: float, lower: float, upper: float, theta: np.ndarray,
            box: tuple[np.ndarray, np.ndarray], iterations: int = 100) -> np.ndarray:
    """Levenberg–Marquardt on ``θ = (log B, log C_mid)`` with ``A`` projected out, kept inside ``box``: the grid
    finds the basin, this finds the bottom of a narrow curved valley that a grid cell straddles."""

    def residuals(thetas: np.ndarray) -> np.ndarray:  # (K, 2) -> (K, N), one vectorised call per iteration
        g = _shapes(c, thetas[:, 0], thetas[:, 1])
        a, _ = _project(g, y, r0, lower, upper)
        return (y - r0)[None, :] - (a - r0)[:, None] * g

    lo, hi = box
    h = 1e-6
    probes = np.concatenate([np.zeros((1, 2)), h * np.eye(2), -h * np.eye(2)])
    damping = 1e-3
    for _ in range(iterations):
        res = residuals(theta[None, :] + probes)
        r, jac = res[0], ((res[1:3] - res[3:5]) / (2 * h)).T
        jtj, jtr = jac.T @ jac, jac.T @ r
        while damping < 1e8:
            step = np.linalg.solve(jtj + damping * np.diag(np.diag(jtj) + 1e-12), -jtr)
            candidate = np.clip(theta + step, lo, hi)
            r_new = residuals(candidate[None, :])[0]
            if r_new @ r_new < r @ r:
                theta, damping = candidate, damping / 3
                break
            damping *= 4
        else:
            break
        if np.max(np.abs(step)) < 1e-9:
            break
    return theta


def fit_sigmoid(compute: Sequence[float] | np.ndarray, score: Sequence[float] | np.ndarray, *,
                r0: float | None = None, lower: float = 0.0, upper: float = 1.0, b_range: tuple[float, float] = (0.05, 20.0),
                span: float = 1e3, max_extrapolation: float = 4.0, grid: int = 41) -> SigmoidFit:
    """Fit ``R(C)`` to one curve: ``compute`` (N,) ≥ 0, ``score`` (N,).

    ``r0`` defaults to the score at the smallest compute (which must then be 0: the curve starts before RL);
    points at compute 0 only set ``R0``. ``A`` is bounded to ``[lower, upper]`` (a pass rate: [0, 1]). ``B`` is
    searched in ``b_range``, ``C_mid`` from ``min(C)/span`` to ``max(C)·span``. Needs at least three points with
    compute > 0 (three free parameters).
    """
    c = np.asarray(compute, dtype=np.float64).reshape(-1)
    y = np.asarray(score, dtype=np.float64).reshape(-1)
    if c.shape != y.shape:
        raise ValueError(f"fit_sigmoid: compute has {c.size} points, score {y.size}; give one score per compute")
    if r0 is None:
        at_zero = c == 0
        if not at_zero.any():
            return SigmoidFit("failed", math.nan, reason="no point at compute 0 to set R0 (pass r0=)")
        r0 = float(np.mean(y[at_zero]))
    keep = c > 0
    c, y = c[keep], y[keep]
    if not (math.isfinite(r0) and np.all(np.isfinite(c)) and np.all(np.isfinite(y))):
        return SigmoidFit("failed", float(r0), num_points=int(c.size), reason="non-finite compute or score")
    if c.size < 3:
        return SigmoidFit("failed", float(r0), num_points=int(c.size),
                          reason=f"{c.size} points with compute > 0; three parameters need at least 3")
    lo_b, hi_b = math.log(b_range[0]), math.log(b_range[1])
    lo_m, hi_m = math.log(c.min() / span), math.log(c.max() * span)
    start = _grid_search(c, y, r0, lower, upper, np.linspace(lo_b, hi_b, grid), np.linspace(lo_m, hi_m, grid))
    log_b, log_m = _refine(c, y, r0, lower, upper, np.array(start),
                           (np.array([lo_b, lo_m]), np.array([hi_b, hi_m])))
    g = _shapes(c, np.array([log_b]), np.array([log_m]))
    a_arr, sse_arr = _project(g, y, r0, lower, upper)
    a, sse = float(a_arr[0]), float(sse_arr[0])
    b, c_mid = math.exp(log_b), math.exp(log_m)
    rmse = math.sqrt(sse / c.size)
    reasons = []
    if not lo_b + 1e-6 < log_b < hi_b - 1e-6:
        reasons.append(f"B at the edge of its range {b_range}")
    if not lo_m + 1e-6 < log_m < hi_m - 1e-6:
        reasons.append("C_mid at the edge of its range (the squared error keeps falling beyond it)")
    if a <= lower or a >= upper:
        reasons.append(f"A at its bound ({a:g} in [{lower:g}, {upper:g}])")
    if c_mid > max_extrapolation * c.max():
        reasons.append(f"C_mid {c_mid:.3g} beyond {max_extrapolation:g}× the largest compute {c.max():.3g}")
    if reasons:
        return SigmoidFit("unbounded", float(r0), rmse=rmse, num_points=int(c.size), reason="; ".join(reasons))
    return SigmoidFit("converged", float(r0), a=a, b=b, c_mid=c_mid, rmse=rmse, num_points=int(c.size))


def _interval(values: list[float], n_total: int, unfit: Mapping[Any, str], confidence: float) -> dict[str, Any]:
    if unfit:
        return {"mean": None, "ci": None, "seeds": len(values),
                "reason": f"{len(unfit)} of {n_total} seeds' fits not converged, so no interval: "
                          + "; ".join(f"seed {s}: {r}" for s, r in sorted(unfit.items(), key=lambda kv: str(kv[0])))}
    if len(values) < 2:
        return {"mean": None, "ci": None, "seeds": len(values), "reason": "fewer than two converged seeds"}
    d = st.t_interval(values, confidence=confidence)
    return {"mean": float(d["mean"]), "ci": [float(x) for x in d["ci"]], "seeds": len(values), "reason": ""}


def summarise_fits(fits: Mapping[Any, SigmoidFit], *, confidence: float = 0.95) -> dict[str, Any]:
    """Every seed's fit and the Student-t intervals over seeds on ``A``, ``B`` and ``C_mid``.

    An interval is given only when every seed's fit converged (dropping the unbounded seeds would select on the
    outcome); otherwise it is ``None`` with the reason naming the seeds.
    """
    unfit = {seed: f"{f.status}: {f.reason}" for seed, f in fits.items() if not f.converged}
    ok = [f for f in fits.values() if f.converged]
    return {"fits": {str(s): f.to_dict() for s, f in fits.items()},
            **{name: _interval([getattr(f, name) for f in ok], len(fits), unfit, confidence)
               for name in ("a", "b", "c_mid")}}


def fit_over_seeds(curves: Mapping[Any, tuple[Sequence[float], Sequence[float]]], *, confidence: float = 0.95,
                   **fit_options: Any) -> dict[str, Any]:
    """:func:`fit_sigmoid` on every seed's ``(compute, score)`` curve, then :func:`summarise_fits`."""
    return summarise_fits({seed: fit_sigmoid(c, y, **fit_options) for seed, (c, y) in curves.items()},
                          confidence=confidence)


def compare_fits(fits: Mapping[Any, SigmoidFit], baseline: Mapping[Any, SigmoidFit], *,
                 confidence: float = 0.95) -> dict[str, Any]:
    """Paired differences (objective − baseline) of ``A`` and ``B`` over the seeds both ran, with t intervals;
    ``None`` with the reason when a common seed's fit did not converge on either side."""
    common = sorted(set(fits) & set(baseline), key=str)
    unfit = {s: "not converged" for s in common if not (fits[s].converged and baseline[s].converged)}
    return {name: _interval([getattr(fits[s], name) - getattr(baseline[s], name) for s in common if s not in unfit],
                            len(common), unfit, confidence) for name in ("a", "b")}


def compute_curve(summary: Mapping[str, Any]) -> tuple[list[float], list[float]]:
    """One lab cell's held-out accuracy against compute: ``(compute, accuracy)`` at its evaluations.

    Compute is the completion tokens sampled per row, summed over the RL steps up to each evaluation (the
    evaluation at step 0 sits at compute 0). Every objective of a lab grid samples the same rows per step, so this
    is proportional to the tokens it generated and trained on, and it charges an objective whose completions grow
    for the longer ones (ScaleRL's axis is GPU-hours; per-row tokens are its machine-independent part).
    """
    steps = summary["series"]["step"]
    length = [v if math.isfinite(v) else 0.0 for v in summary["series"]["length"]]
    cumulative = np.cumsum(length)
    compute = [float(cumulative[np.searchsorted(steps, s, side="right") - 1]) if s > 0 else 0.0
               for s in summary["eval"]["step"]]
    return compute, list(summary["eval"]["accuracy"])


def fit_study(summaries: Mapping[str, Mapping[Any, Mapping[str, Any]]], baselines: Sequence[str], *,
              confidence: float = 0.95) -> dict[str, Any]:
    """The lab's fits: per objective, :func:`fit_over_seeds` on every seed's :func:`compute_curve`, and per
    baseline the paired :func:`compare_fits` of ``A`` and ``B``."""
    curves = {label: {seed: compute_curve(summary) for seed, summary in sorted(by_seed.items())}
              for label, by_seed in summaries.items()}
    fits = {label: {seed: fit_sigmoid(*curve) for seed, curve in by_seed.items()} for label, by_seed in curves.items()}
    out: dict[str, Any] = {"unit": "completion tokens per row, summed over RL steps", "comparisons": {},
                           "objectives": {label: summarise_fits(f, confidence=confidence) for label, f in fits.items()}}
    for label, by_seed in curves.items():  # the points, so that a reader can refit and the plot can show them
        out["objectives"][label]["points"] = {str(seed): {"compute": c, "accuracy": y}
                                              for seed, (c, y) in by_seed.items()}
    for label in fits:
        for base in baselines:
            if base != label and base in fits:
                out["comparisons"].setdefault(label, {})[base] = compare_fits(fits[label], fits[base],
                                                                              confidence=confidence)
    return out
