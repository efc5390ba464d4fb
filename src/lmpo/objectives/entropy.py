"""Entropy control (SPEC §1.4, seed 002).

- static ``entropy_coef``: ``loss −= coef · aggregate(H_t)`` (H_t the entropy of the full next-token
  distribution, aggregated like the policy loss).
- ``AdaptiveEntropyController`` (Skywork-OR1, arXiv 2505.22312): ``c ← clip(c ± Δ, lo, hi)`` after each
  optimizer step; the coefficient applied is ``c·1[e ≤ target]``.
- ``clip_cov`` / ``kl_cov`` (Cui et al. 2025, "The Entropy Mechanism of RL for Reasoning LMs",
  arXiv 2505.22617): the per-token covariance ``cov_t = (A_t − Ā)·(logp_t − mean logp)`` over valid tokens
  (means detached) marks the few tokens that drive entropy collapse. clip_cov zeroes the loss terms of
  ``max(1, ⌊r·N⌋)`` random tokens with ``lb < cov < ub`` that the trust region did not already clip;
  kl_cov adds ``β_cov·|logp − old_logp|`` to the top ``max(1, ⌊k·N⌋)`` tokens by cov. Here ``k`` is a
  fraction (2e-3); verl's ``k_percent`` is a percentage (0.2 means 0.2 %), so ``k = k_percent / 100``.
  With one update per rollout ``logp == old_logp`` and the kl_cov term (value and gradient) is zero.

Selection never syncs with the host: the number of tokens to pick is a tensor; ``topk`` runs with the
shape-derived upper bound ``max(1, ⌊r·B·T⌋)`` and ranks beyond the data-dependent count are dropped.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import torch

from .validation import check_range

COV_CONTROLS = ("none", "clip_cov", "kl_cov")


@dataclass
class AdaptiveEntropyController:
    """Skywork-OR1 adaptive entropy coefficient (a small stateful object; checkpoint its ``state_dict``).

    Rule, once per optimizer step with the measured mean token entropy e (seed 002 eq. 4):
    ``c ← clip(c + Δ, lo, hi)`` if e < target, ``c ← clip(c − Δ, lo, hi)`` if e > target (unchanged at
    equality); the coefficient to apply is ``c·1[e ≤ target]``.

    ``coef`` uses the latest measured entropy for the gate and the already-updated c (the value for the
    next step, as a trainer that measures entropy during the update sees it); ``coef_for(e)`` gives
    ``c·1[e ≤ target]`` for a caller that measures the current step's entropy before the loss. Before the
    first measurement the gate is open (``coef = c_0``).
    """

    target: float = 0.2
    delta: float = 0.005
    coef_min: float = 0.0
    coef_max: float = 1.0
    coef_init: float = 0.0
    c: float = field(init=False)
    last_entropy: float | None = field(init=False, default=None)
    steps: int = field(init=False, default=0)

    def __post_init__(self) -> None:
        check_range("entropy_target", self.target, low=0.0, low_inclusive=True, high=None)
        check_range("entropy_delta", self.delta, low=0.0, low_inclusive=True, high=None)
        check_range("entropy_coef_min", self.coef_min, low=None, high=None)
        check_range("entropy_coef_max", self.coef_max, low=self.coef_min, low_inclusive=True, high=None)
        check_range(
            "entropy_coef_init", self.coef_init, low=self.coef_min, high=self.coef_max, low_inclusive=True,
            hint="Start the controller inside [entropy_coef_min, entropy_coef_max].",
        )
        self.c = float(self.coef_init)

    def coef_for(self, entropy: float) -> float:
        return self.c if entropy <= self.target else 0.0

    @property
    def coef(self) -> float:
        return self.c if self.last_entropy is None else self.coef_for(self.last_entropy)

    def update(self, mean_entropy: float) -> float:
        """Record the step's mean entropy, move c by ±Δ, return the coefficient for the next step."""
        e = float(mean_entropy)
        if not math.isfinite(e):
            raise ValueError(f"mean_entropy={mean_entropy!r} must be finite; skip the update on a bad step.")
        if e < self.target:
            self.c = min(self.coef_max, max(self.coef_min, self.c + self.delta))
        elif e > self.target:
            self.c = min(self.coef_max, max(self.coef_min, self.c - self.delta))
        self.last_entropy = e
        self.steps += 1
        return self.coef

    def state_dict(self) -> dict[str, float | int | None]:
        return {"c": self.c, "last_entropy": self.last_entropy, "steps": self.steps}

    def load_state_dict(self, state: dict[str, float | int | None]) -> None:
        self.c = float(state["c"])
        self.last_entropy = None if state.get("last_entropy") is None else float(state["last_entropy"])
        self.steps = int(state.get("steps", 0))


