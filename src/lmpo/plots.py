"""``lmpo plot RUN_DIR… [--out DIR]``: training curves to PNG, several runs overlaid (every command's run directory:
``lmpo train`` and ``lmpo sac train`` both draw their plots through this module).

Reads ``metrics.jsonl`` of ``lmpo train`` runs (one record per RL step, ``kind`` train / eval) and of
``lmpo sac train`` runs (one record per log interval, x axis ``step/updates``); the kind of run is told
from its records. One PNG per panel (``TRAINER_PANELS`` / ``SAC_PANELS``): a title, axis labels with units,
each per-step series drawn faint with its centred moving average on top, held-out evaluations as markers,
the legend outside the axes, and a caption under the axes saying how the curves were smoothed and why a
panel is flat when it is constant by construction (clip fraction and behaviour KL of an on-policy run).
Panels whose metrics a run never logged are skipped.
"""

from __future__ import annotations

import json
import math
import os
import textwrap
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from lmpo.config import read_yaml
from lmpo.errors import InputError
from lmpo.runs import PLOTS_DIR, link_refused, open_no_follow, read_jsonl, stored_config_path


@dataclass(frozen=True)
class Curve:
    """One metric of a panel: ``key`` in the records of ``kind`` (``"eval"`` ones are drawn as markers)."""

    key: str
    label: str = ""
    kind: str = "train"
    dashed: bool = False


@dataclass(frozen=True)
class Panel:
    """One PNG: ``flat_reason(run config) -> str | None`` explains a panel constant by construction."""

    stem: str
    title: str
    ylabel: str
    curves: tuple[Curve, ...]
    flat_reason: Callable[[dict], str | None] | None = None
    unit_range: bool = False  # a fraction: the y axis shows [0, 1]


def _on_policy(consequence: str) -> Callable[[dict], str | None]:
    def reason(cfg: dict) -> str | None:
        loop = cfg.get("loop") or {}
        if loop and int(loop.get("epochs_per_step", 1)) * int(loop.get("minibatches_per_step", 1)) == 1:
            return (f"flat at 0 by construction: an on-policy run (one optimizer step per rollout batch) "
                    f"updates at π = π_old, so {consequence}")
        return None

    return reason


def _fixed_alpha(cfg: dict) -> str | None:
    if (cfg.get("sac") or {}).get("autotune_alpha") is False:
        return "constant by construction: α is fixed (sac.autotune_alpha: false)"
    return None


def _no_top_p(cfg: dict) -> str | None:
    if (cfg.get("sac") or {}).get("use_top_p") is False:
        return "1 by construction: the top-p backup is off (sac.use_top_p: false), every action is kept"
    return None


TRAINER_PANELS: tuple[Panel, ...] = (
    Panel("reward", "Reward", "mean reward per completion (weighted sum)", (Curve("reward/mean"),)),
    Panel("accuracy", "Accuracy", "fraction correct", (
        Curve("reward/accuracy", " train (sampled)"), Curve("eval/accuracy", " held-out (greedy)", "eval")),
        unit_range=True),
    Panel("entropy", "Policy entropy", "entropy (nats per token)", (Curve("entropy/mean"),)),
    Panel("clip_fraction", "Clipped tokens", "fraction of tokens clipped", (
        Curve("clip/low_frac", " low (A < 0)"), Curve("clip/high_frac", " high (A > 0)", dashed=True)),
        flat_reason=_on_policy("the ratio π/π_old is 1 and nothing is clipped"), unit_range=True),
    Panel("kl", "KL divergence", "KL (nats per token)", (
        Curve("kl/behaviour_k3", " to behaviour policy (k3)"), Curve("kl/ref", " to reference", dashed=True)),
        flat_reason=_on_policy("KL(π_old ‖ π) is 0")),
    Panel("length", "Completion length", "tokens per completion", (
        Curve("completion/length_mean", " train (sampled)"), Curve("eval/length_mean", " held-out (greedy)", "eval"))),
    Panel("grad_norm", "Gradient norm", "global L2 norm before clipping", (Curve("optim/grad_norm"),)),
)

