"""Advantage estimators over rewards and group ids. Pure functions, one registry.

- ``grpo``: ``A_i = (r_i − mean_g)/(std_g + ε)`` (``scale="group"``, unbiased std), ``(r_i − mean_g)/(std_B + ε)``
  (``"batch"``: std over the whole batch, as TRL's ``scale_rewards="batch"``), or ``r_i − mean_g``
  (``"none"``: Dr. GRPO). A group with one member or zero reward variance gets advantage 0.
- ``rloo``: ``A_i = r_i − mean_{j≠i, j∈g} r_j = n/(n−1)·(r_i − mean_g)``; singleton groups get 0. The
  same ``scale`` options divide by the group / batch std (default ``"none"``, the usual RLOO).

- ``reinforce_plus_plus``: ``A_i = whiten_B(r_i)`` (REINFORCE++, no group baseline);
  ``reinforce_plus_plus_baseline``: ``A_i = whiten_B(r_i − mean_g)``. ``whiten_B`` standardises over the batch,
  by default weighting each sequence by its token count as verl does (its moments are over the batch's tokens).
- ``remax``: ``A_i = r_i − r_greedy(prompt_i)``, the baseline the reward of the prompt's greedy completion.
- ``opo``: ``A_i = r_i − Σ_g l_j r_j / Σ_g l_j`` (length-weighted group baseline).
- ``gpg``: ``A_i = α (r_i − mean_g)/F_norm`` with ``α = B / B_valid``.
- ``gdpo``: each reward function's values normalised within the group separately, weighted, summed, then
  whitened over the batch.

Every estimator takes ``rewards (B,)`` and ``group_ids (B,)`` (any integers; a group is the set of
completions of one prompt, G per group) and returns ``(advantages (B,), stats)`` with detached 0-dim
statistics under ``adv/…``. Some take more inputs, by keyword (:data:`ADVANTAGE_INPUTS`: ``lengths``,
``baseline_rewards``, ``reward_components``, ``reward_weights``); an estimator declares what it needs in
``required_inputs()`` and raises :class:`lmpo.errors.InputError` naming a missing one. Inputs it does not use are
ignored, so a caller may pass everything it has. ``ADVANTAGE_ESTIMATORS`` is the registry (each entry a frozen
dataclass of its options, like the objective parts); ``compute_advantages(name, rewards, group_ids, **options)``
runs one (``options`` holds its parameters and its inputs); ``make_estimator(name, default_scale=…, **params)``
builds one the way the trainer does.

Groups of one: lmpo's group baselines are the group's own statistic, so a singleton gets centred reward 0
(verl's estimators use baseline 0 there and pass the raw reward on). The cross-checks use groups of two or more.
"""

from __future__ import annotations

import difflib
import typing
from collections.abc import Mapping
from dataclasses import dataclass
from typing import ClassVar

import torch

from lmpo.config import ConfigError
from lmpo.errors import InputError

from .objective import ADVANTAGE_SCALES
from .parts.base import Part, Registry, coerce_param, param
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


WHITEN_WEIGHTS = ("tokens", "sequences")
"""How a batch whitening weighs the sequences: by their token counts (verl's ``masked_whiten`` over the response
mask) or once each."""