def token_covariance(
    logp: torch.Tensor,
    adv: torch.Tensor,
    m: torch.Tensor,
    num_valid: torch.Tensor,
    *,
    inplace: bool = False,
    invalid_fill: float = 0.0,
) -> torch.Tensor:
    """``cov_t = (A_t − Ā)(logp_t − mean logp)`` with batch means over valid tokens; detached.

    Args:
        logp: (B, T) finite; adv: (B, T) or (B, 1), finite; m: (B, T) float mask; num_valid: 0-dim count N.
        inplace: overwrite ``logp`` with the result (saves a (B, T) allocation for a temporary).
        invalid_fill: value at invalid positions (``-inf`` makes top-k and range tests skip them).
    Returns:
        (B, T).
    """
    with torch.no_grad():
        n = num_valid.clamp(min=1.0)
        if adv.shape[-1] == 1:
            mean_adv = (adv.squeeze(-1) * m.sum(-1)).sum() / n
        else:
            mean_adv = (adv * m).sum() / n
        mean_logp = (logp * m).sum() / n
        out = logp.sub_(mean_logp) if inplace else logp - mean_logp
        out.mul_(adv - mean_adv)
        if invalid_fill == 0.0:
            return out.mul_(m)
        return out.masked_fill_(m == 0, invalid_fill)


def covariance_mean(
    logp: torch.Tensor, adv: torch.Tensor, m: torch.Tensor, num_valid: torch.Tensor
) -> torch.Tensor:
    """Mean of ``cov_t`` over valid tokens without materialising cov: ``mean(A·logp) − Ā·mean(logp)``.

    logp: (B, T), 0 at invalid positions; adv: (B, 1) or (B, T), 0 at invalid positions. Returns 0-dim.
    """
    with torch.no_grad():
        n = num_valid.clamp(min=1.0)
        if adv.shape[-1] == 1:
            row_logp = logp.sum(-1)  # (B,)
            a = adv.squeeze(-1)
            return (a * row_logp).sum() / n - (a * m.sum(-1)).sum() / n * row_logp.sum() / n
        return (adv * logp).sum() / n - adv.sum() / n * logp.sum() / n


_MAX = 3.0e38  # ≥ −_MAX holds for every finite float32/float64 value and never for −inf


def _count(fraction: float, num_valid: torch.Tensor) -> torch.Tensor:
    """``max(1, ⌊fraction·N⌋)`` as a tensor (float64 where the device has it, so 2e-4·5000 floors to 1)."""
    dtype = torch.float32 if num_valid.device.type == "mps" else torch.float64
    return torch.clamp(torch.floor(num_valid.to(dtype) * fraction), min=1.0)


def _bound(fraction: float, numel: int) -> int:
    return max(1, min(numel, math.floor(fraction * numel)))


def _ranked_pick(filled: torch.Tensor, threshold: float, count: torch.Tensor, bound: int):
    """Flat indices (bound,) of the highest entries of ``filled`` and which of them to keep: the first
    ``count`` that reach ``threshold``."""
    values, index = filled.reshape(-1).topk(bound)  # sorted, descending
    keep = (torch.arange(bound, device=filled.device) < count) & (values >= threshold)
    return index, keep, values


def _as_mask(index: torch.Tensor, keep: torch.Tensor, like: torch.Tensor) -> torch.Tensor:
    picked = torch.zeros(like.numel(), dtype=torch.bool, device=like.device)
    picked.scatter_(0, index, keep)
    return picked.view(like.shape)


