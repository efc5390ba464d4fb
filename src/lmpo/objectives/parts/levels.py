"""Importance weights ("levels"): how the per-token ratios π/π_old become the weight ρ the trust region sees.

With ``r_t = clamp(logp_t − old_logp_t, −C, C)`` (C = ``log_ratio_clamp``, default 20) and
``|y| = Σ_t mask_t``:

| level            | weight ρ                                                        | gradient                    |
|------------------|-----------------------------------------------------------------|-----------------------------|
| ``token``        | ``w_t = exp(r_t)``  (GRPO)                                      | through each token          |
| ``sequence``     | ``s = exp(Σ_t c_t·mask_t·r_t / |y|)`` (GSPO, arXiv 2507.18071)   | through the mean            |
| ``sequence_token``| ``exp(sg[log s] + logp_t − sg[logp_t])`` (GSPO-token)          | value s, grad s·∇logπ_t     |
| ``sequence_arith``| ``s' = Σ_t c_t·mask_t·exp(r_t) / |y|`` (AMIC)                   | through every token ratio   |
| ``token_ema``    | ``w'_0 = 1, w'_t = (1−β)w'_{t−1} + β·w_t`` over valid tokens     | ``local`` or ``full``       |
| ``sequence_clipped``| ``exp(Σ_t c_t·clip_sgn(A)(r_t) / |y|)`` (GMPO, arXiv 2507.20673)| through the unclipped tokens |

``c_t`` are the (detached) token credit weights (all ones unless a credit mode is on). Putting them
inside the sequence mean is what makes the per-token gradient of a sequence-level objective
``s·Â·c_t·∇logπ_t / |y|`` and keeps ``sequence`` ≡ ``sequence_token`` under
per-sequence advantages. Sequence levels return ``(B, 1)`` (``sequence_token`` returns ``(B, T)``).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import ClassVar

import torch

from .base import Context, Part, Registry, param

LEVELS = Registry("level", "Importance weight")
"""Registry of importance levels: name → part class."""

# Largest rescaling factor (1−β)^{−n} allowed inside one scan block. Terms of the scaled sum are at most
# β·e^{20}·1e25 ≈ 5e33 and a block adds up at most 256 of them, which stays below float32's 3.4e38.
_EMA_MAX_RESCALE_LOG = math.log(1e25)
_EMA_MAX_BLOCK = 256


def ema_block_size(beta: float) -> int:
    """Scan block length for smoothing factor β: the longest block whose (1−β)^{−n} stays ≤ 1e25."""
    if beta >= 1.0:
        return _EMA_MAX_BLOCK
    decay_log = -math.log1p(-beta)  # −log(1−β) > 0
    return int(max(1, min(_EMA_MAX_BLOCK, math.floor(_EMA_MAX_RESCALE_LOG / decay_log))))


def ema_loop(weights: torch.Tensor, valid: torch.Tensor, beta: float) -> torch.Tensor:
    """The EMA recurrence as a Python loop over T: the reference ``ema_scan`` must equal.

    (B, T) weights, (B, T) bool valid → (B, T); differentiable. O(T) interpreter steps: for tests and
    benchmarks only.
    """
    state = torch.ones(weights.shape[0], dtype=weights.dtype, device=weights.device)
    out = []
    for t in range(weights.shape[1]):
        state = torch.where(valid[:, t], (1 - beta) * state + beta * weights[:, t], state)
        out.append(state)
    return torch.stack(out, dim=-1)


def ema_scan(weights: torch.Tensor, valid: torch.Tensor, beta: float, block_size: int | None = None) -> torch.Tensor:
    """Masked exponential moving average along the last dim, vectorised as a blocked scan.

    Args:
        weights: (B, T) positive inputs w_t (finite; the caller clamps log-ratios so w ∈ [e^{−20}, e^{20}]).
        valid:   (B, T) bool (or 0/1); at invalid positions the state is carried unchanged.
        beta:    smoothing factor β ∈ (0, 1].
    Returns:
        (B, T) smoothed weights w'_t. Differentiable with respect to ``weights`` (autograd runs through
        the whole recurrence).

    Naive equivalent (what the tests compare against)::

        state = ones(B)
        for t in range(T):
            state = where(valid[:, t], (1 - beta) * state + beta * weights[:, t], state)
            out[:, t] = state

    Method: with ``a = 1−β`` and ``n_j`` the count of valid tokens from the block start to j,
    ``y_j = a^{n_j}·(carry + β·Σ_{s≤j} w_s·valid_s·a^{−n_s})``. The block length keeps ``a^{−n} ≤ 1e25`` so
    nothing overflows (every term is positive, so there is no cancellation either); blocks are computed
    all at once and only the scalar carry per row runs through a loop over T/block blocks.
    """
    batch, length = weights.shape
    if valid.dtype != torch.bool:
        valid = valid != 0
    if beta >= 1.0:
        # w'_t = w_t at valid tokens; invalid tokens repeat the last valid value (1 before the first).
        idx = torch.arange(length, device=weights.device).expand(batch, length)
        last = torch.where(valid, idx, torch.full_like(idx, -1)).cummax(dim=-1).values
        padded = torch.cat([weights.new_ones(batch, 1), weights], dim=-1)
        return padded.gather(-1, last + 1)
    block = block_size or ema_block_size(beta)
    num_blocks = -(-length // block)
    pad = num_blocks * block - length
    needs_grad = weights.requires_grad and torch.is_grad_enabled()
    v = valid.to(weights.dtype, copy=True)  # a private buffer: modified in place below
    # w_t·valid_t (β is applied once at the end); under autograd `v` must stay untouched, so use where
    x = torch.where(valid, weights, 0.0) if needs_grad else weights * v
    if pad:
        x = torch.nn.functional.pad(x, (0, pad))
        v = torch.nn.functional.pad(v, (0, pad))
    x = x.view(batch, num_blocks, block)  # (B, nb, C)
    # The decays depend only on the mask: computed in place, without autograd. On a busy CPU the fresh
    # allocations (first-touch page faults) cost more than the arithmetic, so the no-grad path reuses
    # two buffers throughout.
    with torch.no_grad():
        inv_decay = v.view(batch, num_blocks, block).mul_(math.log1p(-beta)).cumsum_(-1).neg_().exp_()  # a^{−n_j}
    if needs_grad:
        scaled = (x * inv_decay).cumsum(-1)  # Σ_{s≤j} w_s a^{−n_s}
        decay = inv_decay.reciprocal()  # a^{n_j} ∈ [1e-25, 1]
    else:
        scaled = x.mul_(inv_decay).cumsum_(-1)
        decay = inv_decay.reciprocal_()
    block_decay = decay[..., -1]  # (B, nb)
    block_sum = scaled[..., -1]
    carries = []
    carry = weights.new_ones(batch)
    for k in range(num_blocks):  # carry into block k; T/C iterations on (B,) tensors
        carries.append(carry)
        carry = block_decay[:, k] * (carry + beta * block_sum[:, k])
    carry_in = torch.stack(carries, dim=-1).unsqueeze(-1)  # (B, nb, 1)
    if needs_grad:
        out = decay * (beta * scaled + carry_in)
    else:
        out = scaled.mul_(beta).add_(carry_in).mul_(decay)
    return out.view(batch, num_blocks * block)[:, :length]


@dataclass(frozen=True)
class Level(Part):
    """Base of the importance levels. ``weight(ctx)`` returns ``(rho, rho_value)``: the weight the trust region
    sees, (B, T) or (B, 1) with its gradient, and its detached value per token (token levels) or per sequence
    ((B, 1), sequence levels) for the statistics."""

    per_sequence: ClassVar[bool] = False
    """A sequence-level weight (GSPO family): one ratio per sequence."""
    credit_inside: ClassVar[bool] = False
    """Whether the level puts the credit weights c_t inside its sequence mean (else the objective multiplies
    the per-token loss terms by them)."""
    unit_off_mask: ClassVar[bool] = False
    """The weight's value is ``exp(r_t)`` per token (exactly 1 at masked positions, where r = 0), so statistics
    can reuse it instead of exponentiating the log-ratios again."""

    def weight(self, ctx: Context) -> tuple[torch.Tensor, torch.Tensor]:
        raise NotImplementedError


def _seq_denominator(ctx: Context) -> torch.Tensor:
    return ctx.lengths.clamp(min=1.0).unsqueeze(-1)  # (B, 1); empty rows give 0/1 and no gradient


@LEVELS.register
@dataclass(frozen=True)
class Token(Level):
    """GRPO's token ratio ``w_t = exp(r_t)``; the gradient flows through each token."""

    name = "token"
    formula = "w_t = exp(r_t)"
    source = "Shao et al. 2024, DeepSeekMath (arXiv 2402.03300)"
    unit_off_mask = True

    def weight(self, ctx: Context) -> tuple[torch.Tensor, torch.Tensor]:
        rho = torch.exp(ctx.log_ratio)
        return rho, rho.detach()


