"""``lmpo plot RUN_DIR… [--out DIR]``: training curves to PNG, several runs overlaid.

One PNG per quantity (reward, accuracy, entropy, clip fraction, KL); each run is one line, labelled by
its directory name. Missing metrics (e.g. entropy when the objective never computed it) are skipped.
"""

from __future__ import annotations

import math
import os
from pathlib import Path

from lmpo.errors import InputError
from lmpo.trainer.metrics import read_jsonl

#: file stem -> (title, [(metric key, record kind, line label suffix)])
PLOTS: dict[str, tuple[str, list[tuple[str, str, str]]]] = {
    "reward": ("reward (mean over completions)", [("reward/mean", "train", "")]),
    "accuracy": ("accuracy", [("reward/accuracy", "train", " train (sampled)"),
                              ("eval/accuracy", "eval", " held-out (greedy)")]),
    "entropy": ("token entropy", [("entropy/mean", "train", "")]),
    "clip_fraction": ("clip fraction", [("clip/low_frac", "train", " low"), ("clip/high_frac", "train", " high")]),
    "kl": ("KL", [("kl/behaviour_k3", "train", " behaviour (k3)"), ("kl/ref", "train", " reference")]),
}


def _series(rows: list[dict], key: str, kind: str) -> tuple[list[int], list[float]]:
    xs, ys = [], []
    for r in rows:
        if r.get("kind", "train") != kind or key not in r:
            continue
        try:
            v = float(r[key])
        except (TypeError, ValueError):
            continue
        if math.isfinite(v):
            xs.append(int(r["step"]))
            ys.append(v)
    return xs, ys


def plot_runs(run_dirs: list[str | os.PathLike], out_dir: str | os.PathLike | None = None) -> list[Path]:
    """Draw the curves of ``run_dirs`` (each holding metrics.jsonl); returns the PNG paths written."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    runs = []
    for d in run_dirs:
        path = Path(d) / "metrics.jsonl"
        if not path.exists():
            raise InputError(f"{d}: no metrics.jsonl (is this a run directory of `lmpo train`?)")
        runs.append((Path(d).resolve().name, read_jsonl(path)))
    out = Path(out_dir) if out_dir is not None else Path(run_dirs[0]) / "plots"
    out.mkdir(parents=True, exist_ok=True)
    written = []
    for stem, (title, curves) in PLOTS.items():
        fig, ax = plt.subplots(figsize=(6, 4))
        drawn = 0
        for name, rows in runs:
            for key, kind, suffix in curves:
                xs, ys = _series(rows, key, kind)
                if xs:
                    ax.plot(xs, ys, marker="o" if kind == "eval" else None, markersize=3, label=f"{name}{suffix}")
                    drawn += 1
        if drawn == 0:
            plt.close(fig)
            continue
        ax.set_title(title)
        ax.set_xlabel("RL step")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
        fig.tight_layout()
        path = out / f"{stem}.png"
        fig.savefig(path, dpi=100)
        plt.close(fig)
        written.append(path)
    return written
