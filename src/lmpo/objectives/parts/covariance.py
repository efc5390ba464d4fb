"""Covariance control (Cui et al. 2025, "The Entropy Mechanism of RL for Reasoning LMs", arXiv 2505.22617).

The per-token covariance ``cov_t = (A_t − Ā)·(logp_t − mean logp)`` over valid tokens (means detached) marks
the few tokens that drive entropy collapse.

- ``clip_cov`` zeroes the loss terms of ``max(1, ⌊r·N⌋)`` random tokens with ``lb < cov < ub`` that the trust
  region did not already clip, each with the same probability (systematic sampling from one random offset drawn
  with the call's ``generator``; ``clip_cov_pick``).
- ``kl_cov`` adds ``β_cov·|logp − old_logp|`` to the top ``max(1, ⌊k·N⌋)`` tokens by cov. Here ``k`` is a
  fraction (2e-3); verl's ``k_percent`` is a percentage (0.2 means 0.2 %), so ``k = k_percent / 100``. With one
  update per rollout ``logp == old_logp`` and the kl_cov term (value and gradient) is zero.

Selection never syncs with the host: the number of tokens to pick is a tensor; ``topk`` runs with the
shape-derived upper bound ``max(1, ⌊r·B·T⌋)`` and ranks beyond the data-dependent count are dropped.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import ClassVar

import torch

from lmpo.config import ConfigError

from .base import Context, Part, Registry, param

COV_CONTROLS = Registry("cov_control", "Covariance control")
"""Registry of covariance controls: name → part class."""


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


def flat_topk(x: torch.Tensor, k: int) -> tuple[torch.Tensor, torch.Tensor]:
    """``x.reshape(-1).topk(k)`` (values and flat indices, sorted descending) through a partial selection.

    A top-k over all N entries costs more than the rest of clip_cov's selection on CPU; this one reads them once.
    The flat tensor is cut into blocks of S entries (plus a tail of fewer than S): each of the k largest entries
    lies in a block whose maximum is at least the k-th largest value, and at most k blocks can have such a
    maximum (each holds a different one of the k), so the k blocks with the largest maxima, and the tail, hold all
    of them. One ``amax`` over the blocks, a top-k over the N/S maxima and one over the k·S gathered entries give
    the same entries as the top-k over all N (under ties at the k-th value, which of the tied entries is returned
    is unspecified either way).
    """
    flat = x.reshape(-1)
    n = flat.numel()
    size = 1 << max(3, round(math.log2(math.sqrt(n / k)))) if k > 0 else n  # about √(N/k): N/S ≈ k·S
    blocks = n // size
    if 4 * k * size > n:  # small tensors: the blocks would save nothing
        return flat.topk(k)
    body = flat[: blocks * size].view(blocks, size)
    _, block_ids = body.amax(dim=1).topk(k)
    index = (block_ids.unsqueeze(1) * size + torch.arange(size, device=x.device)).reshape(-1)
    if blocks * size < n:  # the tail: always a candidate
        index = torch.cat([index, torch.arange(blocks * size, n, device=x.device)])
    values, pos = flat[index].topk(k)
    return values, index[pos]


def _ranked_pick(filled: torch.Tensor, threshold: float, count: torch.Tensor, bound: int):
    """Flat indices (bound,) of the highest entries of ``filled`` and which of them to keep: the first
    ``count`` that reach ``threshold``."""
    values, index = flat_topk(filled, bound)  # sorted, descending
    keep = (torch.arange(bound, device=filled.device) < count) & (values >= threshold)
    return index, keep, values


def _as_mask(index: torch.Tensor, keep: torch.Tensor, like: torch.Tensor) -> torch.Tensor:
    picked = torch.zeros(like.numel(), dtype=torch.bool, device=like.device)
    picked.scatter_(0, index, keep)
    return picked.view(like.shape)


def _cumsum_dtype(numel: int, device: torch.device) -> torch.dtype:
    """float32 counts exactly up to 2**24 entries; beyond that float64 (int64 on MPS, which has no float64)."""
    if numel < 1 << 24:
        return torch.float32
    return torch.int64 if device.type == "mps" else torch.float64


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

    Systematic sampling over the C candidates in flat (row-major) order: with K = max(1, ⌊r·N⌋) picks and step
    s = C / K, the candidates of rank ⌊(u + i)·s⌋, i < K, u ~ U[0, 1) drawn once from ``generator``; every
    candidate when C ≤ K. Each candidate is zeroed with probability K / C, as under a uniform draw of K of them
    (the paper's and verl's ``randperm``), and exactly K distinct ones are zeroed; the picks are spread evenly
    over the candidates instead of independent. One random number replaces one per token: drawing B·T uniform
    keys cost about as much as the rest of clip_cov on CPU (benchmarks/objectives.py).
    ``trust_free`` (float 0/1, 1 where the trust region did not clip) may replace ``trust_clipped``.
    """
    with torch.no_grad():
        # float 0/1 candidates lb < cov < ub: (cov − lb)·(ub − cov) > 0, compared in place so the result stays
        # float (bool comparisons and their conversion cost far more on CPU). A rounded difference keeps its
        # sign, and both factors cannot be negative as lb < ub; −inf or the lowest float (invalid, when so
        # filled) gives −inf, never a candidate
        candidates = (cov - lb).mul_(ub - cov).gt_(0.0)
        if valid is not None:
            candidates.mul_(valid)
        if trust_clipped is not None:
            candidates.mul_(~trust_clipped)
        if trust_free is not None:  # clipped by the trust region → no candidate
            candidates.mul_(trust_free)
        ranks_dtype = torch.float32 if cov.device.type == "mps" else torch.float64
        # seen[j] = candidates among flat entries 0..j; the candidate of rank q is the first j with seen[j] ≥ q + 1
        seen = candidates.view(-1).cumsum(0, dtype=_cumsum_dtype(cov.numel(), cov.device))
        total = seen[-1].to(ranks_dtype)
        count = _count(ratio, num_valid).to(ranks_dtype)
        bound = _bound(ratio, cov.numel())
        step = torch.clamp(total / count, min=1.0)
        u = torch.rand((), generator=generator, device=cov.device, dtype=ranks_dtype)
        offset = torch.where(total > count, u, torch.zeros_like(u))  # C ≤ K: ranks 0..C−1, every candidate
        i = torch.arange(bound, device=cov.device, dtype=ranks_dtype)
        ranks = (i + offset).mul_(step).floor_()
        keep = (i < count) & (ranks < total)
        index = torch.searchsorted(seen, (ranks + 1).to(seen.dtype)).clamp_(max=cov.numel() - 1)
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
    """Tokens whose loss terms clip_cov zeroes: ``max(1, ⌊r·N⌋)`` of the candidates (systematic sampling, each
    candidate with the same probability; ``clip_cov_pick``).

    Candidates: valid, not clipped by the trust region (``trust_clipped``, (B, T) or (B, 1) bool),
    ``lb < cov < ub``. ``valid`` may be None when cov is −inf at invalid positions. The one random offset
    is drawn with ``generator`` (which must live on the tensors' device; None uses the global RNG). Returns
    (B, T) bool; nothing when no candidate exists.
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


@dataclass(frozen=True)
class CovControl(Part):
    """Base of the covariance controls: ``apply(ctx, term, per_token, policy_m, stats)`` → ``(per_token,
    policy_m)``, the per-token policy terms and the mask the policy loss is aggregated with."""

    edits_mask: ClassVar[bool] = False
    """``apply`` returns a copy of the mask with some valid tokens at 0: its row sums are then not the sequence
    lengths, which stay the normalisers of the per-sequence aggregations (``Aggregation.reduce``'s
    ``seq_lengths``)."""

    def apply(self, ctx: Context, term, per_token: torch.Tensor, policy_m: torch.Tensor,
              stats: dict[str, torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor]:
        return per_token, policy_m


@COV_CONTROLS.register
@dataclass(frozen=True)
class NoCovControl(CovControl):
    """No covariance control."""

    name = "none"
    formula = "—"
    source = "—"


_COV_STATS = {"cov/mean": "clip_cov / kl_cov: mean covariance between advantage and log-prob",
              "cov/top_mean": "clip_cov / kl_cov: mean of the largest covariances"}


def _covariances(ctx: Context, stats: dict[str, torch.Tensor]) -> torch.Tensor:
    """cov (B, T) with the dtype's lowest finite value at invalid positions, below every covariance and below
    −_MAX, so range tests and top-k skip them with no extra pass (filled by arithmetic: a masked fill costs
    several times more on CPU)."""
    with torch.no_grad():
        logp_valid = ctx.zero_invalid(ctx.logp.detach().to(ctx.dtype))
        stats["cov/mean"] = covariance_mean(logp_valid, ctx.adv, ctx.m, ctx.num_valid)
        cov = token_covariance(logp_valid, ctx.adv, ctx.m, ctx.num_valid, inplace=True)  # 0 at invalid positions
        return cov.add_(ctx.m - 1.0, alpha=-torch.finfo(cov.dtype).min)


def _trust_free(term, dtype: torch.dtype) -> torch.Tensor | None:
    """Float 0/1, 0 where the trust region clipped (lower, upper or dual bound): those tokens are no clip_cov
    candidates. None when the trust region never clips."""
    if term.free is not None:
        return term.free
    flags = [f for f in (term.low, term.high, term.dual) if f is not None]
    if not flags:
        return None
    clipped = sum(f.to(dtype) for f in flags)
    return 1.0 - clipped.clamp_(max=1.0)


@COV_CONTROLS.register
@dataclass(frozen=True)
class ClipCov(CovControl):
    """Clip-Cov: the loss terms of ``max(1, ⌊r·N⌋)`` tokens drawn from those with covariance in (lb, ub) and not
    clipped by the trust region, each with the same probability, get weight 0 (counts for the normalisers
    unchanged). The draw is systematic (evenly spaced over the candidates from one random offset) where the
    paper's code draws a uniform subset: same inclusion probability, one random number instead of B·T."""

    name = "clip_cov"
    edits_mask = True
    stats = {**_COV_STATS, "cov/clipped_tokens": "clip_cov: tokens whose loss term was zeroed"}
    formula = "(1 − 1[t ∈ I_clip])·ℓ_t,  I_clip ⊂ {t: lb < cov_t < ub}, P(t ∈ I_clip) = K/C"
    source = "Cui et al. 2025, Entropy Mechanism of RL for Reasoning LMs (arXiv 2505.22617)"
    clip_cov_ratio: float = param(2e-4, "fraction r of valid tokens to zero (max(1, ⌊r·N⌋))", low=0.0, high=1.0,
                                  hint="The paper uses 2e-4.")
    clip_cov_lb: float = param(1.0, "lower covariance bound lb")
    clip_cov_ub: float = param(5.0, "upper covariance bound ub (> lb)")

    def check(self) -> None:
        if not self.clip_cov_ub > self.clip_cov_lb:
            raise ConfigError(f"clip_cov_ub={self.clip_cov_ub!r} must exceed clip_cov_lb={self.clip_cov_lb!r} "
                             f"(defaults 1 and 5).")

    def apply(self, ctx, term, per_token, policy_m, stats):
        cov = _covariances(ctx, stats)
        # The picks are a handful of tokens: edit them through their flat indices instead of building (B, T)
        # masks (fewer full-size allocations, which dominate the cost on CPU).
        index, keep = clip_cov_pick(cov, None, None, ctx.num_valid, trust_free=_trust_free(term, ctx.dtype),
                                    ratio=self.clip_cov_ratio, lb=self.clip_cov_lb, ub=self.clip_cov_ub,
                                    generator=ctx.generator)
        policy_m = policy_m.clone()
        flat_m = policy_m.view(-1)
        flat_m.index_put_((index,), flat_m[index] * ~keep)
        with torch.no_grad():
            stats["cov/top_mean"] = top_fraction_mean(cov, ctx.num_valid)
            stats["cov/clipped_tokens"] = keep.sum().to(ctx.dtype)
        return per_token, policy_m


