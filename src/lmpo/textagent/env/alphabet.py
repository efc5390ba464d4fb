"""The character alphabet Σ (action set) built from the training chapters.

Ids: ``0 = <pad>`` (left padding of the observation window; never an action), ``1 = <eos>`` (an action:
ends the episode), ``2 = <unk>`` (characters outside Σ, e.g. rare characters of held-out chapters; never
an action), then the characters of the training chapters with count >= ``min_count``, ordered by
descending count then code point (so the most frequent characters have the smallest ids, which the
whitelist fallback relies on). ``len(alphabet) = A`` counts the special ids too: the action space is
``Discrete(A)`` and the legal mask is always 0 for ``<pad>`` and ``<unk>``.
"""

from __future__ import annotations

import unicodedata
from collections import Counter
from collections.abc import Iterable, Sequence

import numpy as np

PAD, EOS, UNK = "<pad>", "<eos>", "<unk>"


class Alphabet:
    """Bidirectional char <-> id map with per-character training counts."""

    pad_id = 0
    eos_id = 1
    unk_id = 2
    num_special = 3

    def __init__(self, chars: Sequence[str], counts: Sequence[int] | None = None) -> None:
        chars = list(chars)
        if len(set(chars)) != len(chars):
            raise ValueError("Alphabet: characters must be unique")
        self.chars: list[str] = [PAD, EOS, UNK, *chars]
        self.counts = np.zeros(len(self.chars), dtype=np.int64)
        if counts is not None:
            if len(counts) != len(chars):
                raise ValueError(f"Alphabet: {len(counts)} counts for {len(chars)} characters")
            self.counts[self.num_special :] = np.asarray(counts, dtype=np.int64)
        self.char_to_id: dict[str, int] = {c: i for i, c in enumerate(self.chars) if i >= self.num_special}

    @classmethod
    def from_texts(cls, texts: Iterable[str], min_count: int = 1) -> Alphabet:
        """Σ = characters of ``texts`` occurring at least ``min_count`` times."""
        if min_count < 1:
            raise ValueError(f"min_count={min_count} must be >= 1")
        counter: Counter[str] = Counter()
        for t in texts:
            counter.update(t)
        items = sorted(((c, n) for c, n in counter.items() if n >= min_count), key=lambda x: (-x[1], x[0]))
        if not items:
            raise ValueError(
                f"Alphabet.from_texts: no character occurs >= min_count={min_count} times in "
                f"{sum(counter.values())} characters of text; lower min_count or bring more text"
            )
        return cls([c for c, _ in items], [n for _, n in items])

    def __len__(self) -> int:
        return len(self.chars)

    def __contains__(self, ch: str) -> bool:
        return ch in self.char_to_id

    def encode(self, text: str) -> list[int]:
        """Ids of ``text``'s characters (``<unk>`` for characters outside Σ)."""
        get, unk = self.char_to_id.get, self.unk_id
        return [get(c, unk) for c in text]

    def decode(self, ids: Iterable[int]) -> str:
        """Text of ``ids``; ``<pad>`` is dropped, ``<eos>`` / ``<unk>`` are written as their names."""
        return "".join(self.chars[i] for i in ids if i != self.pad_id)

    def id_to_char(self, i: int) -> str:
        return self.chars[i]

    def garble_mask(self, common_min_count: int = 2) -> np.ndarray:
        """(A,) bool: 1 where emitting the character counts as garble.

        Garble = not in the corpus's common set (training count >= ``common_min_count``) and not
        punctuation (Unicode category P*). ``<eos>`` is never garble; ``<pad>`` / ``<unk>`` always are.
        """
        g = np.zeros(len(self), dtype=bool)
        g[self.pad_id] = g[self.unk_id] = True
        for i in range(self.num_special, len(self)):
            if self.counts[i] < common_min_count and not unicodedata.category(self.chars[i]).startswith("P"):
                g[i] = True
        return g
