"""Aggregation of per-token loss terms into a scalar.

With ℓ (B, T) per-token terms, m the mask, |y_i| = Σ_t m_it:

| mode                   | loss                                            | used by                          |
|------------------------|-------------------------------------------------|----------------------------------|
| ``token_mean``         | ``Σ_it ℓ m / N``  (N = ``num_tokens`` or Σ m)    | DAPO; TRL ``dapo``/``bnpo``        |
| ``seq_mean_token_mean``| ``(1/S) Σ_i Σ_t ℓ m / |y_i|``                    | GRPO paper; TRL ``grpo``; GSPO     |
| ``seq_mean_token_sum`` | ``(1/S) Σ_i Σ_t ℓ m``                            | verl ``seq-mean-token-sum``        |
| ``seq_sum_norm``       | ``Σ_it ℓ m / (S·L)``, L = ``norm_constant``      | Dr. GRPO (arXiv 2503.20783); TRL ``dr_grpo`` |
| ``seq_mean_token_sum_norm`` | the same as ``seq_sum_norm``                 | verl ``seq-mean-token-sum-norm``   |
| ``token_sum``          | ``Σ_it ℓ m``                                     | verl ``token-sum``                 |

S = ``num_seqs`` if given, else B (every row counts, including empty ones, as TRL's ``.mean()`` does).
L defaults to T (the padded response length; pass the max completion length to match Dr. GRPO exactly
when responses are padded to less than that). Passing the global N / S of an optimizer step makes
gradient accumulation and data parallelism exact: the micro-batch losses then sum to the full-batch
loss. Empty rows contribute 0 and receive zero gradient.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from .base import Part, Registry, param

AGGREGATIONS = Registry("aggregation", "Aggregation")
"""Registry of aggregations: name → part class."""


def _row_sums(per_token: torch.Tensor, m: torch.Tensor, lengths: torch.Tensor | None) -> torch.Tensor:
    """Σ_t ℓ_it m_it (B,). A (B, 1) term with the row sums of m known is one multiplication, not a (B, T) pass."""
    if per_token.shape[-1] == 1 and lengths is not None:
        return per_token.squeeze(-1) * lengths
    return (per_token * m).sum(-1)


@dataclass(frozen=True)
class Aggregation(Part):
    """Base of the aggregations: ``reduce(per_token, m, ...)`` → 0-dim loss.

    Args of ``reduce``:
        per_token: (B, T) or (B, 1) terms (a (B, 1) term counts once per valid token of its row).
        m: (B, T) float mask; lengths: (B,) Σ_t m, or None (then computed where needed).
        num_tokens / num_seqs: global counts N / S of the optimizer step (exact accumulation and DP).
        seq_lengths: (B,) the per-sequence token counts to divide by where they differ from Σ_t m (clip_cov
            zeroes the weight of a few tokens without changing the normalisers).
    """

    def reduce(self, per_token: torch.Tensor, m: torch.Tensor, *, lengths: torch.Tensor | None = None,
               num_tokens: torch.Tensor | float | None = None, num_seqs: torch.Tensor | float | None = None,
               seq_lengths: torch.Tensor | None = None) -> torch.Tensor:
        raise NotImplementedError


@AGGREGATIONS.register
@dataclass(frozen=True)
class TokenMean(Aggregation):
    """Mean over every valid token of the batch: long answers count per token."""

    name = "token_mean"
    formula = "Σ_it ℓ_it / N"
    source = "Yu et al. 2025, DAPO (arXiv 2503.14476); TRL loss_type='dapo'"

    def reduce(self, per_token, m, *, lengths=None, num_tokens=None, num_seqs=None, seq_lengths=None):
        if per_token.shape[-1] == 1:
            total = _row_sums(per_token, m, lengths).sum()
        else:
            total = (per_token * m).sum()
        denom = m.sum().clamp(min=1.0) if num_tokens is None else num_tokens
        return total / denom


@AGGREGATIONS.register
@dataclass(frozen=True)
class SeqMeanTokenMean(Aggregation):
    """Mean over sequences of each sequence's token mean: every sequence weighs the same."""

    name = "seq_mean_token_mean"
    formula = "(1/S) Σ_i (1/|y_i|) Σ_t ℓ_it"
    source = "Shao et al. 2024, DeepSeekMath (arXiv 2402.03300); TRL loss_type='grpo'"

    def reduce(self, per_token, m, *, lengths=None, num_tokens=None, num_seqs=None, seq_lengths=None):
        seqs = m.shape[0] if num_seqs is None else num_seqs
        if lengths is None and seq_lengths is None:
            lengths = m.sum(-1)
        denom = lengths if seq_lengths is None else seq_lengths
        return (_row_sums(per_token, m, lengths) / denom.clamp(min=1.0)).sum() / seqs


