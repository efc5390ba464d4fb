"""Advantage estimators over rewards and group ids. Pure functions, one registry.

- ``grpo``: ``A_i = (r_i − mean_g)/(std_g + ε)`` (``scale="group"``, unbiased std), ``(r_i − mean_g)/(std_B + ε)``
  (``"batch"``: std over the whole batch, as TRL's ``scale_rewards="batch"``), or ``r_i − mean_g``
  (``"none"``: Dr. GRPO). A group with one member or zero reward variance gets advantage 0.
- ``rloo``: ``A_i = r_i − mean_{j≠i, j∈g} r_j = n/(n−1)·(r_i − mean_g)``; singleton groups get 0. The
  same ``scale`` options divide by the group / batch std (default ``"none"``, the usual RLOO).

Every estimator takes ``rewards (B,)`` and ``group_ids (B,)`` (any integers; a group is the set of
completions of one prompt, G per group) and returns ``(advantages (B,), stats)`` with detached 0-dim
statistics under ``adv/…``. ``ADVANTAGE_ESTIMATORS`` is the registry (each entry a frozen dataclass of its
options, like the objective parts); ``compute_advantages(name, rewards, group_ids, **options)`` runs one.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from .objective import ADVANTAGE_SCALES
from .parts.base import Part, Registry, param
from .validation import check_choice


def _groups(rewards: torch.Tensor, group_ids: torch.Tensor) -> tuple[torch.Tensor, int]:
    if rewards.dim() != 1:
        raise ValueError(f"rewards must be (B,), got shape {tuple(rewards.shape)}; pass one reward per completion.")
    if group_ids.shape != rewards.shape:
        raise ValueError(
            f"group_ids has shape {tuple(group_ids.shape)} but rewards has {tuple(rewards.shape)}; "
            f"give one group id per completion."
        )
    if group_ids.dtype.is_floating_point or group_ids.dtype == torch.bool:
        raise TypeError(f"group_ids must be an integer tensor, got {group_ids.dtype}.")
    if not bool(torch.isfinite(rewards).all()):
        bad = torch.nonzero(~torch.isfinite(rewards))[0].item()
        raise ValueError(f"rewards[{bad}] = {rewards[bad].item()} is not finite; fix the reward function.")
    _, inverse = torch.unique(group_ids, return_inverse=True)
    return inverse, int(inverse.max().item()) + 1 if inverse.numel() else 0


def group_statistics(rewards: torch.Tensor, group_ids: torch.Tensor) -> dict[str, torch.Tensor]:
    """Per-sample group count, mean, unbiased std and zero-variance flag (all (B,))."""
    inverse, num_groups = _groups(rewards, group_ids)
    r = rewards.to(torch.promote_types(rewards.dtype, torch.float32))
    count = torch.zeros(num_groups, dtype=r.dtype, device=r.device).index_add_(0, inverse, torch.ones_like(r))
    total = torch.zeros_like(count).index_add_(0, inverse, r)
    mean = total / count
    centred = r - mean[inverse]
    sq = torch.zeros_like(count).index_add_(0, inverse, centred * centred)
    std = torch.sqrt(sq / (count - 1).clamp(min=1.0))
    high = torch.full_like(count, -torch.inf).scatter_reduce(0, inverse, r, reduce="amax")
    low = torch.full_like(count, torch.inf).scatter_reduce(0, inverse, r, reduce="amin")
    zero_var = (high == low)[inverse]  # exact test; singletons count as zero-variance
    return {"count": count[inverse], "mean": mean[inverse], "std": std[inverse], "centred": centred,
            "zero_variance": zero_var}


def zero_variance_mask(rewards: torch.Tensor, group_ids: torch.Tensor) -> torch.Tensor:
    """(B,) bool: the completion's group has one member or identical rewards (no learning signal)."""
    return group_statistics(rewards, group_ids)["zero_variance"]


