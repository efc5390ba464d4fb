"""Supervised pairs of a text: every (window, next character) position with its legal mask, stored compactly."""

from __future__ import annotations

import numpy as np
import torch


def training_pairs(texts: list[str], alphabet, compliance, m: int):
    """Every ``(left-padded window, blocked id, next id)`` of ``texts`` whose target the mask allows.

    The legal mask of a history is the static mask minus at most one id (a full run of one character), so a
    pair stores that id (−1 for none) instead of a (|Σ|,) mask.
    """
    from lmpo.sac.evaluate import left_padded_window

    windows, blocked, targets = [], [], []
    static = compliance.static_mask
    for text in texts:
        ids = alphabet.encode(text)
        for p in range(1, len(ids)):
            b = compliance.run_blocked(ids[:p][-compliance.max_run_chars:])
            t = ids[p]
            if t == b or not static[t]:
                continue
            windows.append(left_padded_window(ids, p, m, alphabet.pad_id))
            blocked.append(b)
            targets.append(t)
    return (torch.as_tensor(np.stack(windows)), torch.as_tensor(blocked, dtype=torch.long),
            torch.as_tensor(targets, dtype=torch.long))


def batch_masks(static: torch.Tensor, blocked: torch.Tensor) -> torch.Tensor:
    """(B, A) legal masks from the static mask and each row's blocked id (−1 = none)."""
    mask = static.unsqueeze(0).repeat(len(blocked), 1)
    rows = (blocked >= 0).nonzero().squeeze(-1)
    mask[rows, blocked[rows]] = False
    return mask
