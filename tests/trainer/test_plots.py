"""Plots a person can read: labelled axes, raw curves faint under their moving average, legends outside the
data, notes on panels that are flat by construction; SAC runs understood; unknown directories refused."""

from __future__ import annotations

import json

import matplotlib
import numpy as np
import pytest
import yaml

from lmpo.cli import main
from lmpo.errors import InputError
from lmpo.plots import (
    SAC_PANELS,
    TRAINER_PANELS,
    draw_panel,
    load_run,
    plot_runs,
    smooth,
    smoothing_window,
)

matplotlib.use("Agg")


def test_smooth_equals_the_naive_centred_mean():
    rng = np.random.default_rng(0)
    for n, window in ((1, 3), (7, 3), (50, 5), (101, 31), (30, 101)):
        x = rng.normal(size=n)
        h = window // 2
        want = np.array([x[max(0, i - h):min(n, i + h + 1)].mean() for i in range(n)])
        np.testing.assert_allclose(smooth(x, window), want, rtol=1e-12, atol=1e-12)
    line = 0.5 * np.arange(40) - 3.0  # a straight line is left as it is away from the ends
    np.testing.assert_allclose(smooth(line, 9)[4:-4], line[4:-4], atol=1e-12)
    np.testing.assert_allclose(smooth(np.full(25, 0.7), 9), np.full(25, 0.7))
    assert smoothing_window(9) == 1 and smoothing_window(600) == 31 and smoothing_window(100) % 2 == 1


def _trainer_run(path, *, epochs=1, steps=60, clip=0.0):
    path.mkdir(parents=True)
    rng = np.random.default_rng(1)
    with open(path / "metrics.jsonl", "w") as fh:
        fh.write(json.dumps({"step": 0, "kind": "eval", "eval/accuracy": 0.2, "eval/length_mean": 3.0}) + "\n")
        for s in range(1, steps + 1):
            fh.write(json.dumps({"step": s, "kind": "train", "reward/mean": s / steps + rng.normal(0, 0.1),
                                 "reward/accuracy": 0.3, "clip/low_frac": clip, "clip/high_frac": clip,
                                 "kl/behaviour_k3": 0.0, "loss/total": "nan"}) + "\n")
        fh.write(json.dumps({"step": steps, "kind": "eval", "eval/accuracy": 0.5, "eval/length_mean": 3.5}) + "\n")
    (path / "config.yaml").write_text(yaml.safe_dump({"loop": {"epochs_per_step": epochs,
                                                               "minibatches_per_step": 1}}))
    return path


def _panel(name, panels=TRAINER_PANELS):
    return next(p for p in panels if p.stem == name)


def _notes(fig) -> str:
    return " ".join(t.get_text() for t in fig.axes[0].texts)


def test_panel_has_labels_faint_raw_curve_and_legend_outside(tmp_path):
    run = load_run(_trainer_run(tmp_path / "a"))
    fig = draw_panel(_panel("reward"), [run])
    ax = fig.axes[0]
    assert ax.get_title() == "Reward" and ax.get_xlabel() == "RL step" and "reward" in ax.get_ylabel()
    raw, smoothed = ax.lines  # the raw series, then its moving average on top
    assert raw.get_alpha() < 0.5 and (smoothed.get_alpha() is None or smoothed.get_alpha() == 1)
    assert smoothed.get_linewidth() > raw.get_linewidth()
    np.testing.assert_allclose(smoothed.get_ydata(), smooth(np.asarray(raw.get_ydata()), smoothing_window(60)))
    fig.canvas.draw()
    legend = ax.get_legend().get_window_extent()
    assert legend.x0 >= ax.get_window_extent().x1  # right of the axes: never over the data
    assert "moving average over 3 points" in _notes(fig)


