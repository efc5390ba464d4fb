"""Trust regions: turn an importance weight ρ and an advantage A into a per-token loss term.

| mode          | per-token loss                                                         | source              |
|---------------|------------------------------------------------------------------------|---------------------|
| ``ppo``       | ``−min(ρA, clip(ρ, 1−ε_low, 1+ε_high)·A)``, ε_low = ε_high = 0.2       | PPO, arXiv 1707.06347 |
| ``clip_higher``| same, ε_low = 0.2, ε_high = 0.28                                      | DAPO, arXiv 2503.14476 |
| ``sign_asym`` | same with ε = ε_pos if A > 0 else ε_neg (0.28 / 0.2)                    | sign-asymmetric clip |
| ``gaussian``  | ``−φ(ρ)·ρ·A``, ``φ(ρ) = exp(−(ρ−1)²/(2σ²))``, σ = 0.5                  | PTRW (Gaussian trust weight) |
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

from dataclasses import dataclass
from typing import NamedTuple

import torch

from .base import Context, Part, Registry, param

TRUST_REGIONS = Registry("trust_region", "Trust region")
"""Registry of trust regions: name → part class."""


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


@dataclass(frozen=True)
class TrustRegion(Part):
    """Base of the trust regions: ``term(rho, adv, ctx)`` → :class:`TrustRegionTerm`.

    ``rho``: (B, T) or (B, 1) importance weight with its gradient; ``adv``: (B, T) or (B, 1) advantages
    (broadcastable, detached).
    """

    stats = {"clip/low_frac": "fraction of tokens (sequences for sequence levels) clipped at 1-eps where it "
                              "binds (A<0)",
             "clip/high_frac": "fraction clipped at 1+eps where it binds (A>0)",
             "clip/region_frac": "fraction of tokens outside the trust region [1-eps_low, 1+eps_high]"}

    def term(self, rho: torch.Tensor, adv: torch.Tensor, ctx: Context) -> TrustRegionTerm:
        raise NotImplementedError

    def activity(self, rho_value: torch.Tensor, adv: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Where a bound binds, per sequence for sequence levels: ``(low, high)`` bool. None binds in soft modes."""
        shape = torch.broadcast_shapes(rho_value.shape, adv.shape)
        zeros = torch.zeros(shape, dtype=torch.bool, device=rho_value.device)
        return zeros, zeros


