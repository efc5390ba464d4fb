"""Aggregation of per-token loss terms into a scalar (SPEC §1.6).

With ℓ (B, T) per-token terms, m the mask, |y_i| = Σ_t m_it:

| mode                   | loss                                            | used by                          |
|------------------------|-------------------------------------------------|----------------------------------|
| ``token_mean``         | ``Σ_it ℓ m / N``  (N = ``num_tokens`` or Σ m)    | DAPO; TRL ``dapo``/``bnpo``        |
| ``seq_mean_token_mean``| ``(1/S) Σ_i Σ_t ℓ m / |y_i|``                    | GRPO paper; TRL ``grpo``; GSPO     |
| ``seq_mean_token_sum`` | ``(1/S) Σ_i Σ_t ℓ m``                            | verl ``seq-mean-token-sum``        |
| ``seq_sum_norm``       | ``Σ_it ℓ m / (S·L)``, L = ``norm_constant``      | Dr. GRPO (arXiv 2503.20783); TRL ``dr_grpo`` |

S = ``num_seqs`` if given, else B (every row counts, including empty ones, as TRL's ``.mean()`` does).
L defaults to T (the padded response length; pass the max completion length to match Dr. GRPO exactly
when responses are padded to less than that). Passing the global N / S of an optimizer step makes
gradient accumulation and data parallelism exact: the micro-batch losses then sum to the full-batch
loss. Empty rows contribute 0 and receive zero gradient.
"""

from __future__ import annotations

import torch

AGGREGATIONS = ("token_mean", "seq_mean_token_mean", "seq_mean_token_sum", "seq_sum_norm")


def aggregate(
    per_token: torch.Tensor,
    m: torch.Tensor,
    mode: str,
    *,
    lengths: torch.Tensor | None = None,
    num_tokens: torch.Tensor | float | None = None,
    num_seqs: torch.Tensor | float | None = None,
    norm_constant: float | None = None,
) -> torch.Tensor:
    """Scalar loss from per-token terms.

    Args:
        per_token: (B, T) or (B, 1) terms (a (B, 1) term counts once per valid token of its row).
        m: (B, T) float mask; lengths: (B,) Σ_t m (computed if None).
    Returns:
        0-dim tensor.
    """
    if mode == "token_mean":
        total = (per_token * m).sum()
        denom = m.sum().clamp(min=1.0) if num_tokens is None else num_tokens
        return total / denom
    batch = m.shape[0]
    seqs = batch if num_seqs is None else num_seqs
    row = (per_token * m).sum(-1)  # (B,)
    if mode == "seq_mean_token_mean":
        if lengths is None:
            lengths = m.sum(-1)
        return (row / lengths.clamp(min=1.0)).sum() / seqs
    if mode == "seq_mean_token_sum":
        return row.sum() / seqs
    if mode == "seq_sum_norm":
        constant = m.shape[-1] if norm_constant is None else norm_constant
        return row.sum() / (seqs * constant)
    raise ValueError(
        f"aggregation={mode!r} is not a known choice; use one of {', '.join(map(repr, AGGREGATIONS))}."
    )
