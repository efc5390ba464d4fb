"""Rollout corrections: importance weights for the mismatch between the sampler and the trainer.

The sampler (vLLM, SGLang, a bf16 engine) scores the sampled tokens a little differently from the training
model, so the data come from π_rollout, not from the π_old the objective's ratio divides by. With
``Δ_t = log π_old(y_t) − log π_rollout(y_t)`` at valid tokens (``rollout_logp`` is the sampler's log-probs)
a correction multiplies each per-token policy term by a detached weight c built from ``exp(Δ)``:

| level (``is_level``) | ratio                          | shape  | peers                                           |
|----------------------|--------------------------------|--------|-------------------------------------------------|
| ``token``            | ``exp(Δ_t)``                    | (B, T) | TRL ``token_*``, verl ``rollout_is="token"``, OpenRLHF |
| ``sequence``         | ``exp(Σ_t Δ_t)``                | (B, 1) | TRL ``sequence_*``, verl ``rollout_is="sequence"``     |
| ``geometric``        | ``exp(Σ_t Δ_t / |y|)``          | (B, 1) | ms-swift ``sequence_*``, OpenRLHF ``seq-mask-tis`` mask |

- ``tis`` (truncated IS): ``c = clamp(ratio, is_min, is_max)``.
- ``mis`` (masked IS, IcePop): ``c = ratio·1[is_min ≤ ratio' ≤ is_max]``, the mask read at ``is_mask_level``
  (default: the same level), so a sequence-level mask can keep token-level weights (OpenRLHF ``seq-mask-tis``,
  ms-swift ``sequence_mask``).
- ``given``: weights the host computed itself (verl's ``rollout_is_weights``), applied as they are.

``is_batch_normalize`` divides c by its mean over the valid tokens (token weights) or non-empty sequences
(sequence weights) of the call (verl ``rollout_is_batch_normalize``, which normalises over the whole batch).
Ratios are computed from Δ clamped to ±``log_ratio_clamp`` (20), as verl does. The weights multiply the policy
terms only (not the reference-KL or entropy terms), after covariance control, as TRL and verl apply theirs.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from lmpo.config import ConfigError

from .base import Context, Part, Registry, param

CORRECTIONS = Registry("correction", "Rollout correction")
"""Registry of rollout corrections: name → part class."""

IS_LEVELS = ("token", "sequence", "geometric")

_STATS = {
    "rollout/kl_k3": "k3 estimate of KL(pi_rollout || pi_old) over valid tokens (the sampler mismatch)",
    "rollout/weight_mean": "mean rollout-correction weight (over valid tokens, or sequences for sequence weights)",
    "rollout/weight_max": "largest rollout-correction weight",
}


def level_log_ratio(delta: torch.Tensor, ctx: Context, level: str) -> torch.Tensor:
    """``Δ`` (B, T) → the log-ratio at ``level``: (B, T) token, (B, 1) sequence sum or geometric mean."""
    if level == "token":
        return delta
    total = delta.sum(-1, keepdim=True)
    return total if level == "sequence" else total / ctx.lengths.clamp(min=1.0).unsqueeze(-1)


def _ratio(log_ratio: torch.Tensor, clamp: float) -> torch.Tensor:
    return torch.exp(log_ratio.clamp(-clamp, clamp))


def weight_stats(stats: dict[str, torch.Tensor], ctx: Context, weight: torch.Tensor) -> None:
    """Mean / max of the applied weights over valid tokens ((B, T)) or non-empty sequences ((B, 1))."""
    if weight.shape[-1] == 1:
        count_w = (ctx.lengths > 0).to(ctx.dtype).unsqueeze(-1)
    else:
        count_w = ctx.m
    stats["rollout/weight_mean"] = (weight * count_w).sum() / count_w.sum().clamp(min=1.0)
    stats["rollout/weight_max"] = (weight * count_w).amax()


def mismatch_kl(ctx: Context) -> torch.Tensor:
    """k3 estimate of KL(π_rollout‖π_old) = E_rollout[e^Δ − Δ − 1] over valid tokens (0 at masked positions)."""
    delta = ctx.rollout_delta.clamp(-ctx.clamp, ctx.clamp)
    return (torch.exp(delta) - delta - 1.0).sum() / ctx.num_valid.clamp(min=1.0)


def batch_normalize(weight: torch.Tensor, ctx: Context) -> torch.Tensor:
    """``c / mean(c)`` over valid tokens or non-empty sequences (left unchanged when the mean is ≤ 1e-8)."""
    count_w = (ctx.lengths > 0).to(ctx.dtype).unsqueeze(-1) if weight.shape[-1] == 1 else ctx.m
    mean = (weight * count_w).sum() / count_w.sum().clamp(min=1e-8)
    return torch.where(mean > 1e-8, weight / mean, weight)


@dataclass(frozen=True)
class Correction(Part):
    """Base of the rollout corrections: ``apply(ctx, stats)`` → detached weights (B, T) or (B, 1), or None."""

    def apply(self, ctx: Context, stats: dict[str, torch.Tensor]) -> torch.Tensor | None:
        raise NotImplementedError


@CORRECTIONS.register
@dataclass(frozen=True)
class NoCorrection(Correction):
    """No rollout correction (the sampler is the training model, or the host corrects elsewhere)."""

    name = "none"
    formula = "c = 1"
    source = "—"

    def apply(self, ctx, stats):
        return None


_IS_LEVEL = param("token", "level of the weight: token (exp Δ_t) | sequence (exp Σ_t Δ_t) | geometric "
                  "(exp of the mean Δ_t)", choices=IS_LEVELS)
_IS_NORMALIZE = param(False, "divide the weights by their mean over the call's valid tokens / sequences (verl "
                      "rollout_is_batch_normalize)")


@dataclass(frozen=True)
class _Thresholded(Correction):
    family = "a rollout correction"
    needs = frozenset({"rollout_logp"})

    def check(self) -> None:
        low, high = self.is_min, self.is_max
        if low is not None and high is not None and not low <= high:
            raise ConfigError(f"is_min={low!r} must not exceed is_max={high!r} ({self.kind} {self.name!r}).")

    def finish(self, weight: torch.Tensor, ctx: Context, stats: dict[str, torch.Tensor]) -> torch.Tensor:
        stats["rollout/kl_k3"] = mismatch_kl(ctx)
        weight_stats(stats, ctx, weight)
        return batch_normalize(weight, ctx) if self.is_batch_normalize else weight


@CORRECTIONS.register
@dataclass(frozen=True)
class TIS(_Thresholded):
    """Truncated importance sampling: ``c = clamp(π_old/π_rollout, is_min, is_max)`` at the chosen level.

    Peers: TRL ``vllm_importance_sampling_mode="token_truncate" | "sequence_truncate"`` (grpo_trainer.py,
    ``_generate_and_score_completions``), verl ``compute_rollout_correction_weights`` with a float threshold
    (trainer/ppo/rollout_corr_helper.py), OpenRLHF ``vllm_is_correction_type="tis"`` (models/loss.py), ms-swift
    ``rollout_importance_sampling_mode="*_truncate"`` (geometric sequence ratio).
    """

    name = "tis"
    formula = "c = clamp(exp Δ, is_min, is_max)"
    source = "Yao et al. 2025, \"Your efficient RL framework secretly brings you off-policy RL training\" (TIS); verl rollout_corr_helper; TRL *_truncate"
    stats = {**_STATS, "rollout/truncated_frac": "tis: fraction of weights truncated at is_min / is_max"}
    is_level: str = _IS_LEVEL
    is_min: float | None = param(None, "lower bound of the weight (None: none)", low=0.0, low_inclusive=True)
    is_max: float | None = param(2.0, "upper bound of the weight (None: none)", low=0.0,
                                 hint="verl's default is 2.0, TRL's 3.0.")
    is_batch_normalize: bool = _IS_NORMALIZE

    def apply(self, ctx, stats):
        with torch.no_grad():
            ratio = _ratio(level_log_ratio(ctx.rollout_delta, ctx, self.is_level), ctx.clamp)
            unbounded = self.is_min is None and self.is_max is None
            weight = ratio if unbounded else ratio.clamp(min=self.is_min, max=self.is_max)
            count_w = (ctx.lengths > 0).to(ctx.dtype).unsqueeze(-1) if weight.shape[-1] == 1 else ctx.m
            stats["rollout/truncated_frac"] = ((weight != ratio) * count_w).sum() / count_w.sum().clamp(min=1.0)
            return self.finish(weight, ctx, stats)


@CORRECTIONS.register
@dataclass(frozen=True)
class MIS(_Thresholded):
    """Masked importance sampling (IcePop): ``c = ratio·1[is_min ≤ ratio' ≤ is_max]``; ``ratio`` at ``is_level``,
    ``ratio'`` at ``is_mask_level`` (default the same level). A token or sequence whose mismatch is too large is
    dropped from the policy gradient instead of being down-weighted.

    Peers: TRL ``vllm_importance_sampling_mode="token_mask" | "sequence_mask"``, verl
    ``compute_rollout_correction_weights`` with a ``"lower_upper"`` threshold (IcePop), OpenRLHF
    ``"icepop"`` and ``"seq-mask-tis"`` (``is_mask_level="geometric"``), ms-swift ``"sequence_mask"``
    (``is_level="token"``, ``is_mask_level="geometric"``, no lower bound).
    """

    name = "mis"
    formula = "c = exp Δ·1[is_min ≤ exp Δ' ≤ is_max]"
    source = "IcePop (Ling Team 2025, Ring-1T report); verl rollout_corr_helper; TRL *_mask"
    stats = {**_STATS, "rollout/masked_frac": "mis: fraction of weights zeroed (outside [is_min, is_max])"}
    is_level: str = _IS_LEVEL
    is_mask_level: str | None = param(None, "level of the ratio the mask reads (None: is_level)", choices=(None,
                                      *IS_LEVELS))
    is_min: float | None = param(0.5, "lower bound of the kept ratio (None: none)", low=0.0, low_inclusive=True,
                                 hint="IcePop keeps [0.5, 5].")
    is_max: float | None = param(5.0, "upper bound of the kept ratio (None: none)", low=0.0)
    is_batch_normalize: bool = _IS_NORMALIZE

    def apply(self, ctx, stats):
        with torch.no_grad():
            ratio = _ratio(level_log_ratio(ctx.rollout_delta, ctx, self.is_level), ctx.clamp)
            mask_level = self.is_mask_level or self.is_level
            tested = ratio if mask_level == self.is_level else _ratio(
                level_log_ratio(ctx.rollout_delta, ctx, mask_level), ctx.clamp)
            inside = torch.ones_like(tested, dtype=torch.bool)
            if self.is_min is not None:
                inside &= tested >= self.is_min
            if self.is_max is not None:
                inside &= tested <= self.is_max
            weight = ratio * inside
            count_w = (ctx.lengths > 0).to(ctx.dtype).unsqueeze(-1) if inside.shape[-1] == 1 else ctx.m
            stats["rollout/masked_frac"] = ((~inside) * count_w).sum() / count_w.sum().clamp(min=1.0)
            return self.finish(weight, ctx, stats)


@CORRECTIONS.register
@dataclass(frozen=True)
class Given(Correction):
    """Weights the host computed (verl's ``rollout_is_weights``, after its own truncation, masking and batch
    normalisation), multiplying the policy terms as verl's losses do (``pg_losses * rollout_is_weights``)."""

    name = "given"
    needs = frozenset({"rollout_is_weights"})
    formula = "c = w_host"
    source = "verl rollout_is_weights (trainer/ppo/core_algos.py policy losses)"
    stats = {k: v for k, v in _STATS.items() if k != "rollout/kl_k3"}

    def apply(self, ctx, stats):
        weight = ctx.inputs["rollout_is_weights"].detach()
        with torch.no_grad():
            weight_stats(stats, ctx, weight)
        return weight