@COV_CONTROLS.register
@dataclass(frozen=True)
class KLCov(CovControl):
    """KL-Cov: the top ``max(1, ⌊k·N⌋)`` tokens by covariance get ``+ β_cov·|logp − old_logp|`` (k a fraction,
    not a percentage). Inert on-policy: with one update per rollout the log-ratio is 0."""

    name = "kl_cov"
    stats = {**_COV_STATS, "cov/penalised_tokens": "kl_cov: tokens given the |logp - old_logp| penalty"}
    formula = "ℓ_t + 1[t ∈ top-k cov]·β_cov·|log w_t|"
    source = "Cui et al. 2025, Entropy Mechanism of RL for Reasoning LMs (arXiv 2505.22617)"
    kl_cov_frac: float = param(2e-3, "fraction k (not a percentage) of valid tokens penalised", low=0.0,
                               high=1.0, hint="A fraction: verl's k_percent=0.2 is kl_cov_frac=0.002.")
    kl_cov_coef: float = param(1.0, "β_cov of the |logp − old_logp| penalty", low=0.0, low_inclusive=True)

    def apply(self, ctx, term, per_token, policy_m, stats):
        cov = _covariances(ctx, stats)
        index, keep = kl_cov_pick(cov, ctx.num_valid, fraction=self.kl_cov_frac)
        penalty = self.kl_cov_coef * ctx.log_ratio.reshape(-1)[index].abs() * keep
        shape = ctx.valid.shape
        per_token = per_token.expand(shape).reshape(-1).index_add(0, index, penalty).view(shape)
        with torch.no_grad():
            stats["cov/top_mean"] = top_fraction_mean(cov, ctx.num_valid)
            stats["cov/penalised_tokens"] = keep.sum().to(ctx.dtype)
        return per_token, policy_m
