"""Importance weights ("levels", SPEC §1.1).

With ``r_t = clamp(logp_t − old_logp_t, −C, C)`` (C = ``log_ratio_clamp``, default 20) and
``|y| = Σ_t mask_t``:

| level            | weight ρ                                                        | gradient                    |
|------------------|-----------------------------------------------------------------|-----------------------------|
| ``token``        | ``w_t = exp(r_t)``  (GRPO)                                      | through each token          |
| ``sequence``     | ``s = exp(Σ_t c_t·mask_t·r_t / |y|)`` (GSPO, arXiv 2507.18071)   | through the mean            |
| ``sequence_token``| ``exp(sg[log s] + logp_t − sg[logp_t])`` (GSPO-token)          | value s, grad s·∇logπ_t     |
| ``sequence_arith``| ``s' = Σ_t c_t·mask_t·exp(r_t) / |y|`` (AMIC, seed 000 §2.3)    | through every token ratio   |
| ``token_ema``    | ``w'_0 = 1, w'_t = (1−β)w'_{t−1} + β·w_t`` over valid tokens     | ``local`` or ``full``       |

``c_t`` are the (detached) token credit weights (all ones unless a credit mode is on). Putting them
inside the sequence mean is what makes the per-token gradient of a sequence-level objective
``s·Â·c_t·∇logπ_t / |y|`` (seed 000 §2.2/§2.5) and keeps ``sequence`` ≡ ``sequence_token`` under
per-sequence advantages. Sequence levels return ``(B, 1)`` (``sequence_token`` returns ``(B, T)``).
"""

from __future__ import annotations

import math

import torch

LEVELS = ("token", "sequence", "sequence_token", "sequence_arith", "token_ema")
SEQUENCE_LEVELS = ("sequence", "sequence_token", "sequence_arith")
EMA_GRADS = ("local", "full")

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
    """The EMA recurrence of SPEC §1.1 as a Python loop over T: the reference ``ema_scan`` must equal.

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


def importance_weight(
    level: str,
    log_ratio: torch.Tensor,
    carrier: torch.Tensor | None,
    m: torch.Tensor,
    valid: torch.Tensor,
    lengths: torch.Tensor,
    credit: torch.Tensor | None = None,
    ema_beta: float = 0.2,
    ema_grad: str = "local",
) -> tuple[torch.Tensor, torch.Tensor]:
    """Importance weight ρ for a level.

    Args:
        log_ratio: (B, T) clamped ``logp − old_logp``, 0 at invalid positions; carries gradient.
        carrier:   (B, T) ``x − sg[x]`` with x the unclamped masked log-ratio: value 0, gradient ∇logπ_t.
                   ``exp(v + carrier)`` has value e^v and gradient e^v·∇logπ_t. Needed by sequence_token
                   and token_ema with ``local`` gradient only (None otherwise).
        m:         (B, T) float mask; ``valid`` the same as bool; ``lengths`` (B,) = |y| = Σ_t m.
        credit:    (B, T) detached token credit weights or None (≡ 1).
    Returns:
        ``(rho, rho_value)``: ρ used by the trust region, (B, T) or (B, 1), and its detached value per
        token (token levels) or per sequence (sequence levels, (B, 1)), used for statistics.
    """
    if level == "token":
        rho = torch.exp(log_ratio)
        return rho, rho.detach()
    if level == "token_ema":
        w = torch.exp(log_ratio)
        if ema_grad == "full":
            rho = ema_scan(w, valid, ema_beta)
            return rho, rho.detach()
        with torch.no_grad():
            smoothed = ema_scan(w.detach(), valid, ema_beta)
        return smoothed * torch.exp(carrier), smoothed  # value w'_t, gradient w'_t·∇logπ_t
    denom = lengths.clamp(min=1.0).unsqueeze(-1)  # (B, 1); empty rows give 0/1 and no gradient
    if level == "sequence_arith":
        weighted_m = m if credit is None else m * credit
        s = (weighted_m * torch.exp(log_ratio)).sum(-1, keepdim=True) / denom
        return s, s.detach()
    # log_ratio is already 0 at invalid positions, so no mask is needed in the plain mean
    total = log_ratio if credit is None else credit * log_ratio
    log_s = total.sum(-1, keepdim=True) / denom  # (B, 1)
    if level == "sequence":
        s = torch.exp(log_s)
        return s, s.detach()
    if level == "sequence_token":
        log_s = log_s.detach()
        return torch.exp(log_s + carrier), torch.exp(log_s)  # (B, T): value s, gradient s·∇logπ_t
    raise ValueError(f"level={level!r} is not a known choice; use one of {', '.join(map(repr, LEVELS))}.")