@LEVELS.register
@dataclass(frozen=True)
class Sequence(Level):
    """GSPO's sequence ratio, the geometric mean of the token ratios: ``s = exp(Σ_t c_t·r_t / |y|)``,
    broadcast over the sequence; the gradient flows through the mean."""

    name = "sequence"
    formula = "s = exp(Σ_t c_t·r_t / |y|)"
    source = "Zheng et al. 2025, GSPO (arXiv 2507.18071)"
    per_sequence = True
    credit_inside = True

    def weight(self, ctx: Context) -> tuple[torch.Tensor, torch.Tensor]:
        # log_ratio is already 0 at invalid positions, so no mask is needed in the plain mean
        total = ctx.log_ratio if ctx.credit is None else ctx.credit * ctx.log_ratio
        s = torch.exp(total.sum(-1, keepdim=True) / _seq_denominator(ctx))  # (B, 1)
        return s, s.detach()


@LEVELS.register
@dataclass(frozen=True)
class SequenceToken(Level):
    """GSPO-token: value the sequence ratio s, gradient per token: ``exp(sg[log s] + logp_t − sg[logp_t])``
    (allows token-level advantages; equals ``sequence`` in gradient under per-sequence advantages)."""

    name = "sequence_token"
    formula = "ŝ_t = sg[s]·π_t / sg[π_t]"
    source = "Zheng et al. 2025, GSPO-token (arXiv 2507.18071)"
    per_sequence = True

    def weight(self, ctx: Context) -> tuple[torch.Tensor, torch.Tensor]:
        total = ctx.log_ratio if ctx.credit is None else ctx.credit * ctx.log_ratio
        log_s = (total.sum(-1, keepdim=True) / _seq_denominator(ctx)).detach()
        return torch.exp(log_s + ctx.carrier), torch.exp(log_s)  # (B, T): value s, gradient s·∇logπ_t


