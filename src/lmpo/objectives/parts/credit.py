"""Token credit weights: detached per-token multipliers of the policy loss terms.

- ``temporal_decay``: ``d(t) = γ^{t−1}``, t counting valid tokens from 1; with ``normalize`` (default)
  rescaled so that ``Σ_t d(t) = |y|``. γ ∈ (0, 1]; γ = 1 is the identity.
- ``gradient_adaptive``: ``c_t = |y|·softmax_t(g_t/τ)`` over the valid tokens of a sequence,
  ``g_t = ‖∇_θ log π(y_t)‖₂`` (computed by the caller, see ``lmpo.objectives.grad_norms``). The norm only
  weights the update; it is never itself optimised.

With a sequence level (``sequence``, ``sequence_arith``) the weights sit inside the sequence mean, so the
per-token gradient term is ``s·Â·c_t·∇logπ_t`` (see ``levels.py``); other levels multiply the per-token loss
terms by them.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from ..grad_norms import GRAD_NORM_MODES
from .base import Context, Part, Registry, Tally, param

CREDITS = Registry("credit", "Token credit")
"""Registry of token credit weights: name → part class."""


def temporal_decay_weights(
    valid: torch.Tensor, lengths: torch.Tensor, gamma: float, normalize: bool = True
) -> torch.Tensor:
    """Position-decay credit ``d(t) = γ^{t−1}`` over valid tokens.

    Args:
        valid: (B, T) bool; lengths: (B,) float |y|.
    Returns:
        (B, T) detached weights, 0 at invalid positions; rows sum to |y| when ``normalize``.
    """
    m = valid.to(lengths.dtype)
    position = m.cumsum(-1)  # t of each valid token, counted from 1
    d = torch.where(valid, torch.exp((position - 1.0) * torch.log(torch.tensor(gamma, dtype=m.dtype))), 0.0)
    if normalize:
        # the first valid token has d = 1, so the row sum is ≥ 1 wherever |y| ≥ 1
        d = d * (lengths / d.sum(-1).clamp(min=1e-30)).unsqueeze(-1)
    return d.detach()


def gradient_adaptive_weights(
    token_grad_norm: torch.Tensor, valid: torch.Tensor, lengths: torch.Tensor, tau: float = 1.0
) -> torch.Tensor:
    """``c_t = |y|·softmax_t(g_t/τ)`` over the valid tokens of each row.

    Args:
        token_grad_norm: (B, T) per-token gradient norms g_t; valid: (B, T) bool; lengths: (B,) |y|.
    Returns:
        (B, T) detached weights, 0 at invalid positions, rows summing to |y| (0 for empty rows).
    """
    g = token_grad_norm.detach().to(lengths.dtype) / tau
    # a finite floor instead of −inf keeps empty rows finite (uniform softmax times |y| = 0)
    logits = torch.where(valid, g, torch.finfo(g.dtype).min)
    c = torch.softmax(logits, dim=-1) * lengths.unsqueeze(-1)
    return torch.where(valid, c, 0.0)


def high_entropy_mask(entropy: torch.Tensor, valid: torch.Tensor, num_valid: torch.Tensor, top_frac: float
                      ) -> torch.Tensor:
    """Keep the top-ρ fraction of valid tokens by entropy: ``c_t = 1[H_t ≥ q]``, q the (1−ρ)-quantile of the valid
    entropies (linear interpolation, as ``torch.quantile`` and TRL's ``get_high_entropy_mask``).

    Args:
        entropy: (B, T); valid: (B, T) bool; num_valid: 0-dim count N; top_frac: ρ ∈ [0, 1].
    Returns:
        (B, T) detached 0/1 weights in entropy's dtype. Without a host sync: the valid entropies are sorted with
        +inf at invalid positions and the quantile is read at the tensor-valued rank (N − 1)·(1 − ρ).

    Naive equivalent::

        q = torch.quantile(entropy[valid], 1 - top_frac);  c = (entropy >= q) & valid
    """
    with torch.no_grad():
        h = entropy.detach()
        ordered = torch.where(valid, h, torch.inf).reshape(-1).sort().values
        last = (num_valid.to(h.dtype) - 1.0).clamp(min=0.0)  # rank of the largest valid entropy
        rank = last * (1.0 - top_frac)
        below = rank.floor()
        above = torch.minimum(below + 1.0, last)
        q = torch.lerp(ordered[below.long()], ordered[above.long()], rank - below)
        return ((h >= q) & valid).to(h.dtype)


@dataclass(frozen=True)
class Credit(Part):
    """Base of the credit parts: ``weights(ctx)`` → (B, T) detached weights, 0 at invalid positions, or None."""

    stats = {"credit/max": "largest token credit weight (temporal decay / gradient-adaptive)"}

    def weights(self, ctx: Context) -> torch.Tensor | None:
        raise NotImplementedError

    def report(self, stats: dict[str, torch.Tensor], ctx: Context, tally: Tally) -> None:
        """``credit/max``: the largest weight of this call (``ctx.credit``, 0 at invalid positions)."""
        if ctx.credit is not None:
            stats["credit/max"] = ctx.credit.amax()


@CREDITS.register
@dataclass(frozen=True)
class NoCredit(Credit):
    """Every valid token counts alike (weight 1)."""

    name = "none"
    stats = {}
    formula = "c_t = 1"
    source = "—"

    def weights(self, ctx: Context) -> None:
        return None


@CREDITS.register
@dataclass(frozen=True)
class TemporalDecay(Credit):
    """Position decay ``d(t) = γ^{t−1}`` over valid tokens, rescaled to ``Σ_t d(t) = |y|`` when ``decay_normalize``:
    early tokens get more credit."""

    name = "temporal_decay"
    formula = "d_t ∝ γ^{t−1},  Σ_t d_t = |y|"
    source = "temporal-decay advantage shaping"
    decay_gamma: float = param(0.999, "decay γ ∈ (0, 1]; 1 disables the decay", low=0.0, high=1.0,
                               hint="γ = 1 disables the decay.")
    decay_normalize: bool = param(True, "rescale so the weights of a sequence sum to |y|")

    def weights(self, ctx: Context) -> torch.Tensor:
        return temporal_decay_weights(ctx.valid, ctx.lengths, self.decay_gamma, self.decay_normalize)


@CREDITS.register
@dataclass(frozen=True)
class GradientAdaptive(Credit):
    """``c_t = |y|·softmax_t(g_t/τ)`` from per-token gradient norms g_t (``token_grad_norm``, computed by the
    caller in mode ``grad_norm_mode``): tokens with larger gradients get more credit."""

    name = "gradient_adaptive"
    needs = frozenset({"token_grad_norm"})
    formula = "c_t = |y|·softmax_t(‖∇logπ_t‖/τ)"
    source = "gradient-adaptive importance weighting"
    grad_tau: float = param(1.0, "softmax temperature τ", low=0.0, hint="The default is 1.")
    grad_norm_mode: str = param("lm_head", "how the caller computes token_grad_norm: exact | lm_head | logits",
                                choices=GRAD_NORM_MODES)

    def weights(self, ctx: Context) -> torch.Tensor:
        return gradient_adaptive_weights(ctx.inputs["token_grad_norm"], ctx.valid, ctx.lengths, self.grad_tau)


@CREDITS.register
@dataclass(frozen=True)
class HighEntropy(Credit):
    """The 80/20 rule: only the top-ρ fraction of tokens by entropy (the "forking" tokens) carry the policy
    gradient: ``c_t = 1[H_t ≥ quantile_{1−ρ}(H)]`` over the valid tokens of the call (TRL gathers the quantile
    over all processes; here it is over the tensors passed, so pass the whole batch for the global quantile).
    The entropies are read, not differentiated, and the entropy bonus (if any) is not masked. Peer: TRL
    ``GRPOTrainer.get_high_entropy_mask`` / ``top_entropy_quantile`` (grpo_trainer.py)."""

    name = "high_entropy"
    needs = frozenset({"entropy"})
    formula = "c_t = 1[H_t ≥ quantile_{1−ρ}(H)]"
    source = "Wang et al. 2025, Beyond the 80/20 Rule (arXiv 2506.01939); TRL top_entropy_quantile"
    entropy_top_frac: float = param(0.2, "ρ: the fraction of valid tokens (highest entropy) that keep their terms",
                                    low=0.0, low_inclusive=True, high=1.0, hint="The paper keeps the top 20%: 0.2.")

    def weights(self, ctx: Context) -> torch.Tensor:
        return high_entropy_mask(ctx.inputs["entropy"], ctx.valid, ctx.num_valid, self.entropy_top_frac)