@AGGREGATIONS.register
@dataclass(frozen=True)
class SeqMeanTokenSum(Aggregation):
    """Mean over sequences of each sequence's token sum."""

    name = "seq_mean_token_sum"
    formula = "(1/S) Σ_i Σ_t ℓ_it"
    source = "verl loss_agg_mode='seq-mean-token-sum'"

    def reduce(self, per_token, m, *, lengths=None, num_tokens=None, num_seqs=None, seq_lengths=None):
        seqs = m.shape[0] if num_seqs is None else num_seqs
        return _row_sums(per_token, m, lengths).sum() / seqs


@AGGREGATIONS.register
@dataclass(frozen=True)
class SeqSumNorm(Aggregation):
    """Token sums divided by a constant: Dr. GRPO's length-unbiased loss."""

    name = "seq_sum_norm"
    formula = "Σ_it ℓ_it / (S·L)"
    source = "Liu et al. 2025, Dr. GRPO (arXiv 2503.20783); TRL loss_type='dr_grpo'"
    norm_constant: float | None = param(None, "the constant L (e.g. the max completion length); None: T of the batch",
                                        low=0.0, hint="Use the max completion length, e.g. 1024.")

    def reduce(self, per_token, m, *, lengths=None, num_tokens=None, num_seqs=None, seq_lengths=None):
        seqs = m.shape[0] if num_seqs is None else num_seqs
        constant = m.shape[-1] if self.norm_constant is None else self.norm_constant
        return _row_sums(per_token, m, lengths).sum() / (seqs * constant)


@AGGREGATIONS.register
@dataclass(frozen=True)
class SeqMeanTokenSumNorm(SeqSumNorm):
    """verl's name for Dr. GRPO's aggregation: token sums divided by S·L (L = verl's ``loss_scale_factor``, else T),
    so that every verl ``loss_agg_mode`` has an lmpo aggregation of the same name."""

    name = "seq_mean_token_sum_norm"
    formula = "Σ_it ℓ_it / (S·L)"
    source = "verl loss_agg_mode='seq-mean-token-sum-norm' (= Dr. GRPO's seq_sum_norm)"


@AGGREGATIONS.register
@dataclass(frozen=True)
class TokenSum(Aggregation):
    """The plain sum over every valid token of the micro-batch (no normaliser: the loss scale grows with the
    number of tokens, so the learning rate must absorb it)."""

    name = "token_sum"
    formula = "Σ_it ℓ_it"
    source = "verl loss_agg_mode='token-sum'"

    def reduce(self, per_token, m, *, lengths=None, num_tokens=None, num_seqs=None, seq_lengths=None):
        return _row_sums(per_token, m, lengths).sum()


def aggregate(per_token: torch.Tensor, m: torch.Tensor, mode: str, *, lengths: torch.Tensor | None = None,
              num_tokens: torch.Tensor | float | None = None, num_seqs: torch.Tensor | float | None = None,
              norm_constant: float | None = None) -> torch.Tensor:
    """Scalar loss from per-token terms by registry name (``norm_constant`` for the ``*_norm`` modes only)."""
    part = AGGREGATIONS[mode](norm_constant=norm_constant) if norm_constant is not None else AGGREGATIONS[mode]()
    return part.reduce(per_token, m, lengths=lengths, num_tokens=num_tokens, num_seqs=num_seqs)