@LEVELS.register
@dataclass(frozen=True)
class SequenceArith(Level):
    """AMIC: the arithmetic mean of the token ratios, ``s' = Σ_t c_t·mask_t·exp(r_t) / |y|`` (≥ GSPO's
    geometric mean, equal when a sequence's ratios are equal); the gradient flows through every ratio."""

    name = "sequence_arith"
    formula = "s' = Σ_t c_t·w_t / |y|"
    source = "arithmetic-mean importance correction (AMIC)"
    per_sequence = True
    credit_inside = True

    def weight(self, ctx: Context) -> tuple[torch.Tensor, torch.Tensor]:
        weighted_m = ctx.m if ctx.credit is None else ctx.m * ctx.credit
        s = (weighted_m * torch.exp(ctx.log_ratio)).sum(-1, keepdim=True) / _seq_denominator(ctx)
        return s, s.detach()


@LEVELS.register
@dataclass(frozen=True)
class TokenEMA(Level):
    """Token ratios smoothed along the sequence: ``w'_0 = 1``, ``w'_t = (1−β)·w'_{t−1} + β·w_t`` over valid
    tokens (masked positions carry the state). ``β = 1`` is exactly ``token``.

    Gradient ``local`` (default): value w'_t, gradient w'_t·∇logπ_t (``sg[w'_t]·exp(logp_t − sg[logp_t])``);
    ``full``: autograd through the recurrence. Vectorised as a blocked scan (``ema_scan``), stable for T ≥ 32k.
    """

    name = "token_ema"
    formula = "w'_t = (1−β)·w'_{t−1} + β·w_t"
    source = "temporal EMA smoothing of token importance weights"
    ema_beta: float = param(0.2, "smoothing factor β; 1 is the token level, small β smooths more",
                            low=0.0, high=1.0, hint="β = 1 is the token level; small β smooths more.")
    ema_grad: str = param("local", "gradient: local (w'_t·∇logπ_t) | full (through the recurrence)",
                          choices=("local", "full"))

    def weight(self, ctx: Context) -> tuple[torch.Tensor, torch.Tensor]:
        w = torch.exp(ctx.log_ratio)
        if self.ema_grad == "full":
            rho = ema_scan(w, ctx.valid, self.ema_beta)
            return rho, rho.detach()
        with torch.no_grad():
            smoothed = ema_scan(w.detach(), ctx.valid, self.ema_beta)
        # 1 + carrier is exp(carrier) in value (1) and gradient (∇logπ_t) without the exp
        return smoothed * (1.0 + ctx.carrier), smoothed  # value w'_t, gradient w'_t·∇logπ_t


