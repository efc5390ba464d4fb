"""The lab's plots, drawn from ``lab.json``'s numbers (``lmpo plot`` draws single runs' curves; these compare
objectives over seeds).

- ``<task>_accuracy.png``, ``<task>_reward.png``, ``<task>_entropy.png``: one panel per objective (small
  multiples), held-out accuracy, training reward or token entropy against the RL step, mean over seeds with
  its t band (per-step curves smoothed over a tenth of the run); the baseline's mean in grey in
  every panel.
- ``<task>_final.png``: held-out accuracy, reward area and final entropy per objective with intervals (one
  row per objective), the baseline's mean as a vertical line.
- ``<task>_fits.png``: held-out accuracy against compute per objective, every seed's points and its fitted
  sigmoid (``lmpo.lab.fits``; a seed whose fit did not converge shows its points only, dashed).
- ``<task>_gradients.png``: gradient SNR and cosine to the on-policy direction per objective, one bar per
  snapshot, with jackknife intervals over the batches.
- ``<task>_clipping.png``: clip fractions (low / high) and mask fractions per objective, training study and
  gradient study side by side.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any


def _plt():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def _v(x: Any) -> float:
    return float(x) if x is not None else math.nan


def _err(d: dict) -> tuple[float, float, float]:
    """mean, lower error, upper error for an errorbar (0 where the interval is missing or, as a bootstrap
    interval of a biased statistic can, lies on one side of the estimate)."""
    mean = _v(d.get("mean"))
    lo, hi = (_v(c) for c in d.get("ci", [None, None]))
    return (mean, max(0.0, mean - lo) if math.isfinite(lo) else 0.0,
            max(0.0, hi - mean) if math.isfinite(hi) else 0.0)


def _save(fig, path: Path, title: str) -> Path:
    fig.suptitle(title, fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=90)
    _plt().close(fig)
    return path


def draw_plots(report: dict[str, Any], out_dir: Path) -> list[Path]:
    """Draw every plot of every task; returns the paths written."""
    out_dir.mkdir(parents=True, exist_ok=True)
    baseline = report["config"]["report"]["baseline"]
    written: list[Path] = []
    for task, data in report["tasks"].items():
        if data.get("training"):
            for stem, (key, title) in CURVES.items():
                written.append(_curves(data["training"], baseline, key, title, out_dir / f"{task}_{stem}.png", task,
                                       report["config"]["report"]["confidence"]))
            written.append(_final(data["training"], baseline, out_dir / f"{task}_final.png", task))
            if data["training"].get("fits"):
                written.append(_fits(data["training"]["fits"], out_dir / f"{task}_fits.png", task))
        if data.get("gradients"):
            written.append(_gradients(data["gradients"], out_dir / f"{task}_gradients.png", task))
        if data.get("training") or data.get("gradients"):
            written.append(_clipping(data.get("training"), data.get("gradients"), out_dir / f"{task}_clipping.png",
                                     task))
    return written


CURVES = {"accuracy": ("eval_accuracy", "held-out greedy accuracy"), "reward": ("reward", "training reward"),
          "entropy": ("entropy", "token entropy")}
"""Plot stem → (curve in lab.json, title): one small-multiples figure each."""


def _smooth(values: list[float], width: int) -> list[float]:
    """Trailing moving average (the first points average what there is)."""
    out = []
    for i in range(len(values)):
        window = [v for v in values[max(0, i - width + 1): i + 1] if math.isfinite(v)]
        out.append(sum(window) / len(window) if window else math.nan)
    return out


def _panels(plt, count: int):
    """Small multiples: ``count`` panels, 5 per row, shared axes; the unused cells of the last row hidden."""
    cols = min(5, count)
    rows = -(-count // cols)
    fig, axes = plt.subplots(rows, cols, figsize=(2.6 * cols + 0.6, 2.1 * rows + 0.8), sharex=True, sharey=True,
                             squeeze=False)
    for ax in axes.flat[count:]:
        ax.set_visible(False)
    return fig, axes


def _curves(training: dict, baseline: str, key: str, title: str, path: Path, task: str, confidence: float) -> Path:
    """One panel per objective (5 per row): its mean over seeds with the t band, the baseline in grey.
    Per-step curves are smoothed by a trailing moving average over a tenth of the run."""
    plt = _plt()
    labels = list(training["curves"])
    fig, axes = _panels(plt, len(labels))
    base = training["curves"].get(baseline)
    steps = len(next(iter(training["curves"].values()))[key]["step"])
    width = 1 if key == "eval_accuracy" else max(1, steps // 10)

    def line(c: dict, name: str) -> list[float]:
        return _smooth([_v(v) for v in c[name]], width)

    for ax, label in zip(axes.flat, labels):
        c = training["curves"][label][key]
        mean = line(c, "mean")
        lo = [m if math.isnan(v) else v for v, m in zip(line(c, "lo"), mean)]
        hi = [m if math.isnan(v) else v for v, m in zip(line(c, "hi"), mean)]
        if base is not None and label != baseline:
            ax.plot(base[key]["step"], line(base[key], "mean"), color="0.55", lw=1)
        ax.fill_between(c["step"], lo, hi, color="C0", alpha=0.25, lw=0)
        ax.plot(c["step"], mean, color="C0", lw=1.5, marker="o" if key == "eval_accuracy" else None, ms=3)
        ax.set_title(label, fontsize=9)
        ax.grid(alpha=0.3)
        ax.tick_params(labelsize=7)
    for ax in axes[-1]:
        ax.set_xlabel("RL step", fontsize=8)
    smoothed = f", moving average over {width} steps" if width > 1 else ""
    return _save(fig, path, f"{task}: {title}, mean over seeds with {confidence:.0%} t band{smoothed} "
                 f"(grey: {baseline})")


def _fits(fits: dict, path: Path, task: str) -> Path:
    """One panel per objective (5 per row): each seed's (compute, accuracy) points and its fitted sigmoid."""
    import numpy as np

    from lmpo.lab.fits import sigmoid

    plt = _plt()
    labels = list(fits["objectives"])
    fig, axes = _panels(plt, len(labels))
    for ax, label in zip(axes.flat, labels):
        entry = fits["objectives"][label]
        for i, (seed, pts) in enumerate(entry.get("points", {}).items()):
            color = f"C{i % 10}"
            fit = entry["fits"].get(seed, {})
            converged = fit.get("status") == "converged"
            ax.plot(pts["compute"], pts["accuracy"], "o" if converged else "o--", color=color, ms=2.5, lw=0.6,
                    alpha=0.8)
            if converged:
                grid = np.linspace(0.0, max(pts["compute"]), 100)
                ax.plot(grid, sigmoid(grid, fit["r0"], fit["a"], fit["b"], fit["c_mid"]), color=color, lw=1)
        a = entry["a"]
        ax.set_title(f"{label}: A {_v(a['mean']):.3f}" if a.get("ci") else f"{label}: A not fitted", fontsize=8)
        ax.grid(alpha=0.3)
        ax.tick_params(labelsize=7)
    for ax in axes[-1]:
        ax.set_xlabel("compute (tokens per row)", fontsize=8)
    return _save(fig, path, f"{task}: held-out accuracy against compute, each seed's points and fitted sigmoid")


