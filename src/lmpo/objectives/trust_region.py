"""Trust regions (SPEC §1.2): turn an importance weight ρ and an advantage A into a per-token loss term.

| mode          | per-token loss                                                         | source              |
|---------------|------------------------------------------------------------------------|---------------------|
| ``ppo``       | ``−min(ρA, clip(ρ, 1−ε_low, 1+ε_high)·A)``, ε_low = ε_high = 0.2       | PPO, arXiv 1707.06347 |
| ``clip_higher``| same, ε_low = 0.2, ε_high = 0.28                                      | DAPO, arXiv 2503.14476 |
| ``sign_asym`` | same with ε = ε_pos if A > 0 else ε_neg (0.28 / 0.2)                    | seed 000 §2.6       |
| ``gaussian``  | ``−φ(ρ)·ρ·A``, ``φ(ρ) = exp(−(ρ−1)²/(2σ²))``, σ = 0.5                  | PTRW, seed 000 §2.4 |
| ``none``      | ``−ρA``                                                                |                     |

``dual_clip`` (any clipped mode): for A < 0 the loss is capped at ``−c·A`` (c = 3), so a very large ratio
on a bad sample cannot produce an unbounded push (Ye et al. 2020, arXiv 1912.09729).

Equivalence: under the ``min`` form, ``sign_asym(ε_pos, ε_neg)`` ≡ ``clip_higher(ε_high=ε_pos,
ε_low=ε_neg)``. For A > 0, ``min(ρA, clip(ρ)A) = A·min(ρ, 1+ε)`` so only the upper bound binds; for A < 0
it is ``A·max(ρ, 1−ε)`` so only the lower bound binds. The sign choice of ε therefore just picks which
bound is used, exactly as clip_higher's decoupled bounds do.

PTRW gradient: ``d/dρ [φ(ρ)·ρ] = φ(ρ)·(1 − ρ(ρ−1)/σ²)``, so with ``ptrw_grad="full"`` the gradient
changes sign once ``ρ(ρ−1) > σ²`` (for σ = 0.5 and ρ > 0: once ρ > (1+√2)/2 ≈ 1.207): far
off-policy samples are pushed back, not merely down-weighted. ``detach_phi`` keeps φ as a pure
weight: gradient ``φ(ρ)·A·∇ρ``, never sign-flipped.
"""

from __future__ import annotations

import torch

TRUST_REGIONS = ("ppo", "clip_higher", "sign_asym", "gaussian", "none")
CLIPPED_TRUST_REGIONS = ("ppo", "clip_higher", "sign_asym")
PTRW_GRADS = ("full", "detach_phi")


def clip_bounds(
    trust_region: str, eps_low: float, eps_high: float, eps_pos: float, eps_neg: float
) -> tuple[float, float]:
    """The (lower, upper) ratio bounds that can bind: for sign_asym only 1−ε_neg (A<0) and 1+ε_pos (A>0)."""
    if trust_region == "sign_asym":
        return 1.0 - eps_neg, 1.0 + eps_pos
    return 1.0 - eps_low, 1.0 + eps_high


def trust_region_loss(
    rho: torch.Tensor,
    adv: torch.Tensor,
    trust_region: str,
    *,
    eps_low: float = 0.2,
    eps_high: float = 0.2,
    eps_pos: float = 0.28,
    eps_neg: float = 0.2,
    dual_clip: bool = False,
    dual_clip_c: float = 3.0,
    ptrw_sigma: float = 0.5,
    ptrw_grad: str = "full",
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Per-token policy loss term.

    Args:
        rho: (B, T) or (B, 1) importance weight; adv: (B, T) or (B, 1) advantages (broadcastable).
    Returns:
        ``(loss, phi)`` with ``loss`` of the broadcast shape of rho and adv, and ``phi`` the detached PTRW
        weight for the gaussian mode (None otherwise).
    """
    if trust_region in CLIPPED_TRUST_REGIONS:
        if trust_region == "sign_asym":
            eps = torch.where(adv > 0, eps_pos, eps_neg)
            clipped = torch.clamp(rho, 1.0 - eps, 1.0 + eps)
        else:
            clipped = torch.clamp(rho, 1.0 - eps_low, 1.0 + eps_high)
        loss = torch.maximum(-rho * adv, -clipped * adv)
        if dual_clip:
            # A < 0: cap at −c·A (a positive number), the lower the better for a large ρ on a bad sample
            loss = torch.where(adv < 0, torch.minimum(loss, -dual_clip_c * adv), loss)
        return loss, None
    if trust_region == "gaussian":
        phi = torch.exp(-((rho - 1.0) ** 2) / (2.0 * ptrw_sigma**2))
        if ptrw_grad == "detach_phi":
            phi = phi.detach()
        return -phi * rho * adv, phi.detach()
    if trust_region == "none":
        return -rho * adv, None
    raise ValueError(
        f"trust_region={trust_region!r} is not a known choice; use one of {', '.join(map(repr, TRUST_REGIONS))}."
    )


def clip_activity(
    rho_value: torch.Tensor, adv: torch.Tensor, trust_region: str, lower: float, upper: float
) -> tuple[torch.Tensor, torch.Tensor]:
    """Where the clip binds: low = (ρ < lower) & (A < 0), high = (ρ > upper) & (A > 0). Zero for soft modes."""
    if trust_region not in CLIPPED_TRUST_REGIONS:
        shape = torch.broadcast_shapes(rho_value.shape, adv.shape)
        zeros = torch.zeros(shape, dtype=torch.bool, device=rho_value.device)
        return zeros, zeros
    return (rho_value < lower) & (adv < 0), (rho_value > upper) & (adv > 0)
