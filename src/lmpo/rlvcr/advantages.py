"""RLVCR advantages (docs/rlvcr.md): action advantage from the originals, thinking advantage from
competition inside each thinking group, mixed linearly.

A batch holds ``B`` samples: the originals (completions sampled by the rollout, ``is_original``) and, for
every successful original, ``L − 1`` expanded samples that share its action but carry thinking regenerated
at another level. The original and its expansions form one *thinking group* (``thinking_group_id ≥ 0``);
originals that were not expanded carry ``thinking_group_id = −1``.

    A_action[i]   = GRPO(rewards of originals, grouped by prompt)[i]          for originals,
                    A_action[original of i's thinking group]                 for expanded samples;
    A_thinking[i] = R_think[i] − mean_{j ∈ group(i)} R_think[j]               inside a thinking group,
                    0                                                        outside;
    A[i]          = (1 − w)·A_action[i] + w·A_thinking[i].

The action advantage never sees the expanded samples, so adding L − 1 copies of a successful trajectory does
not shift the prompt's mean or std (the seed's "avoid sample-count bias"); the thinking advantage is
zero-mean inside each group and is *not* divided by a std, so its size keeps the scale of the confidence gap.
"""

from __future__ import annotations

import torch

from lmpo.objectives.advantages import grpo_advantages
from lmpo.objectives.objective import ADVANTAGE_SCALES

Tensor = torch.Tensor

FAMILY_ACTIONS = ("copy", "split", "original")
"""How a thinking group's members share their original's action advantage (``rlvcr_advantages``)."""


def group_normalized_advantages(rewards: Tensor, group_ids: Tensor, eps: float = 1e-4,
                                scale: str = "group") -> Tensor:
    """GRPO advantages ``(r − mean_g) / (std_g + ε)`` of the objectives layer (docs/objectives.md), (B,) -> (B,).

    ``lmpo.objectives.advantages.grpo_advantages`` itself, so that RLVCR with w = 0 reproduces the trainer's
    plain GRPO bit for bit: unbiased std, ``scale`` group | batch | none, singleton / zero-variance groups → 0.
    """
    return grpo_advantages(rewards, group_ids, scale=scale, eps=eps)[0]


def _validate(rewards: Tensor, group_ids: Tensor, is_original: Tensor, thinking_group_id: Tensor,
              thinking_rewards: Tensor, thinking_weight: float, scale: str) -> None:
    if rewards.dim() != 1:
        raise ValueError(f"rlvcr_advantages: `rewards` must have shape (B,), got {tuple(rewards.shape)}.")
    B = rewards.shape[0]
    for name, t in (("group_ids", group_ids), ("is_original", is_original),
                    ("thinking_group_id", thinking_group_id), ("thinking_rewards", thinking_rewards)):
        if tuple(t.shape) != (B,):
            raise ValueError(f"rlvcr_advantages: `{name}` must have shape (B,) = ({B},) like `rewards`, got "
                             f"{tuple(t.shape)}.")
    if is_original.dtype != torch.bool:
        raise ValueError(f"rlvcr_advantages: `is_original` must be a bool tensor, got {is_original.dtype}.")
    for name, t in (("group_ids", group_ids), ("thinking_group_id", thinking_group_id)):
        if t.dtype.is_floating_point or t.dtype == torch.bool or t.is_complex():
            raise ValueError(f"rlvcr_advantages: `{name}` must be an integer tensor, got {t.dtype}.")
    if not 0.0 <= float(thinking_weight) <= 1.0:
        raise ValueError(f"rlvcr_advantages: `thinking_weight` = {thinking_weight!r} must be in [0, 1] "
                         "(0 = plain GRPO on the originals, 1 = thinking advantages only).")
    if scale not in ADVANTAGE_SCALES:
        raise ValueError(f"rlvcr_advantages: `scale` = {scale!r} must be one of {', '.join(ADVANTAGE_SCALES)}.")
    if bool(((thinking_group_id < 0) & ~is_original).any()):
        bad = int(((thinking_group_id < 0) & ~is_original).nonzero()[0])
        raise ValueError(f"rlvcr_advantages: sample {bad} is not an original but has thinking_group_id = -1; an "
                         "expanded sample must belong to the thinking group of the original it came from.")
    in_group = thinking_group_id >= 0
    if bool(in_group.any()):
        ids, inv = torch.unique(thinking_group_id[in_group], return_inverse=True)
        originals = torch.zeros(len(ids), dtype=torch.long, device=ids.device).index_add_(
            0, inv, is_original[in_group].long())
        if bool((originals != 1).any()):
            k = int((originals != 1).nonzero()[0])
            raise ValueError(f"rlvcr_advantages: thinking group {int(ids[k])} has {int(originals[k])} originals; "
                             "every thinking group needs exactly one original (is_original=True).")
        g = group_ids[in_group]
        first = torch.full((len(ids),), 0, dtype=g.dtype, device=g.device).scatter_(0, inv, g)
        if bool((first[inv] != g).any()):
            k = int(inv[(first[inv] != g).nonzero()[0]])
            raise ValueError(f"rlvcr_advantages: thinking group {int(ids[k])} mixes prompt groups; all members of "
                             "a thinking group must carry the group_ids of their original's prompt.")
        if not bool(torch.isfinite(thinking_rewards[in_group]).all()):
            raise ValueError("rlvcr_advantages: `thinking_rewards` is not finite inside a thinking group.")


