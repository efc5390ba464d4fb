"""The forwards of on-policy distillation: the policy's full next-token logits, and a teacher's beside them.

The distillation parts (``lmpo.objectives.parts.distill``) compare whole next-token distributions, so the policy's
forward keeps its (B, T, V) logits with their gradient (``completion_logits``) instead of the chunked selective
log-softmax of ``policy_logprobs``; the teacher runs without gradient on the same ids and gives its logits, or only
its top-K log-probs and their ids (``teacher_inputs``), which bounds what it holds to (B, T, K).
"""

from __future__ import annotations

import torch
from torch import nn

from .logprobs import PolicyLogprobs, position_ids_from_mask


def completion_logits(model: nn.Module, input_ids: torch.Tensor, attention_mask: torch.Tensor, response_length: int,
                      temperature: float = 1.0) -> torch.Tensor:
    """(B, T, V) float32 ``logits / τ`` at the T positions that predict the completion tokens (the last T of
    ``input_ids``), with the model's gradient.

    input_ids, attention_mask: (B, L) left-padded prompts followed by the completions.
    Plain equivalent: ``model(input_ids, attention_mask, position_ids=cumsum(mask) − 1).logits[:, -T-1:-1] / τ``.
    """
    out = model(input_ids=input_ids, attention_mask=attention_mask, position_ids=position_ids_from_mask(attention_mask),
                logits_to_keep=response_length + 1, use_cache=False)
    return out.logits[:, :-1].float() / temperature  # (B, T, V)


def policy_logits_and_logprobs(model: nn.Module, input_ids: torch.Tensor, attention_mask: torch.Tensor,
                               completion_ids: torch.Tensor, *, temperature: float = 1.0, with_entropy: bool = False
                               ) -> tuple[PolicyLogprobs, torch.Tensor]:
    """``(PolicyLogprobs(logp, entropy), logits)``: the policy's (B, T) log-probs of ``completion_ids`` (and
    entropies when asked), and its (B, T, V) ``logits / τ``, all from one forward with gradient."""
    logits = completion_logits(model, input_ids, attention_mask, completion_ids.shape[1], temperature)
    logp_all = torch.log_softmax(logits, dim=-1)  # (B, T, V)
    logp = logp_all.gather(-1, completion_ids.unsqueeze(-1)).squeeze(-1)  # (B, T)
    entropy = -(logp_all.exp() * logp_all).sum(-1) if with_entropy else None
    return PolicyLogprobs(logp, entropy), logits


@torch.no_grad()
def teacher_inputs(teacher: nn.Module, input_ids: torch.Tensor, attention_mask: torch.Tensor, response_length: int,
                   *, temperature: float = 1.0, top_k: int = 0, vocab: int | None = None) -> dict[str, torch.Tensor]:
    """The teacher's side of a distillation objective on the same ids (no gradient, eval mode).

    Returns ``{"teacher_logits": (B, T, V)}`` (logits / τ), or with ``top_k`` = K > 0
    ``{"teacher_logits": (B, T, K) top-K log-probs of softmax(logits / τ), "teacher_ids": (B, T, K)}``.
    ``vocab``: keep only the first this many logits (a teacher whose output layer is padded beyond the shared
    tokenizer's ids).
    """
    was_training = teacher.training
    teacher.eval()
    try:
        logits = completion_logits(teacher, input_ids, attention_mask, response_length, temperature)
    finally:
        teacher.train(was_training)
    if vocab is not None:
        logits = logits[..., :vocab]
    if not top_k:
        return {"teacher_logits": logits}
    top, ids = torch.log_softmax(logits, dim=-1).topk(top_k, dim=-1)  # (B, T, K) each
    return {"teacher_logits": top, "teacher_ids": ids}


__all__ = ["completion_logits", "policy_logits_and_logprobs", "teacher_inputs"]