@dataclass(frozen=True)
class _Clipped(TrustRegion):
    """The clipped family: ``−A·ρ̃`` with ``ρ̃ = ρ`` where no bound binds and the constant bound where one does.

    This equals ``−min(ρA, clip(ρ)A)`` (and its gradient, which is zero where a bound binds) but needs only
    multiplications, which are several times cheaper on CPU than the masked selects that
    ``torch.maximum``'s backward runs. Naive equivalent (what the tests compare against)::

        loss = torch.maximum(-rho * adv, -torch.clamp(rho, lower, upper) * adv)
        if dual_clip:
            loss = torch.where(adv < 0, torch.minimum(loss, -dual_clip_c * adv), loss)
    """

    family = "a clipped trust region"
    dual_clip: bool = param(False, "cap the loss of A < 0 terms at −dual_clip_c·A (Ye et al. 2020, arXiv 1912.09729)")
    dual_clip_c: float = param(3.0, "dual clip constant c", low=1.0, hint="The usual value is 3.")

    stats = {**TrustRegion.stats, "clip/dual_frac": "fraction of tokens capped by dual clip (A<0, ratio > c; "
                                                    "with dual_clip only)"}

    def bounds(self) -> tuple[float, float]:
        """The (lower, upper) ratio bounds that can bind: 1−ε binds only for A < 0, 1+ε only for A > 0."""
        raise NotImplementedError

    def term(self, rho: torch.Tensor, adv: torch.Tensor, ctx: Context) -> TrustRegionTerm:
        lower, upper = self.bounds()
        with torch.no_grad():
            r = rho.detach()
            low = (r < lower) & (adv < 0)
            high = (r > upper) & (adv > 0)
            frozen = low | high
            bound = r.clamp(lower, upper)
            if self.dual_clip:
                # A < 0 with ρ > c: the loss −ρA is capped at −c·A
                dual = (adv < 0) & (r > self.dual_clip_c)
                frozen = frozen | dual
                bound = torch.where(dual, self.dual_clip_c, bound)
            free = (~frozen).to(rho.dtype)
            constant = bound * frozen  # the bound where one binds, else 0
        return TrustRegionTerm(-adv * (rho * free + constant), low, high, None, free)

    def activity(self, rho_value: torch.Tensor, adv: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        lower, upper = self.bounds()
        return (rho_value < lower) & (adv < 0), (rho_value > upper) & (adv > 0)


_EPS_LOW = param(0.2, "lower clip range: ρ ≥ 1 − eps_low binds for A < 0", low=0.0, high=1.0,
                 high_inclusive=False, hint="1 − eps_low must stay positive.")


@TRUST_REGIONS.register
@dataclass(frozen=True)
class PPO(_Clipped):
    """PPO's clipped surrogate ``−min(ρA, clip(ρ, 1−ε_low, 1+ε_high)·A)``; ε_high defaults to ε_low."""

    name = "ppo"
    formula = "−min(ρA, clip(ρ, 1−ε_low, 1+ε_high)·A)"
    source = "Schulman et al. 2017, PPO (arXiv 1707.06347)"
    eps_low: float = _EPS_LOW
    eps_high: float | None = param(None, "upper clip range: ρ ≤ 1 + eps_high binds for A > 0 (default: eps_low)",
                                   low=0.0, hint="Clip ranges are positive, e.g. 0.2.")

    def value(self, name: str):
        if name == "eps_high" and self.eps_high is None:
            return self.eps_low
        return getattr(self, name)

    def bounds(self) -> tuple[float, float]:
        return 1.0 - self.eps_low, 1.0 + self.value("eps_high")


@TRUST_REGIONS.register
@dataclass(frozen=True)
class ClipHigher(_Clipped):
    """DAPO's decoupled clip: PPO with ε_low = 0.2 and a larger ε_high = 0.28, so low-probability tokens
    can grow (slows entropy collapse)."""

    name = "clip_higher"
    formula = "−min(ρA, clip(ρ, 1−ε_low, 1+ε_high)·A),  ε_high = 0.28"
    source = "Yu et al. 2025, DAPO (arXiv 2503.14476)"
    eps_low: float = _EPS_LOW
    eps_high: float = param(0.28, "upper clip range: ρ ≤ 1 + eps_high binds for A > 0", low=0.0,
                            hint="Clip ranges are positive, e.g. 0.28.")

    def bounds(self) -> tuple[float, float]:
        return 1.0 - self.eps_low, 1.0 + self.eps_high


@TRUST_REGIONS.register
@dataclass(frozen=True)
class SignAsym(_Clipped):
    """Sign-asymmetric clip: ε = ε_pos where A > 0, ε_neg where A < 0 (bolder on successes).

    Under the ``min`` form this equals ``clip_higher(ε_high=ε_pos, ε_low=ε_neg)``: for A > 0 only the upper
    bound binds, for A < 0 only the lower one, so the sign choice of ε just picks which bound is used."""

    name = "sign_asym"
    formula = "−min(ρA, clip(ρ, 1±ε(A))·A),  ε = ε_pos if A > 0 else ε_neg"
    source = "sign-asymmetric clipping"
    eps_pos: float = param(0.28, "ε used where A > 0", low=0.0, hint="Clip ranges are positive, e.g. 0.28.")
    eps_neg: float = param(0.2, "ε used where A < 0", low=0.0, high=1.0, high_inclusive=False,
                           hint="1 − eps_neg must stay positive.")

    def bounds(self) -> tuple[float, float]:
        return 1.0 - self.eps_neg, 1.0 + self.eps_pos


@TRUST_REGIONS.register
@dataclass(frozen=True)
class Gaussian(TrustRegion):
    """PTRW's soft trust region ``−φ(ρ)·ρ·A``, ``φ(ρ) = exp(−(ρ−1)²/(2σ²))``.

    Gradient ``full``: ``d/dρ [φ(ρ)·ρ] = φ(ρ)·(1 − ρ(ρ−1)/σ²)`` changes sign once ``ρ(ρ−1) > σ²`` (σ = 0.5:
    once ρ > (1+√2)/2 ≈ 1.207), so far off-policy samples are pushed back, not merely down-weighted.
    ``detach_phi`` keeps φ as a pure weight: gradient ``φ(ρ)·A·∇ρ``, never sign-flipped."""

    name = "gaussian"
    formula = "−φ(ρ)·ρ·A,  φ(ρ) = exp(−(ρ−1)²/(2σ²))"
    source = "PTRW, Gaussian trust-region weighting"
    stats = {**TrustRegion.stats, "ptrw/phi_mean": "ptrw: mean Gaussian trust weight phi(rho)"}
    ptrw_sigma: float = param(0.5, "width σ of φ", low=0.0, hint="The default is 0.5.")
    ptrw_grad: str = param("full", "gradient: full (through φ·ρ) | detach_phi (φ as a weight)",
                           choices=("full", "detach_phi"))

    def term(self, rho: torch.Tensor, adv: torch.Tensor, ctx: Context) -> TrustRegionTerm:
        phi = torch.exp(-((rho - 1.0) ** 2) / (2.0 * self.ptrw_sigma**2))
        if self.ptrw_grad == "detach_phi":
            phi = phi.detach()
        return TrustRegionTerm(-phi * rho * adv, None, None, phi.detach())


@TRUST_REGIONS.register
@dataclass(frozen=True)
class NoTrustRegion(TrustRegion):
    """No trust region: the plain importance-weighted policy gradient ``−ρA``."""

    name = "none"
    formula = "−ρA"
    source = "importance-weighted REINFORCE"

    def term(self, rho: torch.Tensor, adv: torch.Tensor, ctx: Context) -> TrustRegionTerm:
        return TrustRegionTerm(-rho * adv, None, None, None)
