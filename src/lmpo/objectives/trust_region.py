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

from typing import NamedTuple

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


class TrustRegionTerm(NamedTuple):
    loss: torch.Tensor
    """Per-token loss, broadcast shape of ρ and A."""
    low: torch.Tensor | None
    """Detached bool: the lower clip binds (ρ < 1−ε, A < 0); None for soft modes."""
    high: torch.Tensor | None
    """Detached bool: the upper clip binds (ρ > 1+ε, A > 0); None for soft modes."""
    phi: torch.Tensor | None
    """Detached PTRW weight φ(ρ) (gaussian mode only)."""
    free: torch.Tensor | None = None
    """Detached float 0/1: 1 where no bound binds (the ratio keeps its gradient); None for soft modes."""


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
) -> TrustRegionTerm:
    """Per-token policy loss term.

    Args:
        rho: (B, T) or (B, 1) importance weight; adv: (B, T) or (B, 1) advantages (broadcastable).
    Returns:
        ``TrustRegionTerm(loss, low, high, phi)``.

    The clipped modes are computed as ``−A·ρ̃`` with ``ρ̃ = ρ`` where no bound binds and the constant bound
    where one does. This equals ``−min(ρA, clip(ρ)A)`` (and its gradient, which is zero where a bound
    binds) but needs only multiplications, which are several times cheaper on CPU than the masked selects
    that ``torch.maximum``'s backward runs. Naive equivalent (what the tests compare against)::

        loss = torch.maximum(-rho * adv, -torch.clamp(rho, 1 - eps_low, 1 + eps_high) * adv)
        if dual_clip:
            loss = torch.where(adv < 0, torch.minimum(loss, -dual_clip_c * adv), loss)
    """
    if trust_region in CLIPPED_TRUST_REGIONS:
        lower, upper = clip_bounds(trust_region, eps_low, eps_high, eps_pos, eps_neg)
        with torch.no_grad():
            r = rho.detach()
            low = (r < lower) & (adv < 0)
            high = (r > upper) & (adv > 0)
            frozen = low | high
            bound = r.clamp(lower, upper)
            if dual_clip:
                # A < 0 with ρ > c: the loss −ρA is capped at −c·A
                dual = (adv < 0) & (r > dual_clip_c)
                frozen = frozen | dual
                bound = torch.where(dual, dual_clip_c, bound)
            free = (~frozen).to(rho.dtype)
            constant = bound * frozen  # the bound where one binds, else 0
        return TrustRegionTerm(-adv * (rho * free + constant), low, high, None, free)
    if trust_region == "gaussian":
        phi = torch.exp(-((rho - 1.0) ** 2) / (2.0 * ptrw_sigma**2))
        if ptrw_grad == "detach_phi":
            phi = phi.detach()
        return TrustRegionTerm(-phi * rho * adv, None, None, phi.detach())
    if trust_region == "none":
        return TrustRegionTerm(-rho * adv, None, None, None)
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
