"""Greedy evaluation on a task's held-out split: accuracy (with a 95% Wilson interval) and mean reward."""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence

import torch

from lmpo.generation import HFRollout
from lmpo.rewards.scorer import reward_arguments
from lmpo.tasks import Example


def nonfinite_parameters(model: torch.nn.Module) -> list[str]:
    """Names of the parameters that hold a NaN or an infinity: such a model's every output is garbage (greedy
    decoding of NaN logits picks token 0), which an evaluation would report as a plain 0 accuracy."""
    return [name for name, p in model.named_parameters() if not bool(torch.isfinite(p).all())]


def greedy_completions(model, tokenizer, prompts: Sequence[str], *, max_new_tokens: int, seqs_per_batch: int,
                       device: torch.device) -> tuple[list[str], list[int]]:
    """Greedy completions (text up to EOS) and their token lengths (EOS included when produced)."""
    engine = HFRollout(model, tokenizer, max_new_tokens=max_new_tokens, temperature=0.0)
    texts: list[str] = []
    lengths: list[int] = []
    for start in range(0, len(prompts), seqs_per_batch):
        ro = engine.generate(list(prompts[start:start + seqs_per_batch]), 1, greedy=True)
        texts.extend(ro.completions)
        lengths.extend(ro.completion_mask.sum(-1).tolist())
    return texts, lengths


def evaluate(model, tokenizer, examples: Sequence[Example], *, accuracy_fn: Callable, scorer=None,
             max_new_tokens: int, seqs_per_batch: int, device: torch.device, success_threshold: float = 1.0
             ) -> dict[str, float]:
    """Greedy held-out metrics: ``eval/accuracy``, ``eval/reward_mean`` (when a scorer is given), ``eval/length_mean``."""
    texts, lengths = greedy_completions(model, tokenizer, [e.prompt for e in examples],
                                        max_new_tokens=max_new_tokens, seqs_per_batch=seqs_per_batch, device=device)
    correct = judge(examples, texts, accuracy_fn, success_threshold)
    out = {"eval/accuracy": sum(correct) / max(1, len(correct)),
           "eval/length_mean": sum(lengths) / max(1, len(lengths))}
    if scorer is not None:
        prompts, completions, answers, columns = reward_arguments(examples, texts)
        total, _ = scorer.score(prompts, completions, answers, **columns)
        out["eval/reward_mean"] = float(total.mean())
    return out


def judge(examples: Sequence[Example], texts: Sequence[str], accuracy_fn: Callable,
          success_threshold: float = 1.0) -> list[bool]:
    """Per example: is the completion correct (``accuracy_fn``'s value defined and ``>= success_threshold``)?"""
    prompts, completions, answers, columns = reward_arguments(examples, texts)
    values = accuracy_fn(prompts=prompts, completions=completions, answer=answers, **columns)
    return [v is not None and float(v) >= success_threshold for v in values]


#: the standard normal quantile of a two-sided 95% interval
Z_95 = 1.959963984540054


def wilson_interval(successes: int, n: int, z: float = Z_95) -> tuple[float, float]:
    """Wilson score interval of a binomial proportion (95% for the default ``z``)::

        centre = (p̂ + z²/2n) / (1 + z²/n),   half = z·sqrt(p̂(1−p̂)/n + z²/4n²) / (1 + z²/n),   p̂ = k/n

    Unlike the normal approximation p̂ ± z·sqrt(p̂(1−p̂)/n) it stays inside [0, 1] and is not empty at k = 0
    or k = n (Wilson 1927; Brown, Cai & DasGupta 2001 recommend it for small n).
    """
    if n <= 0:
        raise ValueError(f"wilson_interval needs n >= 1 trials, got {n}")
    if not 0 <= successes <= n:
        raise ValueError(f"successes={successes} must be in [0, n={n}]")
    p = successes / n
    denom = 1 + z * z / n
    centre = (p + z * z / (2 * n)) / denom
    half = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / denom
    return max(0.0, centre - half), min(1.0, centre + half)