def rlvcr_advantages(
    rewards: Tensor,
    group_ids: Tensor,
    is_original: Tensor,
    thinking_group_id: Tensor,
    thinking_rewards: Tensor,
    thinking_weight: float = 0.5,
    eps: float = 1e-4,
    scale: str = "group",
    validate: bool = True,
    family_action: str = "copy",
) -> tuple[Tensor, dict[str, Tensor]]:
    """Final RLVCR advantages ``(1 − w)·A_action + w·A_thinking`` and their parts.

    Args:
        rewards: (B,) episode rewards; only the originals' enter the action advantage.
        group_ids: (B,) integer prompt-group ids (expanded samples carry their original's).
        is_original: (B,) bool, True for samples that came out of the rollout.
        thinking_group_id: (B,) integer, the thinking group (an original and its L − 1 expansions), −1 for
            originals that were not expanded.
        thinking_rewards: (B,) ``confidence − λ_cost·cost``; ignored outside thinking groups.
        thinking_weight: w ∈ [0, 1].
        eps, scale: of the GRPO action advantage (see :func:`group_normalized_advantages`).
        validate: check shapes, dtypes and the group structure (host syncs; on by default).
        family_action: how a thinking group's members receive their original's action advantage: ``copy`` (each
            member gets all of it: the seed's formula; a success then weighs L samples in the gradient while a
            failure weighs one) or ``split`` (each of the n members gets ``A_action / n``: the family carries the
            action weight of the one sampled completion, and the batch's advantages stay centred) or ``original``
            (the original keeps all of it, each expansion gets 0: an expansion's advantage is its thinking
            advantage alone, so thinking that makes the answer less likely is never reinforced by the answer's
            success; docs/rlvcr.md, "Collapse at small scale").
    Returns:
        ``advantages`` (B,) and ``parts``: ``action`` (B,), ``thinking`` (B,), and detached 0-dim statistics
        ``rlvcr/...`` (the number of thinking groups and expanded samples, mean/abs-mean of each part).
    """
    if family_action not in FAMILY_ACTIONS:
        raise ValueError(f"rlvcr_advantages: `family_action` = {family_action!r} must be one of "
                         f"{', '.join(FAMILY_ACTIONS)}.")
    if validate:
        _validate(rewards, group_ids, is_original, thinking_group_id, thinking_rewards, thinking_weight, scale)
    w = float(thinking_weight)
    B = rewards.shape[0]
    dtype = rewards.dtype if rewards.dtype.is_floating_point else torch.float32
    action = torch.zeros(B, dtype=dtype, device=rewards.device)
    orig = is_original.nonzero().squeeze(-1)
    action[orig] = group_normalized_advantages(rewards[orig].to(dtype), group_ids[orig], eps, scale)

    thinking = torch.zeros(B, dtype=dtype, device=rewards.device)
    in_group = thinking_group_id >= 0
    members = in_group.nonzero().squeeze(-1)
    num_groups = torch.zeros((), dtype=torch.long, device=rewards.device)
    if members.numel():
        ids, inv = torch.unique(thinking_group_id[members], return_inverse=True)
        n = ids.shape[0]
        num_groups = torch.tensor(n, device=rewards.device)
        # The one original per group donates its action advantage to every member.
        donor = torch.zeros(n, dtype=dtype, device=rewards.device).index_add_(
            0, inv, torch.where(is_original[members], action[members], torch.zeros_like(action[members])))
        if family_action == "split":
            size = torch.zeros(n, dtype=dtype, device=rewards.device).index_add_(
                0, inv, torch.ones_like(action[members]))
            donor = donor / size
        if family_action == "original":
            # the action was sampled after the original's thinking only: the expansions get none of its
            # advantage and are judged by the thinking advantage alone
            action[members] = torch.where(is_original[members], action[members], torch.zeros_like(action[members]))
        else:
            action[members] = donor[inv]
        tr = thinking_rewards[members].to(torch.float64)
        count = torch.zeros(n, dtype=torch.float64, device=rewards.device).index_add_(0, inv, torch.ones_like(tr))
        mean = torch.zeros(n, dtype=torch.float64, device=rewards.device).index_add_(0, inv, tr) / count
        thinking[members] = (tr - mean[inv]).to(dtype)

    final = (1.0 - w) * action + w * thinking
    stats = {
        "rlvcr/thinking_groups": num_groups.detach(),
        "rlvcr/expanded_samples": (~is_original).sum().detach(),
        "rlvcr/action_adv_mean": action.mean().detach() if B else action.new_zeros(()),
        "rlvcr/thinking_adv_abs_mean": (thinking[members].abs().mean() if members.numel()
                                        else thinking.new_zeros(())).detach(),
        "rlvcr/final_adv_mean": final.mean().detach() if B else final.new_zeros(()),
        "rlvcr/final_adv_std": (final.std() if B > 1 else final.new_zeros(())).detach(),
    }
    parts = {"action": action, "thinking": thinking, **stats}
    return final, parts
