"""The demo's pieces: its user reward function and its config (the full demo runs in `make demo`)."""

from __future__ import annotations

import pytest

from lmpo.trainer.demo import DEMO_CONFIG, demo_config, digit_match


def test_digit_match_hand_computed():
    got = digit_match(None, ["65", "64", "57", "165", "5", ""], ["65", "65", "65", "65", "65", "65"])
    # right-aligned digit agreement / the longer length: "65" 2/2; "64" 1/2 (tens agree); "57" 0/2;
    # "165" 2/3 (an extra digit); "5" 1/2 (units agree); "" 0/2
    assert got == pytest.approx([1.0, 0.5, 0.0, 2 / 3, 0.5, 0.0])


def test_demo_config_overrides():
    cfg = demo_config(run_dir="x", seed=3, preset="dapo", overrides=["--loop.steps", "5"])
    assert cfg.loop.seed == 3 and cfg.model.init_seed == 3 and cfg.objective.preset == "dapo"
    assert cfg.loop.steps == 5 and cfg.logging.run_dir == "x"
    assert cfg.sft.steps == DEMO_CONFIG["sft"]["steps"] > 0  # the demo warms up before RL
