"""Shared builders and slow reference implementations for the objectives tests."""

from __future__ import annotations

import torch

from lmpo.objectives import Objective
from lmpo.objectives.parts.levels import ema_loop


def make_batch(batch=6, length=20, seed=0, dtype=torch.float64, drift=0.3, holes=True, per_token_adv=False):
    """Random (logp, old_logp, advantages, mask) with some empty-ish rows and holes in the mask."""
    g = torch.Generator().manual_seed(seed)
    logp = -torch.rand(batch, length, generator=g, dtype=dtype) * 4.0 - 0.05
    old = logp + drift * torch.randn(batch, length, generator=g, dtype=dtype)
    shape = (batch, length) if per_token_adv else (batch,)
    adv = torch.randn(shape, generator=g, dtype=dtype) * 1.5
    lengths = torch.randint(1, length + 1, (batch,), generator=g)
    lengths[0] = length
    mask = torch.arange(length).unsqueeze(0) < lengths.unsqueeze(1)
    if holes:
        mask &= torch.rand(batch, length, generator=g) > 0.15
        mask[:, 0] = True
    return logp.requires_grad_(), old, adv, mask


def extra_inputs(obj: Objective, batch, length, seed=1, dtype=torch.float64):
    g = torch.Generator().manual_seed(seed)
    kw = {}
    if "entropy" in obj.needs:
        kw["entropy"] = torch.rand(batch, length, generator=g, dtype=dtype) * 2
        if obj.adaptive_entropy:
            kw["entropy_coef"] = 0.05
    if "ref_logp" in obj.needs:
        kw["ref_logp"] = -torch.rand(batch, length, generator=g, dtype=dtype) * 4
    if "token_grad_norm" in obj.needs:
        kw["token_grad_norm"] = torch.rand(batch, length, generator=g, dtype=dtype) * 3
    return kw


naive_ema = ema_loop  # the recurrence of SPEC §1.1 as a loop over T (lmpo.objectives.parts.levels)


def aggregate_loop(per_token, mask, mode, norm_constant=None):
    """Textbook aggregation with Python loops over rows (per_token (B,T), mask bool)."""
    batch, length = mask.shape
    rows = []
    for i in range(batch):
        vals = [per_token[i, t] for t in range(length) if mask[i, t]]
        rows.append((torch.stack(vals).sum() if vals else per_token.new_zeros(()), len(vals)))
    if mode == "token_mean":
        return sum(r for r, _ in rows) / max(1, sum(n for _, n in rows))
    if mode == "seq_mean_token_mean":
        return sum(r / max(n, 1) for r, n in rows) / batch
    if mode == "seq_mean_token_sum":
        return sum(r for r, _ in rows) / batch
    if mode in ("seq_sum_norm", "seq_mean_token_sum_norm"):
        return sum(r for r, _ in rows) / (batch * (length if norm_constant is None else norm_constant))
    if mode == "token_sum":
        return sum(r for r, _ in rows)
    raise ValueError(mode)
