"""Supervised pairs of a text: every (window, next character) position with its legal mask, stored compactly."""

from __future__ import annotations

import numpy as np
import torch


def training_pairs(texts: list[str], alphabet, compliance, m: int):
    """Every ``(left-padded window, blocked id, next id)`` of ``texts`` whose target the mask allows.

    The legal mask of a history is the static mask minus at most one id (a full run of one character), so a
    pair stores that id (−1 for none) instead of a (|Σ|,) mask. Vectorised per text (the classical text has
    ~360k positions): the window before position p is ``padded[p : p + m]`` of the text left-padded by m.
    """
    static, k, special = compliance.static_mask, compliance.max_run_chars, alphabet.num_special
    windows, blocked, targets = [], [], []
    for text in texts:
        ids = np.asarray(alphabet.encode(text), dtype=np.int64)
        n = len(ids)
        if n < 2:
            continue
        last = ids[:-1]  # the character before each target position p = 1..n−1
        full_run = (np.arange(1, n) >= k) & (last >= special)
        for j in range(2, k + 1):
            # ids[p − j] for p = 1..n−1; positions with p < j are already excluded by p ≥ k
            before = np.concatenate([np.full(j - 1, -1, dtype=np.int64), ids[:n - j]])
            full_run &= before == last
        b = np.where(full_run, last, -1)
        t = ids[1:]
        keep = (t != b) & static[t]
        padded = np.concatenate([np.full(m, alphabet.pad_id, dtype=np.int64), ids])
        windows.append(np.lib.stride_tricks.sliding_window_view(padded, m)[1:n][keep])
        blocked.append(b[keep])
        targets.append(t[keep])
    if not targets:
        return (torch.zeros((0, m), dtype=torch.long), torch.zeros(0, dtype=torch.long),
                torch.zeros(0, dtype=torch.long))
    return (torch.as_tensor(np.concatenate(windows)), torch.as_tensor(np.concatenate(blocked)),
            torch.as_tensor(np.concatenate(targets)))


class TextPairs:
    """The supervised pairs of a run's training text: ``corpus``'s train chapters first, then the extra text.

    ``sample`` draws a batch of row indices in which a ``corpus_share`` of the rows come from the first
    ``num_corpus`` pairs (the text the held-out chapters are drawn from) and the rest from the extra text; with
    ``corpus_share`` 0 every pair is equally likely.
    """

    def __init__(self, corpus_chapters: list[str], extra_chapters: list[str], alphabet, compliance, m: int):
        parts = [training_pairs(t, alphabet, compliance, m) for t in (corpus_chapters, extra_chapters)]
        self.windows, self.blocked, self.targets = (torch.cat(col) for col in zip(*parts))
        self.num_corpus = len(parts[0][2])
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
