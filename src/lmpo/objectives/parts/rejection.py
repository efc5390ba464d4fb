"""Rejection: drop the policy terms of tokens or sequences that are too far off-policy.

A rejection part returns a detached 0/1 mask k, (B, T) or (B, 1), that multiplies the per-token policy terms
(after the rollout correction's weights). The normalisers are left as they are (DeepSeek-V3.2 eq. 9 masks
inside the GRPO sum; TRL multiplies its loss by the mask); verl instead removes rejected tokens from the
response mask, which also shrinks its token counts, so pass verl's counts as ``num_tokens`` / ``num_seqs`` to
compare.

- ``divergence`` (verl ``rollout_rs``): a divergence between the trainer's π_old and the sampler's π_rollout,
  from ``Δ_t = log π_old − log π_rollout`` (clamped to ±20): ``k1 = −Δ``, ``k2 = ½Δ²``, ``k3 = e^Δ − 1 − Δ``,
  per token or aggregated per sequence (sum, mean or max over valid tokens). k2 / k3 keep ``stat ≤ rs_max``;
  k1 is a log-ratio and keeps ``log rs_min ≤ stat ≤ log rs_max`` (rs_min defaults to 1/rs_max, as verl).
- ``off_policy_seq`` (DeepSeek-V3.2, arXiv 2512.02556 eq. 9): keep a sequence iff ``A ≥ 0`` or its mean KL to the
  sampler ``(1/|y|) Σ_t (log π_rollout − log π_θ)`` (π_θ detached) is at most δ: negative samples that the
  current policy has moved far from are the ones whose gradient misleads.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from lmpo.config import ConfigError

from .base import Context, Part, Registry, param

REJECTIONS = Registry("rejection", "Rejection")
"""Registry of rejection masks: name → part class."""

_STATS = {"rollout/rejected_frac": "fraction of valid tokens whose policy terms a rejection mask dropped"}


def _rejected_frac(keep: torch.Tensor, ctx: Context) -> torch.Tensor:
    kept = (keep.squeeze(-1) * ctx.lengths).sum() if keep.shape[-1] == 1 else (keep * ctx.m).sum()
    return 1.0 - kept / ctx.num_valid.clamp(min=1.0)


@dataclass(frozen=True)
class Rejection(Part):
    """Base of the rejection masks: ``keep(ctx, stats)`` → detached 0/1 (B, T) or (B, 1), or None."""

    def keep(self, ctx: Context, stats: dict[str, torch.Tensor]) -> torch.Tensor | None:
        raise NotImplementedError


@REJECTIONS.register
@dataclass(frozen=True)
class NoRejection(Rejection):
    """No rejection."""

    name = "none"
    formula = "k = 1"
    source = "—"

    def keep(self, ctx, stats):
        return None


RS_ESTIMATORS = ("k1", "k2", "k3")
RS_LEVELS = ("token", "seq_sum", "seq_mean", "seq_max")


@REJECTIONS.register
@dataclass(frozen=True)
class Divergence(Rejection):
    """verl's rejection sampling (``rollout_rs``, one criterion): ``rs_level`` × ``rs_estimator`` is verl's option
    name, e.g. ``seq_mean`` × ``k3`` = ``"seq_mean_k3"``. Peer: verl ``compute_rollout_rejection_mask``
    (trainer/ppo/rollout_corr_helper.py); several criteria (verl's comma-separated chains) are not expressible."""

    name = "divergence"
    needs = frozenset({"rollout_logp"})
    formula = "k = 1[agg_t div(Δ_t) ≤ rs_max]"
    source = "verl rollout_rs (rollout_corr_helper.compute_rollout_rejection_mask)"
    stats = _STATS
    rs_estimator: str = param("k3", "divergence per token: k1 (−Δ, ratio bounds) | k2 (½Δ²) | k3 (e^Δ − 1 − Δ)",
                              choices=RS_ESTIMATORS)
    rs_level: str = param("seq_mean", "token, or the sequence's seq_sum | seq_mean | seq_max of the divergence",
                          choices=RS_LEVELS)
    rs_max: float = param(0.01, "upper bound (k1: of the ratio π_rollout/π_old; k2, k3: of the divergence)",
                          low=0.0, hint="verl's K3-RS default is 0.01.")
    rs_min: float | None = param(None, "k1 only: lower bound of the ratio (None: 1/rs_max)", low=0.0)

    def check(self) -> None:
        if self.rs_estimator == "k1" and self.rs_level == "seq_max":
            raise ConfigError("rs_level='seq_max' takes rs_estimator='k2' or 'k3' (verl has no seq_max_k1); set "
                             "rs_estimator='k3' or rs_level='seq_mean'.")
        if self.rs_min is not None and self.rs_estimator != "k1":
            raise ConfigError(f"rs_min={self.rs_min!r} applies to rs_estimator='k1' only (k2 and k3 are bounded "
                             f"above by rs_max); drop rs_min or set rs_estimator='k1'.")
        if self.rs_min is not None and not self.rs_min <= self.rs_max:
            raise ConfigError(f"rs_min={self.rs_min!r} must not exceed rs_max={self.rs_max!r}.")

    def keep(self, ctx, stats):
        with torch.no_grad():
            delta = ctx.rollout_delta.clamp(-20.0, 20.0)
            if self.rs_estimator == "k1":
                div = -delta
            elif self.rs_estimator == "k2":
                div = 0.5 * delta.square()
            else:
                div = torch.exp(delta) - 1.0 - delta
            if self.rs_level == "seq_max":
                stat = torch.where(ctx.valid, div, -torch.inf).amax(-1, keepdim=True)
                stat = torch.where(torch.isinf(stat), 0.0, stat)  # empty rows: 0, as verl
            elif self.rs_level != "token":
                stat = div.sum(-1, keepdim=True)  # div is 0 at masked positions (Δ = 0 there)
                if self.rs_level == "seq_mean":
                    stat = stat / ctx.lengths.clamp(min=1.0).unsqueeze(-1)
            else:
                stat = div
            if self.rs_estimator == "k1":
                low = math.log(self.rs_min if self.rs_min is not None else 1.0 / self.rs_max)
                keep = (stat >= low) & (stat <= math.log(self.rs_max))
            else:
                keep = stat <= self.rs_max
            keep = keep.to(ctx.dtype)
            stats["rollout/rejected_frac"] = _rejected_frac(keep, ctx)
            return keep


@REJECTIONS.register
@dataclass(frozen=True)
class OffPolicySequence(Rejection):
    """Off-policy sequence masking: ``k_i = 1[A_i ≥ 0 or (1/|y_i|) Σ_t (log π_rollout − sg[log π_θ]) ≤ δ]``.

    Peers: TRL ``GRPOTrainer.get_off_policy_mask`` / ``off_policy_mask_threshold`` (grpo_trainer.py; with per-token
    advantages the test ``A ≥ 0`` is per token, as there), ms-swift ``off_policy_sequence_mask_delta`` (which drops
    the masked sequences from its normalisers)."""

    name = "off_policy_seq"
    needs = frozenset({"rollout_logp"})
    formula = "k_i = 1[A_i ≥ 0 ∨ mean_t(log π_rollout − log π_θ) ≤ δ]"
    source = "DeepSeek-AI 2025, DeepSeek-V3.2 (arXiv 2512.02556) eq. 9; TRL off_policy_mask_threshold"
    stats = _STATS
    opsm_delta: float = param(0.5, "δ: the largest mean KL to the sampler a negative-advantage sequence may have",
                              low=0.0, low_inclusive=True, hint="TRL's documentation suggests 0.5.")

    def keep(self, ctx, stats):
        with torch.no_grad():
            # log π_rollout − log π_θ = −(log π_θ − log π_old) − (log π_old − log π_rollout) = −(diff + Δ)
            total = (ctx.diff.detach() + ctx.rollout_delta).sum(-1, keepdim=True)
            mean_kl = -total / ctx.lengths.clamp(min=1.0).unsqueeze(-1)  # (B, 1)
            keep = ((ctx.adv >= 0) | (mean_kl <= self.opsm_delta)).to(ctx.dtype)
            stats["rollout/rejected_frac"] = _rejected_frac(keep, ctx)
            return keep
