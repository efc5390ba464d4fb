"""Padding-free packing of the training forward: every sequence's real tokens in one row, no pad computed.

A batch of B left-padded prompts followed by right-padded completions costs B·L positions in every layer, however
short most sequences are. Packed, the real tokens of all B sequences are laid end to end in one row of
N = Σ_b |x_b| + |y_b| positions, with position ids that restart at 0 for each sequence; given no attention mask,
Hugging Face models read the restarts as sequence boundaries and attend block-diagonally (a causal mask per
sequence: SDPA with that mask on CPU, the variable-length flash-attention kernel with
``attn_implementation="flash_attention_2"`` on GPU). Only the logits of the T·B positions that predict completion
tokens are computed (``logits_to_keep`` as indices), then the chunked selective log-softmax of
:mod:`lmpo.generation.logprobs`.

Plain equivalent: :func:`lmpo.generation.policy_logprobs` on the padded batch (same log-probs up to float rounding;
a test checks it in float64, values and gradients).
"""

from __future__ import annotations

import torch
from torch import nn

from .logprobs import PolicyLogprobs, position_ids_from_mask, token_logprobs


def pack(input_ids: torch.Tensor, attention_mask: torch.Tensor, response_length: int
         ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """``(ids (1, N), position_ids (1, N), predict (B, T))`` of a padded batch.

    input_ids, attention_mask: (B, L) with the completion in the last T = ``response_length`` columns.
    ``predict[b, t]`` is the packed index of the position whose logits predict completion token t of sequence b
    (the token before it); 0 where that completion token is padding (mask it).
    """
    keep = attention_mask.bool()
    ids = input_ids[keep].unsqueeze(0)  # (1, N): row-major, so sequence after sequence
    positions = position_ids_from_mask(attention_mask)[keep].unsqueeze(0)  # (1, N), 0 at each sequence's start
    index = attention_mask.reshape(-1).long().cumsum(0).reshape(attention_mask.shape) - 1  # (B, L) packed index
    predict = (index[:, -response_length:] - 1).clamp(min=0)  # (B, T)
    predict = torch.where(keep[:, -response_length:], predict, 0)
    return ids, positions, predict


def packed_forward(model: nn.Module, input_ids: torch.Tensor, attention_mask: torch.Tensor,
                   completion_ids: torch.Tensor, *, temperature: float = 1.0, with_entropy: bool = False,
                   chunk_rows: int | None = None) -> PolicyLogprobs:
    """(B, T) log-probs (and entropies) of ``completion_ids`` from one packed forward (with the model's gradient).

    Every sequence needs at least one prompt token (the first completion token is predicted from it).
    """
    B, T = completion_ids.shape
    if bool((attention_mask[:, :-T].sum(-1) == 0).any()):
        raise ValueError("packing needs at least one prompt token per sequence")
    ids, positions, predict = pack(input_ids, attention_mask, T)
    out = model(input_ids=ids, position_ids=positions, attention_mask=None, use_cache=False,
                logits_to_keep=predict.reshape(-1))
    logits = out.logits.reshape(B, T, -1)  # (B, T, V), made for this call alone
    logp, entropy = token_logprobs(logits, completion_ids, temperature, with_entropy, chunk_rows)
    return PolicyLogprobs(logp, entropy)


def packed_policy_logprobs(model: nn.Module, input_ids: torch.Tensor, attention_mask: torch.Tensor,
                           completion_ids: torch.Tensor, *, temperature: float = 1.0, with_entropy: bool = False,
                           with_grad: bool = True, seqs_per_microbatch: int | None = None,
                           chunk_rows: int | None = None) -> PolicyLogprobs:
    """:func:`lmpo.generation.policy_logprobs` through :func:`packed_forward`: with the gradient in one forward, or
    without it in eval mode and microbatches of ``seqs_per_microbatch`` sequences (behaviour / reference)."""
    if with_grad:
        return packed_forward(model, input_ids, attention_mask, completion_ids, temperature=temperature,
                              with_entropy=with_entropy, chunk_rows=chunk_rows)
    B = input_ids.shape[0]
    step = seqs_per_microbatch or B
    was_training = model.training
    model.eval()
    parts = []
    try:
        with torch.no_grad():
            for s in range(0, B, step):
                parts.append(packed_forward(model, input_ids[s:s + step], attention_mask[s:s + step],
                                            completion_ids[s:s + step], temperature=temperature,
                                            with_entropy=with_entropy, chunk_rows=chunk_rows))
    finally:
        model.train(was_training)
    return PolicyLogprobs(torch.cat([p.logp for p in parts]),
                          torch.cat([p.entropy for p in parts]) if with_entropy else None)


__all__ = ["pack", "packed_forward", "packed_policy_logprobs"]
