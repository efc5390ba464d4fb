"""The trainer's held-out evaluation: greedy ``eval/*`` metrics (``lmpo.eval.greedy``), pass@k / avg@n of
sampled completions (``lmpo.eval.passk``, under ``eval.samples_per_prompt``), or, for a multi-turn run
(``env.id``), greedy episodes whose ``eval/accuracy`` is the success rate (``lmpo.trainer.step.multiturn``)."""

from __future__ import annotations

from collections.abc import Callable, Sequence

import torch

from lmpo.eval.greedy import evaluate
from lmpo.eval.passk import sampled_metrics
from lmpo.trainer.config import TrainConfig
from lmpo.trainer.step import multiturn


def evaluate_policy(cfg: TrainConfig, model, tokenizer, examples: Sequence, *, accuracy_fn: Callable, scorer,
                    device: torch.device, sampled: bool = True) -> dict[str, float]:
    """``eval/*`` metrics of ``model`` on ``examples`` with the ``eval`` section's settings; ``sampled``: add
    pass@k / avg@n when ``eval.samples_per_prompt`` > 0 (``Trainer.evaluate`` asks for it on the held-out set
    only, not on the warm-up's accuracy checks)."""
    ev, ro = cfg.eval, cfg.rollout
    if cfg.env.id is not None:
        return multiturn.evaluate_episodes(model, tokenizer, cfg.env, examples, seed=cfg.loop.seed)
    max_new_tokens = ev.max_new_tokens or ro.max_new_tokens
    out = evaluate(model, tokenizer, examples, accuracy_fn=accuracy_fn, scorer=scorer, max_new_tokens=max_new_tokens,
                   seqs_per_batch=ev.seqs_per_batch, device=device, success_threshold=cfg.rewards.success_threshold)
    if sampled and ev.samples_per_prompt > 0:
        out.update(sampled_metrics(model, tokenizer, examples, accuracy_fn, samples_per_prompt=ev.samples_per_prompt,
                                   max_new_tokens=max_new_tokens, temperature=ro.temperature, top_p=ro.top_p,
                                   seed=cfg.loop.seed,
                                   prompts_per_batch=max(1, ev.seqs_per_batch // ev.samples_per_prompt),
                                   success_threshold=cfg.rewards.success_threshold))
    return out
