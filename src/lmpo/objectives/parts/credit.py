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
from .base import Context, Part, Registry, param

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


@dataclass(frozen=True)
class Credit(Part):
    """Base of the credit parts: ``weights(ctx)`` → (B, T) detached weights, 0 at invalid positions, or None."""

    stats = {"credit/max": "largest token credit weight (temporal decay / gradient-adaptive)"}

    def weights(self, ctx: Context) -> torch.Tensor | None:
        raise NotImplementedError


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