def _final(training: dict, baseline: str, path: Path, task: str) -> Path:
    plt = _plt()
    labels = list(training["metrics"])
    panels = [("accuracy", "held-out accuracy (end)"), ("reward_auc", "reward area (mean reward)"),
              ("entropy_end", "token entropy (end)"), ("eval_length", "held-out length (tokens)")]
    fig, axes = plt.subplots(1, len(panels), figsize=(3.0 * len(panels), 0.32 * len(labels) + 1.4), sharey=True)
    ys = list(range(len(labels)))[::-1]
    for ax, (key, title) in zip(axes, panels):
        for y, label in zip(ys, labels):
            mean, lo, hi = _err(training["metrics"][label][key])
            color = "0.4" if label == baseline else "C0"
            ax.errorbar([mean], [y], xerr=[[lo], [hi]], fmt="o", color=color, ms=4, capsize=2)
            values = [_v(v) for v in training["metrics"][label][key]["values"]]
            ax.scatter(values, [y] * len(values), s=6, color=color, alpha=0.4)
        if baseline in training["metrics"]:
            ax.axvline(_v(training["metrics"][baseline][key]["mean"]), color="0.6", ls="--", lw=1)
        ax.set_title(title, fontsize=9)
        ax.grid(alpha=0.3, axis="x")
        ax.tick_params(labelsize=7)
    axes[0].set_yticks(ys, labels, fontsize=8)
    return _save(fig, path, f"{task}: per objective, mean and interval over seeds (dots: seeds; dashed: {baseline})")