SAC_PANELS: tuple[Panel, ...] = (
    Panel("alpha", "Entropy temperature α", "α (reward per nat of entropy)", (Curve("policy/alpha"),),
          flat_reason=_fixed_alpha),
    Panel("entropy", "Policy entropy", "entropy (nats per character)", (
        Curve("policy/entropy"), Curve("policy/target_entropy", " target", dashed=True))),
    Panel("critic_loss", "Critic loss", "TD loss (Huber, both critics summed)", (Curve("losses/critic"),)),
    Panel("coverage", "Top-p coverage", "probability mass in the backup set", (Curve("policy/top_p_coverage"),),
          flat_reason=_no_top_p, unit_range=True),
    Panel("heldout_top1", "Held-out next-character accuracy", "fraction of held-out positions", (
        Curve("quality/heldout_top1", " top-1"), Curve("quality/heldout_top3", " top-3", dashed=True)),
        unit_range=True),
    Panel("reward", "Environment reward", "reward per environment step", (Curve("reward/step"),)),
)


@dataclass(frozen=True)
class RunKind:
    name: str
    x_key: str
    x_label: str
    panels: tuple[Panel, ...]


RUN_KINDS = {
    "trainer": RunKind("trainer", "step", "RL step", TRAINER_PANELS),
    "sac": RunKind("sac", "step/updates", "gradient updates", SAC_PANELS),
}


def smooth(values: np.ndarray, window: int) -> np.ndarray:
    """Centred moving average over ``window`` points (odd), truncated at the ends (fewer points there, never a
    lone raw value that would look like a final jump). Naive equivalent::

        out[i] = mean(values[max(0, i-h) : min(n, i+h+1)]),   h = window // 2
    """
    n, h = len(values), window // 2
    csum = np.concatenate([[0.0], np.cumsum(values, dtype=np.float64)])
    idx = np.arange(n)
    lo, hi = np.maximum(0, idx - h), np.minimum(n, idx + h + 1)
    return (csum[hi] - csum[lo]) / (hi - lo)


