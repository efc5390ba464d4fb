"""The lab's plots, drawn from ``lab.json``'s numbers (``lmpo plot`` draws single runs' curves; these compare
objectives over seeds).

- ``<task>_curves.png``: one panel per objective (small multiples), held-out accuracy, training reward and
  token entropy against the RL step, mean over seeds with its bootstrap band; the baseline's mean in grey in
  every panel.
- ``<task>_final.png``: held-out accuracy, reward area and final entropy per objective with intervals (one
  row per objective), the baseline's mean as a vertical line.
- ``<task>_gradients.png``: gradient SNR and cosine to the on-policy direction per objective, one bar per
  snapshot, with batch-bootstrap intervals.
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
    """mean, lower error, upper error for an errorbar (0 where the interval is missing)."""
    mean = _v(d.get("mean"))
    lo, hi = (_v(c) for c in d.get("ci", [None, None]))
    return mean, (mean - lo) if math.isfinite(lo) else 0.0, (hi - mean) if math.isfinite(hi) else 0.0


def draw_plots(report: dict[str, Any], out_dir: Path) -> list[Path]:
    """Draw every plot of every task; returns the paths written."""
    out_dir.mkdir(parents=True, exist_ok=True)
    baseline = report["config"]["report"]["baseline"]
    written: list[Path] = []
    for task, data in report["tasks"].items():
        if data.get("training"):
            written.append(_curves(data["training"], baseline, out_dir / f"{task}_curves.png", task))
            written.append(_final(data["training"], baseline, out_dir / f"{task}_final.png", task))
        if data.get("gradients"):
            written.append(_gradients(data["gradients"], out_dir / f"{task}_gradients.png", task))
        if data.get("training") or data.get("gradients"):
            written.append(_clipping(data.get("training"), data.get("gradients"), out_dir / f"{task}_clipping.png",
                                     task))
    return written


def _curves(training: dict, baseline: str, path: Path, task: str) -> Path:
    plt = _plt()
    labels = list(training["curves"])
    rows = [("eval_accuracy", "held-out accuracy"), ("reward", "training reward"), ("entropy", "token entropy")]
    cols = len(labels)
    fig, axes = plt.subplots(len(rows), cols, figsize=(2.2 * cols + 0.8, 2.0 * len(rows) + 0.6), sharex="col",
                             sharey="row", squeeze=False)
    base = training["curves"].get(baseline)
    for j, label in enumerate(labels):
        curves = training["curves"][label]
        for i, (key, title) in enumerate(rows):
            ax = axes[i][j]
            c = curves[key]
            x = c["step"]
            mean = [_v(v) for v in c["mean"]]
            lo = [_v(v) if v is not None else m for v, m in zip(c["lo"], mean)]
            hi = [_v(v) if v is not None else m for v, m in zip(c["hi"], mean)]
            if base is not None and label != baseline:
                ax.plot(base[key]["step"], [_v(v) for v in base[key]["mean"]], color="0.6", lw=1, label=baseline)
            ax.fill_between(x, lo, hi, color="C0", alpha=0.25, lw=0)
            ax.plot(x, mean, color="C0", lw=1.5, marker="o" if key == "eval_accuracy" else None, ms=2.5,
                    label=label)
            ax.grid(alpha=0.3)
            if i == 0:
                ax.set_title(label, fontsize=9)
            if j == 0:
                ax.set_ylabel(title, fontsize=8)
            if i == len(rows) - 1:
                ax.set_xlabel("RL step", fontsize=8)
            ax.tick_params(labelsize=7)
    fig.suptitle(f"{task}: mean over seeds with {int(100 * 0.95)}% bootstrap band (grey: {baseline})", fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=90)
    plt.close(fig)
    return path


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
    fig.suptitle(f"{task}: per objective, mean and interval over seeds (dots: seeds; dashed: {baseline})",
                 fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=90)
    plt.close(fig)
    return path


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
    snaps = gradients["snapshots"]
    labels = list(snaps[0]["objectives"])
    fig, axes = plt.subplots(1, 2, figsize=(max(8, 0.9 * len(labels) + 3) * 1.6, 4.2))
    for ax, key, title in ((axes[0], "snr", "gradient SNR ‖E g‖² / E‖g − E g‖²"),
                           (axes[1], "cos_onpolicy", "cosine of the mean gradient to the on-policy direction")):
        groups = [(f"step {s['step']}", [s["objectives"][lb][key] for lb in labels]) for s in snaps]
        _bars(ax, labels, groups, title)
        ax.legend(fontsize=7, title="snapshot", title_fontsize=7)
    fig.suptitle(f"{task}: paired gradient study (same batches for every objective; bars: batch-bootstrap "
                 "intervals)", fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=90)
    plt.close(fig)
    return path


def _clipping(training: dict | None, gradients: dict | None, path: Path, task: str) -> Path:
    plt = _plt()
    panels = []
    if training:
        labels = list(training["metrics"])
        panels.append((labels, [("clip low", [training["metrics"][lb]["clip_low_frac"] for lb in labels]),
                                ("clip high", [training["metrics"][lb]["clip_high_frac"] for lb in labels]),
                                ("masked", [training["metrics"][lb]["mask_frac"] for lb in labels])],
                       "training study: mean fraction per optimizer step"))
    if gradients:
        snap = gradients["snapshots"][-1]
        labels = list(snap["objectives"])
        panels.append((labels, [("clip", [snap["objectives"][lb]["clip_frac"] for lb in labels]),
                                ("masked", [snap["objectives"][lb]["mask_frac"] for lb in labels])],
                       f"gradient study at step {snap['step']}: fraction per batch"))
    fig, axes = plt.subplots(1, len(panels), figsize=(7.5 * len(panels), 4.2), squeeze=False)
    for ax, (labels, groups, title) in zip(axes[0], panels):
        _bars(ax, labels, groups, title)
        ax.legend(fontsize=7)
    fig.suptitle(f"{task}: clipped and masked fractions (tokens; sequences for sequence-level ratios)", fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=90)
    plt.close(fig)
    return path


__all__ = ["draw_plots"]
