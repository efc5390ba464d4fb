"""The no-leak baseline of the quality gate: a character n-gram model with backoff, fitted on train chapters.

Scores follow "stupid backoff" (Brants et al. 2007): for the longest context suffix u of length k < n seen
in training, ``S(c | u) = count(u c) / count(u)``; characters not seen after u are scored by the next
shorter suffix times ``backoff`` (0.4), down to unigram frequencies.  Ranking by S gives top-1 / top-3
predictions; greedy generation appends the top-1 character.  It sees exactly what the agent sees: the
true history, never the reference ahead.
"""

from __future__ import annotations

from collections import Counter, defaultdict
from collections.abc import Sequence


class NgramModel:
    """Character n-gram model (orders 1..n) with stupid backoff."""

    def __init__(self, order: int = 4, backoff: float = 0.4) -> None:
        if order < 1:
            raise ValueError(f"n-gram order must be ≥ 1, got {order}")
        self.order, self.backoff = order, backoff
        # counts[k][context of length k] = Counter(next char)
        self.counts: list[dict[str, Counter[str]]] = [defaultdict(Counter) for _ in range(order)]

    def fit(self, chapters: Sequence[str]) -> NgramModel:
        for text in chapters:
            for i, ch in enumerate(text):
                for k in range(self.order):
                    if i - k < 0:
                        break
                    self.counts[k][text[i - k:i]][ch] += 1
        self._cache: dict[str, list[str]] = {}
        return self

    def scores(self, history: str) -> dict[str, float]:
        """S(c | history) for every character seen after some suffix of the last ``order − 1`` characters."""
        key = history[len(history) - min(self.order - 1, len(history)):]
        scores: dict[str, float] = {}
        weight = 1.0
        for j in range(len(key), -1, -1):
            ctx = key[len(key) - j:] if j else ""
            counter = self.counts[j].get(ctx)
            if counter:
                total = sum(counter.values())
                for ch, c in counter.items():
                    s = weight * c / total
                    if s > scores.get(ch, 0.0):
                        scores[ch] = s
            weight *= self.backoff
        return scores

    def top_k(self, history: str, k: int = 3) -> list[str]:
        """The k highest-scoring next characters after ``history`` (a string; only its tail is used)."""
        key = history[len(history) - min(self.order - 1, len(history)):]
        cached = self._cache.get(key)
        if cached is not None and len(cached) >= k:
            return cached[:k]
        ranked = sorted(self.scores(key).items(), key=lambda x: (-x[1], x[0]))
        out = [c for c, _ in ranked[: max(k, 3)]]
        self._cache[key] = out
        return out[:k]

    def generate(self, history: str, num_chars: int) -> str:
        out = history
        for _ in range(num_chars):
            nxt = self.top_k(out, 1)
            if not nxt:
                break
            out += nxt[0]
        return out[len(history):]
