"""Trust regions: turn an importance weight ρ and an advantage A into a per-token loss term.

| mode          | per-token loss                                                         | source              |
|---------------|------------------------------------------------------------------------|---------------------|
| ``ppo``       | ``−min(ρA, clip(ρ, 1−ε_low, 1+ε_high)·A)``, ε_low = ε_high = 0.2       | PPO, arXiv 1707.06347 |
| ``clip_higher``| same, ε_low = 0.2, ε_high = 0.28                                      | DAPO, arXiv 2503.14476 |
| ``sign_asym`` | same with ε = ε_pos if A > 0 else ε_neg (0.28 / 0.2)                    | sign-asymmetric clip |
| ``gaussian``  | ``−φ(ρ)·ρ·A``, ``φ(ρ) = exp(−(ρ−1)²/(2σ²))``, σ = 0.5                  | PTRW (Gaussian trust weight) |
| ``none``      | ``−ρA``                                                                |                     |
| ``cispo``     | ``−sg(clip(ρ, 1−ε_low, 1+ε_high))·A·log π``                             | MiniMax-M1, arXiv 2506.13585 |
| ``sapo``      | ``−σ(τ(ρ−1))·4/τ·A``, τ = τ_pos if A > 0 else τ_neg                      | SAPO, arXiv 2511.20347 |
| ``vespo``     | ``−sg(e^λ w^k e^{−λw})·A·log π``, ``w = Π_t ρ_t``                        | VESPO, arXiv 2602.10693 |
| ``dppo_tv``   | ``−sg(min(ρ, c))·A·log π·1[±(π − π_old) ≤ δ]``                          | DPPO, arXiv 2602.04879 |
| ``dppo_kl``   | the same with a binary-KL budget                                       | DPPO, arXiv 2602.04879 |
| ``dro``       | ``−(A·log π − ½β·(log π − log π_old)²)``                                 | DRO, arXiv 2405.19107 |

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

import math
from dataclasses import dataclass
from typing import ClassVar, NamedTuple

import torch

from .base import Context, Part, Registry, Tally, param

TRUST_REGIONS = Registry("trust_region", "Trust region")
"""Registry of trust regions: name → part class."""


class TrustRegionTerm(NamedTuple):
    loss: torch.Tensor
    """Per-token loss, broadcast shape of ρ and A."""
    low: torch.Tensor | None
    """Detached bool (or float 0/1): the lower clip binds (ρ < 1−ε, A < 0); None for soft modes."""
    high: torch.Tensor | None
    """Detached bool (or float 0/1): the upper clip binds (ρ > 1+ε, A > 0); None for soft modes."""
    phi: torch.Tensor | None
    """Detached PTRW weight φ(ρ) (gaussian mode only)."""
    free: torch.Tensor | None = None
    """Detached float 0/1: 1 where no bound binds (the ratio keeps its gradient), when a mode has it."""
    dual: torch.Tensor | None = None
    """Detached bool (or float 0/1): the dual clip binds (A < 0, ρ > c); None without dual clip."""


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
    levels: ClassVar[tuple[str, ...] | None] = None
    """The importance levels this trust region works with (None: every level). A trust region that builds its
    own weight from the token log-ratios ignores the level's ρ, so it names ``("token",)``."""
    absorbs_correction: ClassVar[bool] = False
    """True when the trust region folds the rollout-correction weights into its own weight (VESPO); otherwise
    the objective multiplies the per-token terms by them."""
    phi_key: ClassVar[str | None] = None
    """The statistic under which :meth:`report` gives the mean of ``TrustRegionTerm.phi``."""

    def term(self, rho: torch.Tensor, adv: torch.Tensor, ctx: Context) -> TrustRegionTerm:
        raise NotImplementedError

    def activity(self, rho_value: torch.Tensor, adv: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Where a bound binds, per sequence for sequence levels: ``(low, high)`` bool. None binds in soft modes."""
        shape = torch.broadcast_shapes(rho_value.shape, adv.shape)
        zeros = torch.zeros(shape, dtype=torch.bool, device=rho_value.device)
        return zeros, zeros

    def flags(self, term: TrustRegionTerm, rho: torch.Tensor, rho_value: torch.Tensor, adv: torch.Tensor
              ) -> tuple[torch.Tensor, torch.Tensor]:
        """``(low, high)``: where the lower / upper bound binds, for the statistics (detached).

        The term's own flags when it has them and the weight's value has ρ's shape; otherwise (soft trust regions,
        and a level whose ρ is per token but whose value is per sequence, (B, 1)) :meth:`activity` of the value.
        """
        if term.low is not None and rho_value.shape == rho.shape:
            return term.low, term.high
        return self.activity(rho_value, adv)

    def report(self, stats: dict[str, torch.Tensor], ctx: Context, tally: Tally) -> None:
        """``clip/low_frac``, ``clip/high_frac`` (``Σ flag·weight / count`` of ``tally.low`` / ``tally.high``),
        ``clip/region_frac`` (their sum) and the mean of ``φ`` under :attr:`phi_key` where the term has one."""
        low, high, weight, count = tally.low, tally.high, tally.weight, tally.count
        if tally.per_sequence or low.dtype != torch.bool:  # float 0/1 flags, or a few (B, 1) ones
            stats["clip/low_frac"] = (low * weight).sum() / count
            stats["clip/high_frac"] = (high * weight).sum() / count
        else:  # bool (B, T) flags: a count of the valid ones, no float pass
            stats["clip/low_frac"] = torch.count_nonzero(low & ctx.valid).to(ctx.dtype) / count
            stats["clip/high_frac"] = torch.count_nonzero(high & ctx.valid).to(ctx.dtype) / count
        stats["clip/region_frac"] = stats["clip/low_frac"] + stats["clip/high_frac"]
        phi = ctx.term.phi
        if phi is not None:
            phi = phi if phi.shape == weight.shape else phi.expand_as(weight)
            stats[self.phi_key] = (phi * weight).sum() / count


@dataclass(frozen=True)
class _Clipped(TrustRegion):
    """The clipped family: ``−A·clamp(ρ, lo, hi)`` with per-row (per-token) bounds: ``lo = 1−ε_low`` where A < 0,
    ``hi = 1+ε_high`` where A > 0 (``hi = c`` where A < 0 with dual clip), ±inf elsewhere.

    Under the ``min`` form only the bound on A's side binds, so this equals ``−min(ρA, clip(ρ)A)`` (and its
    gradient, which is zero where a bound binds). It is computed as ``−A·(c + (ρ − sg[ρ])·free)`` with
    ``c = clamp(sg[ρ], lo, hi)`` and ``free = 1 − |sign(c − sg[ρ])|``: value c, gradient ``−A·free·∇ρ``, using only
    float arithmetic (comparisons producing bool tensors, selects and ``clamp``'s backward cost several times more
    on CPU). Naive equivalent (what the tests compare against)::

        loss = torch.maximum(-rho * adv, -torch.clamp(rho, lower, upper) * adv)
        if dual_clip:
            loss = torch.where(adv < 0, torch.minimum(loss, -dual_clip_c * adv), loss)
    """

    family = "a clipped trust region"
    dual_clip: bool = param(False, "cap the loss of A < 0 terms at −dual_clip_c·A (Ye et al. 2020, arXiv 1912.09729)",
                            off=False)
    dual_clip_c: float = param(3.0, "dual clip constant c", low=1.0, hint="The usual value is 3.")

    stats = {**TrustRegion.stats, "clip/dual_frac": "fraction of tokens capped by dual clip (A<0, ratio > c; "
                                                    "with dual_clip only)"}

    def bounds(self) -> tuple[float, float]:
        """The (lower, upper) ratio bounds that can bind: 1−ε binds only for A < 0, 1+ε only for A > 0."""
        raise NotImplementedError

    def term(self, rho: torch.Tensor, adv: torch.Tensor, ctx: Context) -> TrustRegionTerm:
        lower, upper = self.bounds()
        negative, positive = adv < 0, adv > 0  # (B, 1) or (B, T)
        inf = adv.new_tensor(torch.inf)
        lo = torch.where(negative, adv.new_tensor(lower), -inf)
        # A < 0 with ρ > c: the loss −ρA is capped at −c·A, i.e. ρ at c
        hi = torch.where(positive, adv.new_tensor(upper), adv.new_tensor(self.dual_clip_c) if self.dual_clip else inf)
        with torch.no_grad():
            r = rho.detach()
            c = torch.clamp(r, min=lo, max=hi)
            side = torch.sign(c - r)  # +1: a lower bound raised ρ (A < 0); −1: an upper (or dual) bound lowered it
            free = 1.0 - side.abs()
            low = side.clamp(min=0.0)
            above = side.clamp(max=0.0).neg_()
            if self.dual_clip:
                pos = positive.to(rho.dtype)
                high, dual = above * pos, above * (1.0 - pos)
            else:
                high, dual = above, None
        return TrustRegionTerm(-adv * (c + (rho - r) * free), low, high, None, free, dual)

    def activity(self, rho_value: torch.Tensor, adv: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        lower, upper = self.bounds()
        return (rho_value < lower) & (adv < 0), (rho_value > upper) & (adv > 0)

    def report(self, stats: dict[str, torch.Tensor], ctx: Context, tally: Tally) -> None:
        """The clip fractions and, with dual clip, ``clip/dual_frac``: the share of tokens (sequences) with
        ``A < 0`` and ``ρ > c``, whose loss the dual clip capped at ``−c·A``."""
        super().report(stats, ctx, tally)
        if self.dual_clip:
            dual = (ctx.adv < 0) & (tally.ratio > self.dual_clip_c)
            stats["clip/dual_frac"] = (dual * tally.weight).sum() / tally.count


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
    phi_key = "ptrw/phi_mean"
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


# ---------------------------------------------------------------------------------------------------------------
# Detached-weight losses: ℓ_t = −sg(w_t)·A_t·log π_t. The value is written with log π itself, as the peers write
# it (so values can be compared with theirs); the gradient is −w_t·A_t·∇log π_t for every token, clipped or not.

def step(x: torch.Tensor) -> torch.Tensor:
    """``1[x > 0]`` as a float 0/1 tensor, by float arithmetic (a comparison producing a bool tensor and its
    conversion cost about ten times more on CPU)."""
    return torch.sign(x).clamp_(min=0.0)


def _weighted_logp(weight: torch.Tensor, adv: torch.Tensor, ctx: Context) -> torch.Tensor:
    """``−w·A·log π`` per token: weight (B, T) or (B, 1) detached, adv (B, T) or (B, 1) → (B, T)."""
    return weight * adv.neg() * ctx.logp_valid


@TRUST_REGIONS.register
@dataclass(frozen=True)
class CISPO(TrustRegion):
    """CISPO: the importance weight is clipped and detached and multiplies ``A·log π``, so every token keeps a
    gradient (PPO's clip zeroes the gradient of the clipped tokens instead)::

        ℓ_t = −sg(clip(ρ_t, 1−ε_low, 1+ε_high))·A_t·log π_t        ∇ℓ_t = −clip(ρ_t)·A_t·∇log π_t

    ``eps_low=None`` leaves the weight unbounded below (MiniMax-M1 clips from above only; TRL's
    ``epsilon_high`` for ``loss_type="cispo"`` is the cap 1+ε_high itself, e.g. 5.0 = ``eps_high=4``).
    Peers: verl ``compute_policy_loss_cispo`` (trainer/ppo/core_algos.py), TRL ``GRPOTrainer._compute_loss``
    ``loss_type="cispo"`` (trainer/grpo_trainer.py). With a sequence level, ρ is the sequence ratio.
    """

    name = "cispo"
    family = "a clipped trust region"
    formula = "−sg(clip(ρ, 1−ε_low, 1+ε_high))·A·log π"
    source = "MiniMax 2025, MiniMax-M1 (arXiv 2506.13585); verl compute_policy_loss_cispo; TRL loss_type='cispo'"
    stats = {"clip/low_frac": "cispo: fraction of weights clipped at 1-eps_low (any A)",
             "clip/high_frac": "cispo: fraction of weights clipped at 1+eps_high (any A)",
             "clip/region_frac": "cispo: fraction of weights clipped (verl's pg_clipfrac)"}
    eps_low: float | None = param(None, "lower clip range of the weight: ρ ≥ 1 − eps_low (None: no lower bound)",
                                  low=0.0, high=1.0, high_inclusive=False, hint="1 − eps_low must stay positive.")
    eps_high: float = param(4.0, "upper clip range of the weight: ρ ≤ 1 + eps_high", low=0.0,
                            hint="ScaleRL's cap is 5 (eps_high=4); verl's default clip_ratio is 0.2.")

    def _bounds(self, r: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """(weight, low, high): the clipped weight and float 0/1 flags of the bound that binds."""
        upper = 1.0 + self.eps_high
        high = step(r - upper)
        if self.eps_low is None:
            return r.clamp(max=upper), torch.zeros_like(high), high
        lower = 1.0 - self.eps_low
        return r.clamp(lower, upper), step(lower - r), high

    def term(self, rho: torch.Tensor, adv: torch.Tensor, ctx: Context) -> TrustRegionTerm:
        with torch.no_grad():
            weight, low, high = self._bounds(rho.detach())
        return TrustRegionTerm(_weighted_logp(weight, adv, ctx), low, high, None)

    def activity(self, rho_value: torch.Tensor, adv: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        _, low, high = self._bounds(rho_value)
        shape = torch.broadcast_shapes(rho_value.shape, adv.shape)
        return low.expand(shape), high.expand(shape)


@TRUST_REGIONS.register
@dataclass(frozen=True)
class SAPO(TrustRegion):
    """SAPO: a soft, sign-dependent gate instead of a hard clip::

        ℓ_t = −f_τ(ρ_t)·A_t,   f_τ(ρ) = σ(τ·(ρ − 1))·4/τ,   τ = τ_pos if A_t > 0 else τ_neg

    ``f'_τ(ρ) = 4σ(1−σ)`` is 1 at ρ = 1 (on-policy SAPO is the plain policy gradient) and decays smoothly as ρ
    leaves 1, faster for larger τ; τ_neg > τ_pos damps negative updates more. Peers: verl
    ``compute_policy_loss_sapo`` (trainer/ppo/core_algos.py), TRL ``loss_type="sapo"`` (grpo_trainer.py).
    """

    name = "sapo"
    formula = "−σ(τ(ρ−1))·4/τ·A,  τ = τ_pos if A > 0 else τ_neg"
    source = "SAPO, soft adaptive policy optimization (arXiv 2511.20347); verl compute_policy_loss_sapo; TRL loss_type='sapo'"
    sapo_tau_pos: float = param(1.0, "gate temperature τ_pos where A > 0", low=0.0, hint="The paper uses 1.0.")
    sapo_tau_neg: float = param(1.05, "gate temperature τ_neg where A ≤ 0", low=0.0, hint="The paper uses 1.05.")

    def term(self, rho: torch.Tensor, adv: torch.Tensor, ctx: Context) -> TrustRegionTerm:
        tau = torch.where(adv > 0, adv.new_tensor(self.sapo_tau_pos), adv.new_tensor(self.sapo_tau_neg))
        gate = torch.sigmoid(tau * (rho - 1.0)) * (4.0 / tau)
        return TrustRegionTerm(-gate * adv, None, None, None)


_LOG_MIN_WEIGHT = math.log(1e-8)  # VESPO's floor of the sequence weight, as TRL and the paper's code clamp it


@TRUST_REGIONS.register
@dataclass(frozen=True)
class VESPO(TrustRegion):
    """VESPO: a detached Gamma-shaped weight of the full sequence ratio ``w = Π_t ρ_t``::

        ℓ_t = −sg(φ(w))·A·log π_t,   φ(w) = e^λ·w^k·e^{−λw}   (φ(1) = 1; k, λ = k_pos, λ_pos if A ≥ 0 else k_neg, λ_neg)

    computed in log space with ``log w = clamp(Σ_t r_t, log 1e-8, 20)``. With a rollout correction the weight
    also covers π_old/π_rollout (``log w += Σ_t log c_t``, each clamped the same way) and the per-token terms are
    not multiplied by it again, as TRL does. Builds its own weight from the token log-ratios, so it runs with
    ``level="token"``. Peer: TRL ``GRPOTrainer.get_gamma_weights`` / ``loss_type="vespo"`` (grpo_trainer.py).
    """

    name = "vespo"
    formula = "−sg(e^λ w^k e^{−λw})·A·log π,  w = Π_t ρ_t"
    source = "VESPO (arXiv 2602.10693); TRL loss_type='vespo' (GRPOTrainer.get_gamma_weights)"
    stats = {**TrustRegion.stats, "vespo/phi_mean": "vespo: mean Gamma weight phi(w) over valid tokens"}
    levels = ("token",)
    absorbs_correction = True
    phi_key = "vespo/phi_mean"
    vespo_k_pos: float = param(2.0, "power k where A ≥ 0 (down-weights w < 1)", low=0.0, low_inclusive=True)
    vespo_lambda_pos: float = param(3.0, "decay λ where A ≥ 0 (down-weights w > 1)", low=0.0)
    vespo_k_neg: float = param(3.0, "power k where A < 0", low=0.0, low_inclusive=True)
    vespo_lambda_neg: float = param(2.0, "decay λ where A < 0", low=0.0)

    def term(self, rho: torch.Tensor, adv: torch.Tensor, ctx: Context) -> TrustRegionTerm:
        with torch.no_grad():
            log_w = ctx.log_ratio.sum(-1, keepdim=True)  # (B, 1): log-ratios are clamped to ±20 and 0 off-mask
            if ctx.correction is not None:
                log_c = torch.log(ctx.correction).clamp_(_LOG_MIN_WEIGHT, 20.0)
                if log_c.shape[-1] != 1:
                    log_c = torch.where(ctx.valid, log_c, 0.0).sum(-1, keepdim=True)
                log_w = log_w + log_c
            log_w = log_w.clamp(_LOG_MIN_WEIGHT, 20.0)
            nonneg = adv >= 0
            k = torch.where(nonneg, adv.new_tensor(self.vespo_k_pos), adv.new_tensor(self.vespo_k_neg))
            lam = torch.where(nonneg, adv.new_tensor(self.vespo_lambda_pos), adv.new_tensor(self.vespo_lambda_neg))
            phi = torch.exp(lam + k * log_w - lam * torch.exp(log_w)).nan_to_num_(0.0, 0.0, 0.0)
        return TrustRegionTerm(_weighted_logp(phi, adv, ctx), None, None, phi)


@dataclass(frozen=True)
class _DPPO(TrustRegion):
    """DPPO: a trust region in probability space instead of ratio space. Tokens whose probability moved beyond a
    divergence budget in the direction the advantage pushes them are masked; the rest get the detached,
    truncated weight ``min(ρ, c)`` (truncated IS instead of a dual clip, DPPO §5.4)::

        ℓ_t = −sg(min(ρ_t, c))·A_t·log π_t·1[token within budget]

    Peers: verl ``compute_policy_loss_dppo_tv`` / ``compute_policy_loss_dppo_kl`` (trainer/ppo/core_algos.py),
    whose budgets are ``clip_ratio_low`` / ``clip_ratio_high`` and whose c is ``clip_ratio_c``.
    """

    family = "a DPPO trust region"
    stats = {"clip/low_frac": "dppo: fraction of tokens masked by the budget where A <= 0",
             "clip/high_frac": "dppo: fraction of tokens masked by the budget where A > 0",
             "clip/region_frac": "dppo: fraction of tokens masked (verl's pg_clipfrac)"}
    dppo_low: float = param(0.2, "divergence budget δ_low where A ≤ 0", low=0.0, hint="verl's clip_ratio_low, 0.2.")
    dppo_high: float = param(0.2, "divergence budget δ_high where A > 0", low=0.0, hint="verl's clip_ratio_high.")
    dppo_is_cap: float = param(20.0, "c: the detached weight is min(ρ, c)", low=0.0,
                               hint="DPPO recommends a large cap (20); verl reads clip_ratio_c.")

    def within(self, p: torch.Tensor, p_old: torch.Tensor, logp: torch.Tensor, old: torch.Tensor
               ) -> tuple[torch.Tensor, torch.Tensor]:
        """(B, T) float 0/1 ``(ok where A > 0, ok where A ≤ 0)`` from probabilities and log-probabilities."""
        raise NotImplementedError

    def term(self, rho: torch.Tensor, adv: torch.Tensor, ctx: Context) -> TrustRegionTerm:
        with torch.no_grad():
            logp, old = ctx.logp_valid.detach(), ctx.old_valid
            pos_ok, neg_ok = self.within(torch.exp(logp), torch.exp(old), logp, old)
            positive = step(adv)  # (B, 1) or (B, T) float 0/1
            keep = neg_ok + positive * (pos_ok - neg_ok)  # pos_ok where A > 0, neg_ok elsewhere (exact 0/1)
            weight = rho.detach().clamp(max=self.dppo_is_cap) * keep
            dropped = 1.0 - keep
            low, high = dropped * (1.0 - positive), dropped * positive
        return TrustRegionTerm(_weighted_logp(weight, adv, ctx), low, high, None)


@TRUST_REGIONS.register
@dataclass(frozen=True)
class DPPOTV(_DPPO):
    __doc__ = _DPPO.__doc__ + """
    ``dppo_tv``: the budget is on the probability change: keep ``π − π_old ≤ δ_high`` where A > 0 and
    ``π − π_old ≥ −δ_low`` where A ≤ 0 (DPPO-Binary-TV)."""

    name = "dppo_tv"
    formula = "−sg(min(ρ, c))·A·log π·1[±(π − π_old) ≤ δ]"
    source = "DPPO (arXiv 2602.04879), Binary-TV; verl compute_policy_loss_dppo_tv"

    def within(self, p, p_old, logp, old):
        change = p - p_old
        return 1.0 - step(change - self.dppo_high), 1.0 - step(-self.dppo_low - change)


@TRUST_REGIONS.register
@dataclass(frozen=True)
class DPPOKL(_DPPO):
    __doc__ = _DPPO.__doc__ + """
    ``dppo_kl``: the budget is on the binary KL between the token's old and new Bernoulli
    ``D = π_old·log(π_old/π) + (1−π_old)·log((1−π_old+10⁻⁸)/(1−π+10⁻⁸))``: keep ``D ≤ δ_high or π ≤ π_old`` where
    A > 0 and ``D ≤ δ_low or π ≥ π_old`` where A ≤ 0 (DPPO-Binary-KL)."""

    name = "dppo_kl"
    formula = "−sg(min(ρ, c))·A·log π·1[D_bin(π_old‖π) ≤ δ or π moved against A]"
    source = "DPPO (arXiv 2602.04879), Binary-KL; verl compute_policy_loss_dppo_kl"

    def within(self, p, p_old, logp, old):
        binary_kl = p_old * (old - logp) + (1.0 - p_old) * torch.log((1.0 - p_old + 1e-8) / (1.0 - p + 1e-8))
        up, down = step(p - p_old), step(p_old - p)  # π moved up / down
        # ok where A > 0: D ≤ δ_high or π ≤ π_old; where A ≤ 0: D ≤ δ_low or π ≥ π_old (an "or" of 0/1 is a max)
        return (torch.maximum(1.0 - step(binary_kl - self.dppo_high), 1.0 - up),
                torch.maximum(1.0 - step(binary_kl - self.dppo_low), 1.0 - down))


@TRUST_REGIONS.register
@dataclass(frozen=True)
class DRO(TrustRegion):
    """DRO: the policy gradient with a quadratic penalty on the token log-ratio instead of a clip::

        ℓ_t = −(A_t·log π_t − ½β·(log π_t − log π_old,t)²)

    The penalty does not depend on A, so a zero advantage still pulls π back towards π_old. Uses the token
    log-ratio itself, so it runs with ``level="token"``. Peer: verl ``compute_policy_loss_dro``
    (trainer/ppo/core_algos.py; ``policy_loss.dro_beta`` has no default there).
    """

    name = "dro"
    formula = "−(A·log π − ½β·(log π − log π_old)²)"
    source = "Richemond et al. 2024, DRO (arXiv 2405.19107); verl compute_policy_loss_dro"
    levels = ("token",)
    dro_beta: float = param(0.1, "β of the ½β·(log π − log π_old)² penalty", low=0.0,
                            hint="verl requires policy_loss.dro_beta > 0; 0.1 is lmpo's default.")

    def term(self, rho: torch.Tensor, adv: torch.Tensor, ctx: Context) -> TrustRegionTerm:
        return TrustRegionTerm(0.5 * self.dro_beta * ctx.diff.square() - adv * ctx.logp_valid, None, None, None)
