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


def test_sft_stops_early_at_the_training_accuracy_target():
    import torch
    from trainer_helpers import small_model

    from lmpo.tasks import make_task
    from lmpo.trainer.config import SFTConfig
    from lmpo.trainer.run.sft import supervised_warmup

    model, tok = small_model()
    task = make_task("addition", min_digits=1, max_digits=1, num_eval=10)
    readings = iter([0.1, 0.2, 0.35, 0.9])
    cfg = SFTConfig(steps=40, lr=1e-3, seqs_per_step=4, stop_at_accuracy=0.3, check_every_steps=5)
    losses = supervised_warmup(model, tok, task, task.train_examples(0), cfg, seed=0, device=torch.device("cpu"),
                               accuracy_check=lambda: next(readings))
    assert len(losses) == 15  # checks after steps 5 (0.1), 10 (0.2), 15 (0.35 >= 0.3): stop
    cfg_no_stop = SFTConfig(steps=12, lr=1e-3, seqs_per_step=4, stop_at_accuracy=0.0, check_every_steps=5)
    assert len(supervised_warmup(model, tok, task, task.train_examples(0), cfg_no_stop, seed=0,
                                 device=torch.device("cpu"), accuracy_check=lambda: 1.0)) == 12
