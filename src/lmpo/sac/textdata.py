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


class TextPairs:
    """The supervised pairs of a run's training text: ``corpus``'s train chapters first, then the extra text.

    ``sample`` draws a batch of row indices in which a ``corpus_share`` of the rows come from the first
    ``num_corpus`` pairs (the text the held-out chapters are drawn from) and the rest from the extra text; with
    ``corpus_share`` 0 every pair is equally likely.
    """

    def __init__(self, corpus_chapters: list[str], extra_chapters: list[str], alphabet, compliance, m: int):
        parts = [training_pairs(t, alphabet, compliance, m) for t in (corpus_chapters, extra_chapters) if t]
        self.windows, self.blocked, self.targets = (torch.cat(col) for col in zip(*parts))
        self.num_corpus = len(parts[0][2]) if corpus_chapters else 0
        self.static = torch.as_tensor(compliance.static_mask.astype(bool))

    def __len__(self) -> int:
        return len(self.targets)

    def sample(self, batch: int, corpus_share: float, integers) -> torch.Tensor:
        """(batch,) row indices. ``integers(low, high, size)`` draws uniform ints (the caller's generator)."""
        n_all, n_corpus = len(self.targets), self.num_corpus
        if corpus_share <= 0 or n_corpus in (0, n_all):
            return torch.as_tensor(integers(0, n_all, batch), dtype=torch.long)
        k = int(round(corpus_share * batch))
        return torch.cat([torch.as_tensor(integers(0, n_corpus, k), dtype=torch.long),
                          torch.as_tensor(integers(n_corpus, n_all, batch - k), dtype=torch.long)])

    def batch(self, idx: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """(windows (B, M), legal masks (B, A), next characters (B,)) of rows ``idx``."""
        return self.windows[idx], batch_masks(self.static, self.blocked[idx]), self.targets[idx]


def batch_masks(static: torch.Tensor, blocked: torch.Tensor) -> torch.Tensor:
    """(B, A) legal masks from the static mask and each row's blocked id (−1 = none)."""
    mask = static.unsqueeze(0).repeat(len(blocked), 1)
    rows = (blocked >= 0).nonzero().squeeze(-1)
    mask[rows, blocked[rows]] = False
    return mask