def filter_zero_variance_groups(
    rewards: torch.Tensor, group_ids: torch.Tensor
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """Keep mask for dynamic sampling (DAPO): ``(keep (B,) bool, stats)``; stats give the dropped fraction."""
    zero_var = zero_variance_mask(rewards, group_ids)
    stats = {"adv/zero_var_frac": zero_var.float().mean()}
    return ~zero_var, stats


def _stats(adv: torch.Tensor, zero_var: torch.Tensor) -> dict[str, torch.Tensor]:
    adv = adv.detach()
    return {
        "adv/mean": adv.mean(),
        "adv/std": adv.std(unbiased=False) if adv.numel() > 0 else adv.sum(),
        "adv/abs_max": adv.abs().max() if adv.numel() > 0 else adv.sum(),
        "adv/zero_var_frac": zero_var.float().mean(),
    }


def _scaled(
    adv: torch.Tensor, g: dict[str, torch.Tensor], rewards: torch.Tensor, scale: str, eps: float
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """The estimators' shared tail: divide by the group std ("group"), the batch std ("batch") or nothing
    ("none"); zero-variance groups get advantage 0.  adv (B,) → ((B,), stats)."""
    if scale == "group":
        adv = adv / (g["std"] + eps)
    elif scale == "batch":
        adv = adv / (rewards.float().std() + eps if rewards.numel() > 1 else 1.0)
    adv = torch.where(g["zero_variance"], 0.0, adv)
    return adv, _stats(adv, g["zero_variance"])


def grpo_advantages(
    rewards: torch.Tensor, group_ids: torch.Tensor, scale: str = "group", eps: float = 1e-4
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """GRPO group-relative advantages. rewards (B,), group_ids (B,) int → ((B,), stats)."""
    check_choice("scale", scale, ADVANTAGE_SCALES)
    g = group_statistics(rewards, group_ids)
    adv = g["centred"]
    return _scaled(adv, g, rewards, scale, eps)


def rloo_advantages(
    rewards: torch.Tensor, group_ids: torch.Tensor, scale: str = "none", eps: float = 1e-4
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """Leave-one-out baseline: r_i − mean of the other members of its group. ((B,), stats)."""
    check_choice("scale", scale, ADVANTAGE_SCALES)
    g = group_statistics(rewards, group_ids)
    n = g["count"]
    adv = g["centred"] * n / (n - 1).clamp(min=1.0)
    return _scaled(adv, g, rewards, scale, eps)


ADVANTAGE_ESTIMATORS = Registry("advantage_estimator", "Advantage estimator")
"""Registry of advantage estimators: name → estimator class (a frozen dataclass of its options)."""

ADVANTAGE_STATS = {
    "adv/mean": "mean advantage from the estimator",
    "adv/std": "standard deviation of the estimator's advantages",
    "adv/abs_max": "largest absolute advantage",
    "adv/zero_var_frac": "fraction of sequences in groups whose rewards are all equal (no group signal)",
}


@dataclass(frozen=True)
class AdvantageEstimator(Part):
    """Base of the estimators: ``estimator(rewards, group_ids)`` → ``(advantages (B,), stats)``."""

    stats = ADVANTAGE_STATS

    def __call__(self, rewards: torch.Tensor, group_ids: torch.Tensor) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        raise NotImplementedError


@ADVANTAGE_ESTIMATORS.register
@dataclass(frozen=True)
class GRPOAdvantage(AdvantageEstimator):
    """GRPO's group-relative advantage ``(r − mean_g)/(std_g + ε)`` (scale ``group``), ``/(std_B + ε)``
    (``batch``) or ``r − mean_g`` (``none``, Dr. GRPO)."""

    name = "grpo"
    formula = "(r_i − mean_g r)/(std_g r + ε)"
    source = "Shao et al. 2024, DeepSeekMath (arXiv 2402.03300)"
    scale: str = param("group", "divide by the group std, the batch std, or nothing", choices=ADVANTAGE_SCALES)
    eps: float = param(1e-4, "ε added to the std", low=0.0, low_inclusive=True)

    def __call__(self, rewards, group_ids):
        return grpo_advantages(rewards, group_ids, scale=self.scale, eps=self.eps)


@ADVANTAGE_ESTIMATORS.register
@dataclass(frozen=True)
class RLOOAdvantage(AdvantageEstimator):
    """Leave-one-out baseline ``r_i − mean_{j≠i} r_j`` (optionally divided by the group / batch std)."""

    name = "rloo"
    formula = "r_i − mean_{j≠i, j∈g} r_j"
    source = "Ahmadian et al. 2024, Back to Basics (arXiv 2402.14740)"
    scale: str = param("none", "divide by the group std, the batch std, or nothing", choices=ADVANTAGE_SCALES)
    eps: float = param(1e-4, "ε added to the std", low=0.0, low_inclusive=True)

    def __call__(self, rewards, group_ids):
        return rloo_advantages(rewards, group_ids, scale=self.scale, eps=self.eps)


def compute_advantages(
    name: str, rewards: torch.Tensor, group_ids: torch.Tensor, **options: object
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """Run ``ADVANTAGE_ESTIMATORS[name](**options)``; e.g. ``compute_advantages("grpo", r, g, scale="none")``."""
    if name not in ADVANTAGE_ESTIMATORS:
        raise ValueError(f"unknown advantage estimator {name!r}; use one of {', '.join(ADVANTAGE_ESTIMATORS)}.")
    return ADVANTAGE_ESTIMATORS[name](**options)(rewards, group_ids)
