"""Reference-model sync (TR-DPO, Gorbatovski et al. 2024, arXiv 2404.09656): every N optimizer steps the
reference moves towards the policy, ``θ_ref ← α·θ + (1 − α)·θ_ref`` (α = 1: a hard copy).

The trainer calls :func:`sync_reference` after optimizer steps N, 2N, … (``objective.ref_sync_steps``,
``objective.ref_sync_alpha``), as TRL's ``SyncRefModelCallback`` does on ``global_step % ref_model_sync_steps
== 0`` with ``ref_model_mixup_alpha`` (trl/trainer/callbacks.py ``_sync_target_model``). Only parameters move
(buffers stay, as in TRL); the reference is saved in every checkpoint (``ref.safetensors``), so a resumed run
continues from the mixed reference.
"""

from __future__ import annotations

import torch

from lmpo.errors import InputError


def check_sync_compatible(ref_model: torch.nn.Module, model: torch.nn.Module) -> None:
    """Refuse a reference whose parameters do not pair with the policy's (same names, shapes, dtypes)."""
    ref = {n: (tuple(p.shape), p.dtype) for n, p in ref_model.named_parameters()}
    pol = {n: (tuple(p.shape), p.dtype) for n, p in model.named_parameters()}
    if ref != pol:
        diff = sorted(set(ref.items()) ^ set(pol.items()))[:3]
        raise InputError(f"`objective.ref_sync_steps` > 0 mixes the policy into the reference model, but their "
                         f"parameters differ (first differences: {diff}); `model.ref_path` names a model of "
                         "another architecture or dtype. Leave model.ref_path empty (the reference is then a copy "
                         "of the initial policy) or set objective.ref_sync_steps: 0.")


@torch.no_grad()
def sync_reference(ref_model: torch.nn.Module, model: torch.nn.Module, alpha: float) -> None:
    """In place: every reference parameter ← ``alpha``·policy + (1 − ``alpha``)·reference.

    Pairs parameters by name (``named_parameters``: tied weights once each), and computes
    ``ref.mul_(1 − α).add_(θ, alpha=α)`` as TRL does, so the result is the same to the bit.
    """
    if not 0.0 <= alpha <= 1.0:
        raise ValueError(f"ref sync alpha must be in [0, 1], got {alpha}")
    policy = dict(model.named_parameters())
    for name, ref_p in ref_model.named_parameters():
        ref_p.mul_(1.0 - alpha).add_(policy[name].detach(), alpha=alpha)


__all__ = ["check_sync_compatible", "sync_reference"]
