"""Greedy evaluation on a task's held-out split: accuracy and mean reward."""

from __future__ import annotations

from collections.abc import Callable, Sequence

import torch

from lmpo.tasks import Example


def greedy_completions(model, tokenizer, prompts: Sequence[str], *, max_new_tokens: int, seqs_per_batch: int,
                       device: torch.device) -> tuple[list[str], list[int]]:
    """Greedy completions (text up to EOS) and their token lengths (EOS included when produced)."""
    from lmpo.generation import HFRollout

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
    prompts = [e.prompt for e in examples]
    answers = [e.answer for e in examples]
    texts, lengths = greedy_completions(model, tokenizer, prompts, max_new_tokens=max_new_tokens,
                                        seqs_per_batch=seqs_per_batch, device=device)
    columns = _meta_columns(examples)
    acc_values = accuracy_fn(prompts=prompts, completions=texts, answer=answers, **columns)
    correct = [v is not None and float(v) >= success_threshold for v in acc_values]
    out = {"eval/accuracy": sum(correct) / max(1, len(correct)),
           "eval/length_mean": sum(lengths) / max(1, len(lengths))}
    if scorer is not None:
        total, _ = scorer.score(prompts, texts, answers, **columns)
        out["eval/reward_mean"] = float(total.mean())
    return out


def _meta_columns(examples: Sequence[Example]) -> dict[str, list]:
    """Per-sample meta columns (TRL style keyword lists) shared by every example."""
    if not examples:
        return {}
    keys = set(examples[0].meta)
    for e in examples[1:]:
        keys &= set(e.meta)
    return {k: [e.meta[k] for e in examples] for k in sorted(keys) if k not in ("prompts", "completions", "answer")}