def _bars(ax, labels: list[str], groups: list[tuple[str, list[dict]]], title: str) -> None:
    width = 0.8 / max(1, len(groups))
    for g, (name, cells) in enumerate(groups):
        xs = [i + (g - (len(groups) - 1) / 2) * width for i in range(len(labels))]
        means, lo, hi = zip(*(_err(c) for c in cells)) if cells else ((), (), ())
        ax.bar(xs, means, width=width, yerr=[lo, hi], capsize=2, label=name, color=f"C{g}", alpha=0.85)
    ax.set_xticks(range(len(labels)), labels, rotation=45, ha="right", fontsize=8)
    ax.set_title(title, fontsize=9)
    ax.grid(alpha=0.3, axis="y")
    ax.tick_params(axis="y", labelsize=7)
    ax.axhline(0, color="0.3", lw=0.8)


def _gradients(gradients: dict, path: Path, task: str) -> Path:
    plt = _plt()
    snaps = gradients.get("by_step") or gradients["snapshots"]
    labels = list(snaps[0]["objectives"])
    fig, axes = plt.subplots(2, 1, figsize=(max(7.0, 0.75 * len(labels) + 2), 7.0), sharex=True)
    for ax, key, title in ((axes[0], "snr", "gradient SNR ‖E g‖² / E‖g − E g‖²"),
                           (axes[1], "cos_onpolicy", "cosine of the mean gradient to the on-policy direction")):
        groups = [(f"step {s['step']}", [s["objectives"][lb][key] for lb in labels]) for s in snaps]
        _bars(ax, labels, groups, title)
        ax.legend(fontsize=7, title="snapshot", title_fontsize=7, ncols=len(snaps))
    return _save(fig, path, f"{task}: paired gradient study (the same batches for every objective; per RL step, "
                 "the mean over reference seeds and off-policy points; bars: t intervals over them)")


def _clipping(training: dict | None, gradients: dict | None, path: Path, task: str) -> Path:
    """Clip fractions in training and in the gradient study, and (on their own scale) mask fractions."""
    plt = _plt()
    panels = []
    if training:
        labels = list(training["metrics"])
        panels.append((labels, [("clip low (A < 0)", [training["metrics"][lb]["clip_low_frac"] for lb in labels]),
                                ("clip high (A > 0)", [training["metrics"][lb]["clip_high_frac"] for lb in labels])],
                       "training: clipped fraction per optimizer step"))
    if gradients:
        snaps = gradients.get("by_step") or gradients["snapshots"]
        labels = list(snaps[0]["objectives"])
        panels.append((labels, [(f"step {s['step']}", [s["objectives"][lb]["clip_frac"] for lb in labels])
                                for s in snaps], "gradient study: clipped fraction per batch"))
    masked = []
    if training:
        masked.append(("training", {lb: m["mask_frac"] for lb, m in training["metrics"].items()}))
    if gradients:
        masked.append(("gradient study", {lb: r["mask_frac"] for lb, r in (gradients.get("by_step") or gradients["snapshots"])[-1]["objectives"].items()}))
    names = [lb for lb in (list(training["metrics"]) if training else list(masked[0][1]))
             if any(_v(m.get(lb, {}).get("mean")) > 0 for _, m in masked)]
    if names:
        panels.append((names, [(study, [m.get(lb, {"mean": None}) for lb in names]) for study, m in masked],
                       "masked or penalised tokens (Clip-Cov, KL-Cov)"))
    widths = [max(3.0, 0.45 * len(labels) + 1.5) for labels, _, _ in panels]
    fig, axes = plt.subplots(1, len(panels), figsize=(sum(widths), 4.4), squeeze=False,
                             gridspec_kw={"width_ratios": widths})
    for ax, (labels, groups, title) in zip(axes[0], panels):
        _bars(ax, labels, groups, title)
        ax.legend(fontsize=7)
    return _save(fig, path, f"{task}: clipped and masked fractions (tokens; sequences for sequence-level ratios)")


__all__ = ["draw_plots"]
