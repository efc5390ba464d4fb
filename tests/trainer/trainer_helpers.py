"""Helpers for the trainer tests: a very small model and run configs that take a second or two."""

from __future__ import annotations

import pytest

from lmpo.models import CharTokenizer, build_tiny_model
from lmpo.trainer import Trainer
from lmpo.trainer.config import config_from_dict

SMALL_MODEL = {"hidden_size": 32, "num_layers": 1, "num_heads": 2, "intermediate_size": 64}


def small_model(seed: int = 0):
    tok = CharTokenizer()
    return build_tiny_model(tok, seed=seed, **SMALL_MODEL), tok


def small_config(run_dir, preset: str = "grpo", **sections):
    base = {
        "task": {"name": "addition", "options": {"min_digits": 1, "max_digits": 1, "num_eval": 20},
                 "eval_examples": 8},
        "rollout": {"completions_per_prompt": 4, "max_new_tokens": 3},
        "objective": {"preset": preset},
        # an untrained model is never right; the length term makes rewards differ inside groups (signal)
        "rewards": {"functions": ["exact_match", "length_penalty"], "weights": [1.0, 1.0],
                    "kwargs": {"length_penalty": {"target_chars": 0, "scale_chars": 3.0}}},
        "optim": {"lr": 1e-2},
        "loop": {"steps": 2, "prompts_per_step": 3, "seqs_per_microbatch": 6, "seed": 0, "device": "cpu"},
        "eval": {"at_start": False, "seqs_per_batch": 8},
        "checkpoint": {"at_end": False},
        "logging": {"run_dir": str(run_dir), "progress_bar": False, "tensorboard": False, "plots": False},
    }
    for name, values in sections.items():
        base[name] = {**base.get(name, {}), **values}
    return config_from_dict(base)


def make_trainer(run_dir, preset: str = "grpo", seed: int = 0, **sections):
    from lmpo.trainer import Trainer

    model, tok = small_model(seed)
    return Trainer(small_config(run_dir, preset, **sections), model=model, tokenizer=tok, log=lambda msg: None)


def train_killed_in_step(trainer, step: int) -> None:
    """``trainer.train()`` interrupted as RL step ``step`` starts (a kill after step − 1's checkpoint)."""
    real_step = Trainer.rl_step

    def crash(self, s):
        if s == step:
            raise KeyboardInterrupt(f"simulated kill during step {step}")
        return real_step(self, s)

    Trainer.rl_step = crash
    try:
        with pytest.raises(KeyboardInterrupt):
            trainer.train()
    finally:
        Trainer.rl_step = real_step


def set_loss_hook(trainer, hook) -> None:
    """Apply ``hook(rl_step, loss) -> loss`` to every microbatch loss of ``trainer`` (NaN injection, a Ctrl-C or an
    error raised mid-step): wraps its ``update`` (to know the RL step) and its objective driver's ``loss``."""
    step = [0]
    real_update, real_loss = trainer.update, trainer.driver.loss

    def update(rl_step, batch):
        step[0] = rl_step
        return real_update(rl_step, batch)

    def loss(*args, **kwargs):
        return hook(step[0], real_loss(*args, **kwargs))

    trainer.update, trainer.driver.loss = update, loss