def smoothing_window(num_points: int) -> int:
    """About 1/20 of the series, odd, at least 3 (1 = no smoothing below 10 points)."""
    if num_points < 10:
        return 1
    return max(3, (num_points // 20) | 1)


@dataclass
class Run:
    name: str
    kind: RunKind
    rows: list[dict]
    config: dict

    def series(self, curve: Curve) -> tuple[np.ndarray, np.ndarray]:
        xs, ys = [], []
        for r in self.rows:
            if self.kind.name == "trainer" and r.get("kind", "train") != curve.kind:
                continue
            try:
                x, y = float(r[self.kind.x_key]), float(r[curve.key])
            except (KeyError, TypeError, ValueError):
                continue
            if math.isfinite(y):
                xs.append(x)
                ys.append(y)
        return np.asarray(xs), np.asarray(ys)


def _known_keys(kind: RunKind) -> set[str]:
    return {c.key for p in kind.panels for c in p.curves}


def load_run(run_dir: str | os.PathLike) -> Run:
    """A run directory's records, its kind (trainer / SAC) and its saved config; InputError when it has none."""
    d = Path(run_dir)
    path = d / "metrics.jsonl"
    if not path.is_file():
        raise InputError(f"{str(run_dir)!r} has no metrics.jsonl; give the directory of an `lmpo train` or "
                         "`lmpo sac train` run (RUN_DIR, the one holding metrics.jsonl).")
    try:
        rows = read_jsonl(path)
    except json.JSONDecodeError as e:
        raise InputError(f"{path} is not JSON lines ({e}); it is not a metrics file lmpo wrote.") from e
    keys = set().union(*(r.keys() for r in rows)) if rows else set()
    kind = RUN_KINDS["sac"] if "step/updates" in keys else RUN_KINDS["trainer"]
    if not keys & _known_keys(kind) or kind.x_key not in keys:
        known = ", ".join(sorted(_known_keys(RUN_KINDS["trainer"]) | _known_keys(RUN_KINDS["sac"])))
        raise InputError(f"{path} holds {len(rows)} records but none of the metrics lmpo plot draws ({known}); "
                         "it is not the metrics file of an `lmpo train` or `lmpo sac train` run.")
    config: dict = {}
    cfg_path = stored_config_path(d)
    if cfg_path is not None:
        try:  # YAML reads JSON too; a planted object tag is refused like any damaged file (exit 2)
            config = read_yaml(cfg_path, "the run's stored config")
        except InputError as e:
            raise InputError(f"{e} The run directory is damaged; restore its config or delete it (lmpo plot then "
                             "draws the curves without the config's notes).") from None
    return Run(d.resolve().name, kind, rows, config)


def draw_panel(panel: Panel, runs: list[Run]):
    """The matplotlib figure of one panel, or None when no run logged any of its metrics."""
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7.0, 3.8))
    colors = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    series = []  # (colour index, label, curve, xs, ys)
    for i, run in enumerate(runs):
        for j, curve in enumerate(panel.curves):
            xs, ys = run.series(curve)
            if len(xs):
                # one run: a colour per curve; several: a colour per run, curves told apart by line style
                label = f"{run.name}{curve.label}" if len(runs) > 1 else (curve.label.strip() or run.name)
                series.append((i if len(runs) > 1 else j, label, curve, xs, ys))
    if not series:
        plt.close(fig)
        return None
    every = np.concatenate([ys for *_, ys in series])
    flat = bool(np.ptp(every) <= 1e-12 * max(1.0, float(np.abs(every).max())))
    windows = set()
    for color_index, label, curve, xs, ys in series:
        color = colors[color_index % len(colors)]
        style = "--" if curve.dashed else "-"
        if curve.kind == "eval" or len(xs) < 10:  # evaluations and short series: every point visible
            ax.plot(xs, ys, style, marker="o", markersize=4, linewidth=1.0, color=color, label=label)
            continue
        window = 1 if flat else smoothing_window(len(ys))
        if window > 1:
            ax.plot(xs, ys, style, color=color, alpha=0.3, linewidth=0.8)
            windows.add(window)
        ax.plot(xs, smooth(ys, window), style, color=color, linewidth=1.8, label=label)
    ax.set_title(panel.title)
    ax.set_xlabel(runs[0].kind.x_label)
    ax.set_ylabel(panel.ylabel)
    ax.grid(alpha=0.3)
    if panel.unit_range:
        lo, hi = ax.get_ylim()
        ax.set_ylim(max(lo, -0.02), min(hi, 1.02))
    ax.legend(loc="upper left", bbox_to_anchor=(1.01, 1.0), fontsize=8, frameon=False)
    notes = []
    if windows:
        notes.append("faint: raw values; solid: centred moving average over "
                     f"{' / '.join(str(w) for w in sorted(windows))} points")
    if flat:
        reasons = {panel.flat_reason(run.config) if panel.flat_reason else None for run in runs}
        reason = reasons.pop() if len(reasons) == 1 else None
        notes.append(reason or f"constant at {float(every[0]):.4g} over the whole run")
    if notes:
        ax.annotate("\n".join(textwrap.fill(n, 110) for n in notes), xy=(0.0, -0.17), xycoords="axes fraction",
                    va="top", fontsize=8, style="italic", color="0.3")
    return fig


def plot_runs(run_dirs: list[str | os.PathLike], out_dir: str | os.PathLike | None = None) -> list[Path]:
    """Draw the curves of ``run_dirs`` (all ``lmpo train`` runs or all SAC runs); returns the PNG paths written."""
    # matplotlib is imported lazily: a heavy import that runs without plots need not pay, and the Agg backend
    # has to be chosen before pyplot is first imported
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    if not run_dirs:
        raise InputError("lmpo plot needs at least one run directory.")
    runs = [load_run(d) for d in run_dirs]
    kinds = {r.kind.name for r in runs}
    if len(kinds) > 1:
        raise InputError(f"runs {[str(d) for d in run_dirs]} mix `lmpo train` and SAC runs, whose metrics share no "
                         "panel; plot them in separate calls.")
    out = Path(out_dir) if out_dir is not None else Path(run_dirs[0]) / PLOTS_DIR
    fix = "give --out another directory"
    if out_dir is None and out.is_symlink():  # RUN_DIR/plots is the run's; an --out the user names is theirs
        raise link_refused(out, fix)
    out.mkdir(parents=True, exist_ok=True)
    written = []
    for panel in runs[0].kind.panels:
        fig = draw_panel(panel, runs)
        if fig is None:
            continue
        path = out / f"{panel.stem}.png"
        try:  # never through a link planted where the PNG goes
            with os.fdopen(open_no_follow(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, fix), "wb") as fh:
                fig.savefig(fh, format="png", dpi=110, bbox_inches="tight")
        finally:
            plt.close(fig)
        written.append(path)
    return written