def test_flat_panels_say_why(tmp_path):
    on_policy = load_run(_trainer_run(tmp_path / "on"))
    fig = draw_panel(_panel("clip_fraction"), [on_policy])
    assert "by construction" in _notes(fig) and "on-policy" in _notes(fig)
    assert "KL(π_old ‖ π) is 0" in _notes(draw_panel(_panel("kl"), [on_policy]))
    # off-policy but (here) still constant: stated as a fact, not explained away
    off_policy = load_run(_trainer_run(tmp_path / "off", epochs=2, clip=0.01))
    note = _notes(draw_panel(_panel("clip_fraction"), [off_policy]))
    assert "constant at 0.01" in note and "construction" not in note
    # the accuracy panel: sampled accuracy as a line, held-out evaluations as markers
    acc = draw_panel(_panel("accuracy"), [on_policy]).axes[0]
    assert [line.get_marker() for line in acc.lines][-1] == "o" and acc.get_ylim()[0] >= -0.02


def test_several_runs_one_colour_each(tmp_path):
    runs = [load_run(_trainer_run(tmp_path / n)) for n in ("a", "b")]
    ax = draw_panel(_panel("accuracy"), runs).axes[0]
    labels = [t.get_text() for t in ax.get_legend().get_texts()]
    assert labels == ["a train (sampled)", "a held-out (greedy)", "b train (sampled)", "b held-out (greedy)"]
    colours = {line.get_label(): line.get_color() for line in ax.lines if not line.get_label().startswith("_")}
    assert colours["a train (sampled)"] == colours["a held-out (greedy)"] != colours["b train (sampled)"]


def _sac_run(path, *, autotune=False):
    path.mkdir(parents=True)
    with open(path / "metrics.jsonl", "w") as fh:
        for k in range(1, 21):
            row = {"step/updates": 50 * k, "policy/alpha": 0.3, "policy/entropy": 2.0 - 0.05 * k,
                   "policy/target_entropy": 1.0, "losses/critic": 1.0 / k, "policy/top_p_coverage": 0.97,
                   "reward/step": 0.1 * k}
            if k % 5 == 0:
                row["quality/heldout_top1"] = 0.01 * k
            fh.write(json.dumps(row) + "\n")
    (path / "config.json").write_text(json.dumps({"sac": {"autotune_alpha": autotune, "use_top_p": True}}))
    return path


def test_sac_runs_are_understood(tmp_path):
    paths = plot_runs([_sac_run(tmp_path / "sac")], tmp_path / "png")
    assert [p.stem for p in paths] == ["alpha", "entropy", "critic_loss", "coverage", "heldout_top1", "reward"]
    run = load_run(tmp_path / "sac")
    alpha = draw_panel(_panel("alpha", SAC_PANELS), [run])
    assert alpha.axes[0].get_xlabel() == "gradient updates" and "α is fixed" in _notes(alpha)
    top1 = draw_panel(_panel("heldout_top1", SAC_PANELS), [run]).axes[0]
    np.testing.assert_allclose(top1.lines[-1].get_ydata(), [0.05, 0.10, 0.15, 0.20])
    assert "constant at 0.97" in _notes(draw_panel(_panel("coverage", SAC_PANELS), [run]))


def test_directories_without_known_metrics_are_refused(tmp_path, capsys):
    (tmp_path / "other").mkdir()
    (tmp_path / "other" / "metrics.jsonl").write_text(json.dumps({"epoch": 1, "val_loss": 0.3}) + "\n")
    with pytest.raises(InputError, match="none of the metrics lmpo plot draws"):
        plot_runs([tmp_path / "other"])
    (tmp_path / "empty").mkdir()
    (tmp_path / "empty" / "metrics.jsonl").write_text("")
    with pytest.raises(InputError, match="0 records"):
        plot_runs([tmp_path / "empty"])
    with pytest.raises(InputError, match="mix"):
        plot_runs([_trainer_run(tmp_path / "t"), _sac_run(tmp_path / "s")])
    assert main(["plot", str(tmp_path / "other")]) == 2
    assert "none of the metrics" in capsys.readouterr().err
    assert main(["plot", str(tmp_path / "nowhere")]) == 2
    assert "no metrics.jsonl" in capsys.readouterr().err