@LEVELS.register
@dataclass(frozen=True)
class SequenceClipped(Level):
    """GMPO's sequence weight: the geometric mean of sign-aware clipped token ratios::

        s = exp(Σ_t c_t·r̃_t / |y|),   r̃_t = min(r_t, ε_high) if A_t > 0,  max(r_t, −ε_low) if A_t < 0,  0 if A_t = 0

    (``r_t`` the token log-ratio, the clip in log space: ratios in [e^{−ε_low}, e^{ε_high}]). Each token is clipped
    only in the direction its advantage pushes it, before the mean, so one extreme token cannot move the
    sequence weight and a clipped token contributes no gradient; the geometric mean is less sensitive to
    outliers than GRPO's arithmetic mean of token terms. With ``trust_region="none"`` this is GMPO:
    ``ℓ_i = −A_i·s_i``. Peer: verl ``compute_policy_loss_geo_mean`` (trainer/ppo/core_algos.py), which does not
    clamp the log-ratios to ±20 first (lmpo does, like every level).
    """

    name = "sequence_clipped"
    formula = "s = exp(Σ_t c_t·clip_sgn(A)(r_t) / |y|)"
    source = "GMPO, geometric-mean policy optimization (arXiv 2507.20673); verl compute_policy_loss_geo_mean"
    per_sequence = True
    credit_inside = True
    log_clip_low: float = param(0.4, "ε_low: log-ratios of A < 0 tokens are clipped at −ε_low", low=0.0,
                                hint="GMPO uses 0.4 (ratios in [e^-0.4, e^0.4]).")
    log_clip_high: float = param(0.4, "ε_high: log-ratios of A > 0 tokens are clipped at ε_high", low=0.0,
                                 hint="GMPO uses 0.4.")

    def weight(self, ctx: Context) -> tuple[torch.Tensor, torch.Tensor]:
        adv = ctx.adv
        # one clamp with per-row (or per-token) bounds: ±inf where the sign does not bind
        lower = torch.where(adv < 0, adv.new_tensor(-self.log_clip_low), adv.new_tensor(-math.inf))
        upper = torch.where(adv > 0, adv.new_tensor(self.log_clip_high), adv.new_tensor(math.inf))
        clipped = torch.clamp(ctx.log_ratio, min=lower, max=upper) * (adv != 0)
        if ctx.credit is not None:
            clipped = clipped * ctx.credit
        s = torch.exp(clipped.sum(-1, keepdim=True) / _seq_denominator(ctx))  # (B, 1)
        return s, s.detach()