def batch_whiten(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """Standardise ``x (B,)`` over the batch with per-sequence weights ``weight (B,)`` → (B,)::

        μ = Σ w_i x_i / Σ w_i,   σ² = Σ w_i (x_i − μ)² / (Σ w_i − 1),   out = (x − μ) / sqrt(σ² + ε)

    With ``w`` = token counts this is verl's ``masked_whiten`` (``verl.utils.torch_functional``) of ``x``
    broadcast over each response's tokens: its mean and Bessel-corrected variance run over the batch's tokens.
    With ``w`` = 1 the moments are over sequences. A total weight ≤ 1 leaves nothing to standardise against:
    the denominators are clamped to 1 (verl raises there), which gives 0 for a single unit-weight entry; a total
    weight of 0 (every completion empty: no token would carry the advantage) gives 0 throughout.
    """
    total = weight.sum()
    mean = (weight * x).sum() / total.clamp(min=1.0)
    var = (weight * (x - mean) ** 2).sum() / (total - 1.0).clamp(min=1.0)
    return torch.where(total > 0, (x - mean) * torch.rsqrt(var + eps), 0.0)


ADVANTAGE_ESTIMATORS = Registry("advantage_estimator", "Advantage estimator")
"""Registry of advantage estimators: name → estimator class (a frozen dataclass of its options)."""

ADVANTAGE_STATS = {
    "adv/mean": "mean advantage from the estimator",
    "adv/std": "standard deviation of the estimator's advantages",
    "adv/abs_max": "largest absolute advantage",
    "adv/zero_var_frac": "fraction of sequences in groups whose rewards are all equal (no group signal)",
    "adv/baseline_mean": "mean reward of the greedy completions used as ReMax's baseline",
    "adv/gpg_alpha": "GPG's scale α = B / B_valid",
}

ADVANTAGE_INPUTS: Mapping[str, str] = {
    "lengths": "(B,) completion lengths in tokens (EOS included), ≥ 0",
    "baseline_rewards": "(B,) reward of the greedy completion of each sequence's prompt (ReMax)",
    "reward_components": "(B, K) each of the K reward functions' raw value per completion (undefined → 0)",
    "reward_weights": "(K,) weight of each reward function (default: all 1)",
}
"""Inputs an estimator may take beyond ``(rewards, group_ids)``, by keyword."""


def _check_input(name: str, value: torch.Tensor, rewards: torch.Tensor, inputs: Mapping) -> torch.Tensor:
    if not isinstance(value, torch.Tensor):
        raise InputError(f"advantage input `{name}` is a {type(value).__name__}; pass a tensor "
                         f"({ADVANTAGE_INPUTS[name]}).")
    B = rewards.shape[0]
    if name == "reward_components":
        ok = value.dim() == 2 and value.shape[0] == B and value.shape[1] >= 1
        want = f"(B={B}, K ≥ 1)"
    elif name == "reward_weights":
        comps = inputs.get("reward_components")
        K = comps.shape[-1] if isinstance(comps, torch.Tensor) else None
        ok = value.dim() == 1 and (K is None or value.shape[0] == K)
        want = f"(K={K},), one weight per reward function" if K is not None else "(K,)"
    else:
        ok = value.shape == rewards.shape
        want = f"(B={B},), one value per completion"
    if not ok:
        raise InputError(f"advantage input `{name}` has shape {tuple(value.shape)}; it must be {want} "
                         f"({ADVANTAGE_INPUTS[name]}).")
    if value.dtype == torch.bool or not bool(torch.isfinite(value).all()):
        raise InputError(f"advantage input `{name}` holds non-finite (or boolean) values; pass finite numbers "
                         f"({ADVANTAGE_INPUTS[name]}).")
    if name == "lengths" and bool((value < 0).any()):
        raise InputError(f"advantage input `lengths` has a negative entry ({value.min().item()}); pass token "
                         "counts (the completion mask summed over tokens).")
    return value.to(device=rewards.device)


@dataclass(frozen=True)
class AdvantageEstimator(Part):
    """Base of the estimators: ``estimator(rewards, group_ids, **inputs)`` → ``(advantages (B,), stats)``.

    A subclass implements ``estimate`` and declares the :data:`ADVANTAGE_INPUTS` it needs in ``needs`` (or, when
    that depends on its options, in ``required_inputs``); ``grouped`` says whether it compares completions of
    the same prompt (then a group of one carries no signal).
    """

    stats = ADVANTAGE_STATS
    grouped: ClassVar[bool] = True

    def required_inputs(self) -> frozenset[str]:
        """The :data:`ADVANTAGE_INPUTS` this estimator, with these options, needs."""
        return self.needs

    def __call__(self, rewards: torch.Tensor, group_ids: torch.Tensor,
                 **inputs: torch.Tensor | None) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        unknown = [k for k in inputs if k not in ADVANTAGE_INPUTS]
        if unknown:
            close = difflib.get_close_matches(unknown[0], list(ADVANTAGE_INPUTS), n=1)
            hint = f" Did you mean {close[0]!r}?" if close else ""
            raise InputError(f"advantage estimator {self.name!r} got unknown input(s) {unknown}; the inputs are "
                             f"{', '.join(ADVANTAGE_INPUTS)}.{hint}")
        given = {k: v for k, v in inputs.items() if v is not None}
        if given:
            _groups(rewards, group_ids)  # rewards' shape checked before the inputs are compared with it
        missing = sorted(self.required_inputs() - set(given))
        if missing:
            raise InputError(
                f"advantage estimator {self.name!r} needs the input(s) {', '.join(f'`{m}`' for m in missing)} "
                f"({'; '.join(ADVANTAGE_INPUTS[m] for m in missing)}) and was not given them; pass them by keyword, "
                f"e.g. compute_advantages({self.name!r}, rewards, group_ids, {missing[0]}=...).")
        wanted = self.required_inputs() | ({"reward_weights"} if "reward_components" in self.required_inputs() else set())
        used = {k: _check_input(k, given[k], rewards, given) for k in given if k in wanted}
        return self.estimate(rewards, group_ids, **used)

    def estimate(self, rewards: torch.Tensor, group_ids: torch.Tensor,
                 **inputs: torch.Tensor) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        raise NotImplementedError


def _float(rewards: torch.Tensor) -> torch.dtype:
    return torch.promote_types(rewards.dtype, torch.float32)


def _whiten_weight(mode: str, rewards: torch.Tensor, inputs: Mapping[str, torch.Tensor]) -> torch.Tensor:
    if mode == "tokens":
        return inputs["lengths"].to(_float(rewards))
    return torch.ones(rewards.shape, dtype=_float(rewards), device=rewards.device)


@ADVANTAGE_ESTIMATORS.register
@dataclass(frozen=True)
class GRPOAdvantage(AdvantageEstimator):
    """GRPO's group-relative advantage ``(r − mean_g)/(std_g + ε)`` (scale ``group``), ``/(std_B + ε)``
    (``batch``) or ``r − mean_g`` (``none``, Dr. GRPO).

    ``group`` / ``none`` equal verl's ``compute_grpo_outcome_advantage`` with ``norm_adv_by_std_in_grpo``
    True / False (verl's ε = 1e-6); ``group`` / ``batch`` / ``none`` equal TRL's ``scale_rewards`` of the same
    names (TRL's ε = 1e-4, lmpo's default).
    """

    name = "grpo"
    formula = "(r_i − mean_g r)/(std_g r + ε)"
    source = "Shao et al. 2024, DeepSeekMath (arXiv 2402.03300)"
    scale: str = param("group", "divide by the group std, the batch std, or nothing", choices=ADVANTAGE_SCALES)
    eps: float = param(1e-4, "ε added to the std", low=0.0, low_inclusive=True)

    def estimate(self, rewards, group_ids, **inputs):
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

    def estimate(self, rewards, group_ids, **inputs):
        return rloo_advantages(rewards, group_ids, scale=self.scale, eps=self.eps)


@dataclass(frozen=True)
class _BatchWhitened(AdvantageEstimator):
    """The two REINFORCE++ estimators' shared parameters: how the batch moments are weighted, and ε."""

    whiten: str = param("tokens", "batch moments weighted by token count (verl) or one weight per sequence",
                        choices=WHITEN_WEIGHTS)
    eps: float = param(1e-8, "ε added to the batch variance", low=0.0, low_inclusive=True)

    def required_inputs(self):
        return frozenset({"lengths"}) if self.whiten == "tokens" else frozenset()


@ADVANTAGE_ESTIMATORS.register
@dataclass(frozen=True)
class ReinforcePlusPlusAdvantage(_BatchWhitened):
    """REINFORCE++ (outcome reward): the reward whitened over the whole batch, no per-prompt baseline::

        A_i = (r_i − μ_B) / sqrt(σ²_B + ε)        (B,) → (B,)

    μ_B, σ²_B as in :func:`batch_whiten`; ``whiten="tokens"`` (default) weighs each sequence by its length
    ``l_i`` (input ``lengths``), which is verl's ``compute_reinforce_plus_plus_outcome_advantage`` (``core_algos.py``)
    when the reward sits on the last response token and γ = 1 (verl's default ``algorithm.gamma``): its
    discounted returns are then ``r_i`` at every token. With γ < 1 verl's advantage varies along the sequence; this
    sequence-level estimator does not cover that case. ``whiten="sequences"`` weighs each sequence once.
    """

    name = "reinforce_plus_plus"
    grouped = False
    formula = "(r_i − μ_B)/sqrt(σ²_B + ε), moments over the batch (token-weighted by default)"
    source = ("Hu et al. 2025, REINFORCE++ (arXiv 2501.03262); verl core_algos.py "
              "compute_reinforce_plus_plus_outcome_advantage (γ = 1)")
    def estimate(self, rewards, group_ids, **inputs):
        g = group_statistics(rewards, group_ids)
        r = rewards.to(_float(rewards))
        adv = batch_whiten(r, _whiten_weight(self.whiten, rewards, inputs), self.eps)
        return adv, _stats(adv, g["zero_variance"])


@ADVANTAGE_ESTIMATORS.register
@dataclass(frozen=True)
class ReinforcePlusPlusBaselineAdvantage(_BatchWhitened):
    """REINFORCE++-baseline: the group mean subtracted, then whitened over the batch::

        A_i = whiten_B(r_i − mean_g r)        (B,) → (B,)

    ``whiten_B`` as in :func:`batch_whiten` (``whiten="tokens"``, the default, weighs by ``lengths``), which is
    verl's ``compute_reinforce_plus_plus_baseline_outcome_advantage`` (``core_algos.py``) for groups of two or
    more. With token weighting the batch mean of the centred rewards is not 0, so a zero-variance group gets
    ``−μ_B/σ_B``, as in verl; with ``whiten="sequences"`` it gets 0.
    """

    name = "reinforce_plus_plus_baseline"
    formula = "whiten_B(r_i − mean_g r)"
    source = ("Hu et al. 2025, REINFORCE++ (arXiv 2501.03262); verl core_algos.py "
              "compute_reinforce_plus_plus_baseline_outcome_advantage")
    def estimate(self, rewards, group_ids, **inputs):
        g = group_statistics(rewards, group_ids)
        centred = torch.where(g["zero_variance"], 0.0, g["centred"])  # exact 0 where the mean rounds
        adv = batch_whiten(centred, _whiten_weight(self.whiten, rewards, inputs), self.eps)
        return adv, _stats(adv, g["zero_variance"])


@ADVANTAGE_ESTIMATORS.register
@dataclass(frozen=True)
class ReMaxAdvantage(AdvantageEstimator):
    """ReMax: the baseline is the reward of the prompt's greedy completion::

        A_i = r_i − b_i,   b_i = R(x_i, greedy(x_i))        rewards, baseline_rewards (B,) → (B,)

    ``baseline_rewards`` is an input (the trainer decodes one greedy completion per prompt and scores it with the
    same reward functions). verl's ``compute_remax_outcome_advantage`` (``core_algos.py``) returns the
    reward-to-go minus ``b_i`` at every token: with the reward on the last token that is ``r_i − b_i`` throughout.
    """

    name = "remax"
    grouped = False
    needs = frozenset({"baseline_rewards"})
    formula = "r_i − r(greedy completion of prompt_i)"
    source = "Li et al. 2023, ReMax (arXiv 2310.10505); verl core_algos.py compute_remax_outcome_advantage"

    def estimate(self, rewards, group_ids, **inputs):
        g = group_statistics(rewards, group_ids)
        base = inputs["baseline_rewards"].to(_float(rewards))
        adv = rewards.to(_float(rewards)) - base
        return adv, {**_stats(adv, g["zero_variance"]), "adv/baseline_mean": base.detach().mean()}


@ADVANTAGE_ESTIMATORS.register
@dataclass(frozen=True)
class OPOAdvantage(AdvantageEstimator):
    """OPO's optimal baseline for sequence rewards, the length-weighted group mean::

        A_i = r_i − b_g,   b_g = Σ_{j∈g} l_j r_j / Σ_{j∈g} l_j        rewards, lengths (B,) → (B,)

    ``l_j`` the completion lengths in tokens (input ``lengths``). Equal to verl's ``compute_opo_outcome_advantage``
    (``core_algos.py``) for groups of two or more. A group whose lengths are all 0 falls back to the plain mean.
    """

    name = "opo"
    needs = frozenset({"lengths"})
    formula = "r_i − Σ_g l_j r_j / Σ_g l_j"
    source = "Hao et al. 2025, On-Policy RL with Optimal Reward Baseline (arXiv 2505.23585); verl core_algos.py " \
             "compute_opo_outcome_advantage"

    def estimate(self, rewards, group_ids, **inputs):
        g = group_statistics(rewards, group_ids)
        inverse, num_groups = _groups(rewards, group_ids)
        r = rewards.to(_float(rewards))
        lengths = inputs["lengths"].to(r.dtype)
        weight = torch.zeros(num_groups, dtype=r.dtype, device=r.device).index_add_(0, inverse, lengths)
        weighted = torch.zeros_like(weight).index_add_(0, inverse, lengths * r)
        base = torch.where(weight[inverse] > 0, weighted[inverse] / weight[inverse].clamp(min=1e-30), g["mean"])
        adv = torch.where(g["zero_variance"], 0.0, r - base)
        return adv, _stats(adv, g["zero_variance"])


GPG_VALID = ("nonzero_reward", "group_signal")


@ADVANTAGE_ESTIMATORS.register
@dataclass(frozen=True)
class GPGAdvantage(AdvantageEstimator):
    """GPG's corrected group advantage::

        A_i = α (r_i − mean_g r) / F_norm,   α = B / max(1, B_valid)        (B,) → (B,)

    α makes up for the completions that carry no gradient. ``valid="nonzero_reward"`` (default) counts as
    ``B_valid`` the completions with a non-zero reward, as verl's ``compute_gpg_outcome_advantage``
    (``core_algos.py``) does; ``valid="group_signal"`` counts those whose group's rewards are not all equal (the
    completions with a non-zero advantage, the paper's B − M). ``f_norm`` is verl's constant ``F_norm``.
    """

    name = "gpg"
    formula = "α (r_i − mean_g r)/F_norm, α = B / B_valid"
    source = "Chu et al. 2025, GPG (arXiv 2504.02546); verl core_algos.py compute_gpg_outcome_advantage"
    valid: str = param("nonzero_reward", "what B_valid counts: completions with a non-zero reward (verl) or "
                       "in a group whose rewards differ", choices=GPG_VALID)
    f_norm: float = param(1.0, "F_norm, the constant the advantage is divided by", low=0.0)

    def estimate(self, rewards, group_ids, **inputs):
        g = group_statistics(rewards, group_ids)
        valid = (rewards != 0) if self.valid == "nonzero_reward" else ~g["zero_variance"]
        alpha = rewards.shape[0] / valid.sum().clamp(min=1).to(g["mean"].dtype)
        adv = torch.where(g["zero_variance"], 0.0, alpha * g["centred"] / self.f_norm)
        return adv, {**_stats(adv, g["zero_variance"]), "adv/gpg_alpha": alpha.detach()}


GDPO_WHITEN = (*WHITEN_WEIGHTS, "none")


@ADVANTAGE_ESTIMATORS.register
@dataclass(frozen=True)
class GDPOAdvantage(AdvantageEstimator):
    """GDPO: each reward function normalised within the group on its own, then weighted, summed and whitened::

        Â_k,i = (r_k,i − mean_g r_k) / (std_g r_k + ε)      for each of the K reward functions
        A_i = whiten_B(Σ_k w_k Â_k,i)                         reward_components (B, K), reward_weights (K,) → (B,)

    ``scale`` as GRPO's, per reward function (``none``: no division; a group where a function's values are all
    equal gets 0 for that function). ``whiten`` as :func:`batch_whiten`'s weighting (``tokens`` needs
    ``lengths``) or ``none``. ``scale="group"`` / ``"none"`` with ``whiten="tokens"`` equal verl's
    ``compute_gdpo_outcome_advantage`` (``core_algos.py``, ``norm_adv_by_std_in_grpo`` True / False, ε = 1e-6) for
    groups of two or more. TRL's ``multi_objective_aggregation="normalize_then_sum"`` is the same recipe with
    sequence-weighted whitening and ε = 1e-4 added to the standard deviations instead.
    """

    name = "gdpo"
    needs = frozenset({"reward_components"})
    formula = "whiten_B(Σ_k w_k (r_k,i − mean_g r_k)/(std_g r_k + ε))"
    source = "GDPO, group reward-decoupled normalisation (arXiv 2601.05242); verl core_algos.py " \
             "compute_gdpo_outcome_advantage"
    scale: str = param("group", "per reward function: divide by the group std, the batch std, or nothing",
                       choices=ADVANTAGE_SCALES)
    eps: float = param(1e-6, "ε added to each function's std", low=0.0, low_inclusive=True)
    whiten: str = param("tokens", "batch whitening of the sum: token-weighted (verl), per sequence, or none",
                        choices=GDPO_WHITEN)
    whiten_eps: float = param(1e-8, "ε added to the batch variance of the sum", low=0.0, low_inclusive=True)

    def required_inputs(self):
        return self.needs | ({"lengths"} if self.whiten == "tokens" else set())

    def estimate(self, rewards, group_ids, **inputs):
        g = group_statistics(rewards, group_ids)
        dtype = _float(rewards)
        comps = inputs["reward_components"].to(dtype)  # (B, K)
        K = comps.shape[1]
        weights = inputs.get("reward_weights")
        weights = torch.ones(K, dtype=dtype, device=comps.device) if weights is None else weights.to(dtype)
        total = torch.zeros_like(comps[:, 0])
        for k in range(K):
            gk = group_statistics(comps[:, k].contiguous(), group_ids)
            adv_k, _ = _scaled(gk["centred"], gk, comps[:, k], self.scale, self.eps)
            total = total + weights[k] * adv_k
        adv = total if self.whiten == "none" else batch_whiten(
            total, _whiten_weight(self.whiten, rewards, inputs), self.whiten_eps)
        return adv, _stats(adv, g["zero_variance"])


def make_estimator(name: str, *, default_scale: str | None = None, **params: object) -> AdvantageEstimator:
    """``ADVANTAGE_ESTIMATORS[name](**params)``; ``default_scale`` (the objective's ``advantage_scale``) fills the
    estimator's own ``scale`` when it has one and ``params`` does not set it, and is ignored otherwise.
    Unknown names and parameters raise ConfigError (a ValueError) naming them; numbers written as strings become numbers."""
    if name not in ADVANTAGE_ESTIMATORS:
        close = difflib.get_close_matches(str(name), list(ADVANTAGE_ESTIMATORS), n=1)
        hint = f" Did you mean {close[0]!r}?" if close else ""
        raise ConfigError(f"unknown advantage estimator {name!r}; use one of {', '.join(ADVANTAGE_ESTIMATORS)}.{hint}")
    cls = ADVANTAGE_ESTIMATORS[name]
    fields = cls.params()
    unknown = [k for k in params if k not in fields]
    if unknown:
        close = difflib.get_close_matches(unknown[0], list(fields), n=1)
        hint = f" Did you mean {close[0]!r}?" if close else ""
        raise ConfigError(f"advantage estimator {name!r} has no option {unknown[0]!r}; its options are "
                         f"{', '.join(fields) or '(none)'}.{hint}")
    if default_scale is not None and "scale" in fields:
        params = {"scale": default_scale, **params}
    hints = typing.get_type_hints(cls)
    params = {k: coerce_param(f"advantage_estimator {name!r}", k, v, hints[k]) for k, v in params.items()}
    return cls(**params)


def compute_advantages(
    name: str, rewards: torch.Tensor, group_ids: torch.Tensor, **options: object
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """Run ``ADVANTAGE_ESTIMATORS[name](**params)(rewards, group_ids, **inputs)``, where ``options`` holds both
    the estimator's parameters and its :data:`ADVANTAGE_INPUTS`; e.g. ``compute_advantages("grpo", r, g,
    scale="none")``, ``compute_advantages("opo", r, g, lengths=l)``."""
    inputs = {k: v for k, v in options.items() if k in ADVANTAGE_INPUTS}
    params = {k: v for k, v in options.items() if k not in ADVANTAGE_INPUTS}
    return make_estimator(name, **params)(rewards, group_ids, **inputs)