def clip_cov_pick(
    cov: torch.Tensor,
    valid: torch.Tensor,
    trust_clipped: torch.Tensor | None,
    num_valid: torch.Tensor,
    *,
    ratio: float,
    lb: float,
    ub: float,
    generator: torch.Generator | None = None,
    trust_free: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """clip_cov's choice as ``(flat_index (K,), keep (K,) bool)``, K = max(1, ⌊r·B·T⌋); see ``clip_cov_selection``.

    ``trust_free`` (float 0/1, 1 where the trust region did not clip) may replace ``trust_clipped``.
    """
    with torch.no_grad():
        candidates = cov > lb  # −inf (invalid, when so filled) is never a candidate
        candidates &= cov < ub
        if valid is not None:
            candidates &= valid
        if trust_clipped is not None:
            candidates &= ~trust_clipped
        # keys: uniform in [1, 2) for candidates, in [0, 1) or 0 for everything else (no ties among the
        # candidates, so topk stays fast)
        keys = torch.rand(cov.shape, generator=generator, device=cov.device, dtype=cov.dtype)
        keys.add_(candidates)
        if trust_free is not None:
            keys.mul_(trust_free)  # clipped by the trust region → 0
        index, keep, _ = _ranked_pick(keys, 1.0, _count(ratio, num_valid), _bound(ratio, cov.numel()))
        return index, keep


def clip_cov_selection(
    cov: torch.Tensor,
    valid: torch.Tensor,
    trust_clipped: torch.Tensor | None,
    num_valid: torch.Tensor,
    *,
    ratio: float,
    lb: float,
    ub: float,
    generator: torch.Generator | None = None,
) -> torch.Tensor:
    """Tokens whose loss terms clip_cov zeroes: ``max(1, ⌊r·N⌋)`` drawn uniformly from the candidates.

    Candidates: valid, not clipped by the trust region (``trust_clipped``, (B, T) or (B, 1) bool),
    ``lb < cov < ub``. ``valid`` may be None when cov is −inf at invalid positions. Random order comes from uniform keys drawn with ``generator`` (which must live on
    the tensors' device; None uses the global RNG). Returns (B, T) bool; nothing when no candidate exists.
    """
    index, keep = clip_cov_pick(cov, valid, trust_clipped, num_valid, ratio=ratio, lb=lb, ub=ub,
                                generator=generator)
    return _as_mask(index, keep, cov)


def fill_invalid_(cov: torch.Tensor, valid: torch.Tensor) -> torch.Tensor:
    """In place: −inf at invalid positions, so that top-k only sees valid tokens."""
    return cov.masked_fill_(~valid, -math.inf)


def kl_cov_pick(filled_cov: torch.Tensor, num_valid: torch.Tensor, *, fraction: float):
    """kl_cov's choice as ``(flat_index, keep)`` from covariances with −inf at invalid positions."""
    with torch.no_grad():
        index, keep, _ = _ranked_pick(filled_cov, -_MAX, _count(fraction, num_valid),
                                      _bound(fraction, filled_cov.numel()))
        return index, keep


def kl_cov_selection(cov: torch.Tensor, valid: torch.Tensor, num_valid: torch.Tensor, *, fraction: float) -> torch.Tensor:
    """Top ``max(1, ⌊k·N⌋)`` valid tokens by covariance; (B, T) bool."""
    index, keep = kl_cov_pick(fill_invalid_(cov.clone(), valid), num_valid, fraction=fraction)
    return _as_mask(index, keep, cov)


def top_fraction_mean(filled_cov: torch.Tensor, num_valid: torch.Tensor, fraction: float = 2e-4) -> torch.Tensor:
    """Mean of the top ``max(1, ⌊fraction·N⌋)`` covariances (the paper's "top 0.02 %" statistic); 0-dim.

    ``filled_cov`` holds −inf at invalid positions (``fill_invalid_``).
    """
    with torch.no_grad():
        _, keep, values = _ranked_pick(filled_cov, -_MAX, _count(fraction, num_valid),
                                       _bound(fraction, filled_cov.numel()))
        return torch.where(keep, values, 0.0).sum() / keep.sum().clamp(min=1)
