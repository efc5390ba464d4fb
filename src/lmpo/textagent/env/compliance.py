"""Compliance rules ``legal(h, a)`` and the cheap per-step legal mask.

An action ``a`` (a character of the alphabet) is legal after history ``h`` when

1. its code point class is acceptable: not ``Cc`` (control), ``Cf`` (format), ``Co`` (private use), ``Cn``
   (unassigned), ``Cs`` (surrogate), and not U+FFFD (replacement character);
2. it is not in the blacklist (a set of characters; reloadable from a UTF-8 file, one or more characters per
   line, ``#`` starts a comment line);
3. appending it does not make a run of the same character longer than ``max_run_chars``.

Rules 1 and 2 do not depend on the history, so they are evaluated once per alphabet into a static boolean
vector (A,); only rule 3 is applied per step, by clearing at most one entry (the character that ends the
history when its trailing run already has ``max_run_chars`` copies). ``<eos>`` is always legal;
``<pad>`` / ``<unk>`` never are.

Fallback: if fewer than 3 actions remain legal, the mask becomes the whitelist (the ``whitelist_size`` most
frequent training characters whose code point class is acceptable — the blacklist and the run rule are
what made the set too small, so they are not applied to the whitelist) plus ``<eos>``.
"""

from __future__ import annotations

import os
import unicodedata
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

if TYPE_CHECKING:
    from lmpo.textagent.env.alphabet import Alphabet

BAD_CATEGORIES = frozenset({"Cc", "Cf", "Co", "Cn", "Cs"})
REPLACEMENT_CHAR = "\ufffd"
MIN_LEGAL_ACTIONS = 3


def char_class_ok(ch: str) -> bool:
    """Rule 1: the code point class is acceptable (see module docstring)."""
    return ch != REPLACEMENT_CHAR and unicodedata.category(ch) not in BAD_CATEGORIES


def read_blacklist(path: str | os.PathLike) -> frozenset[str]:
    """Characters listed in a UTF-8 file (every non-space character of every non-comment line)."""
    p = Path(path)
    try:
        text = p.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise FileNotFoundError(f"blacklist file {p} does not exist; fix TextEnvConfig.blacklist_path") from None
    except UnicodeDecodeError as err:
        raise ValueError(f"blacklist file {p}: not valid UTF-8 at byte offset {err.start}") from None
    chars = set()
    for line in text.splitlines():
        if line.lstrip().startswith("#"):
            continue
        chars.update(ch for ch in line if not ch.isspace())
    return frozenset(chars)


class Compliance:
    """Compliance rules over one alphabet.

    Arguments:
        alphabet: the action alphabet.
        max_run_chars: longest allowed run of one character (>= 1).
        blacklist: characters never allowed.
        blacklist_path: optional file read on construction and by ``reload_blacklist()``; its characters
            are added to ``blacklist``.
        whitelist_size: size of the fallback whitelist (most frequent training characters).
    """

    def __init__(
        self,
        alphabet: Alphabet,
        max_run_chars: int = 3,
        blacklist: frozenset[str] | set[str] | str = frozenset(),
        blacklist_path: str | os.PathLike | None = None,
        whitelist_size: int = 64,
    ) -> None:
        if max_run_chars < 1:
            raise ValueError(
                f"max_run_chars={max_run_chars} must be >= 1 (the longest allowed run of a character)"
            )
        self.alphabet = alphabet
        self.max_run_chars = int(max_run_chars)
        self._base_blacklist = frozenset(blacklist)
        self.blacklist_path = blacklist_path
        self.whitelist_size = int(whitelist_size)
        self.reload_blacklist()

    # -- static part ---------------------------------------------------------------------------------
    def reload_blacklist(self) -> None:
        """Re-read ``blacklist_path`` (if any) and recompute the static masks."""
        extra = read_blacklist(self.blacklist_path) if self.blacklist_path is not None else frozenset()
        self.blacklist = self._base_blacklist | extra
        a = self.alphabet
        class_ok = np.zeros(len(a), dtype=bool)
        for i, ch in enumerate(a.chars):
            if i >= a.num_special:
                class_ok[i] = char_class_ok(ch)
        static = class_ok.copy()
        for ch in self.blacklist:
            i = a.char_to_id.get(ch)
            if i is not None:
                static[i] = False
        static[a.eos_id] = True
        #: (A,) bool: rules 1 and 2 (history-free), eos legal, pad/unk illegal
        self.static_mask = static
        # whitelist: most frequent class-ok chars (alphabet ids are ordered by descending count)
        order = [i for i in range(a.num_special, len(a)) if class_ok[i]][: self.whitelist_size]
        wl = np.zeros(len(a), dtype=bool)
        wl[order] = True
        wl[a.eos_id] = True
        #: (A,) bool: fallback mask used when fewer than 3 actions are legal
        self.whitelist_mask = wl
        self._static_count = int(static.sum())

    # -- per step ------------------------------------------------------------------------------------
    def run_blocked(self, history: list[int]) -> int:
        """Id that rule 3 forbids after ``history`` (its trailing run is full), or -1."""
        k = self.max_run_chars
        if len(history) < k:
            return -1
        last = history[-1]
        if last < self.alphabet.num_special:
            return -1
        for j in range(2, k + 1):
            if history[-j] != last:
                return -1
        return last

    def mask(self, history: list[int]) -> tuple[np.ndarray, bool]:
        """Legal mask (A,) bool after ``history`` (list of ids) and whether the whitelist fallback was used."""
        blocked = self.run_blocked(history)
        count = self._static_count
        if blocked >= 0 and self.static_mask[blocked]:
            count -= 1
        if count < MIN_LEGAL_ACTIONS:
            return self.whitelist_mask.copy(), True
        m = self.static_mask.copy()
        if blocked >= 0:
            m[blocked] = False
        return m, False

    def legal(self, history: list[int], action: int) -> bool:
        """``legal(h, a)``: whether ``action`` is in the legal set after ``history`` (fallback included)."""
        if not 0 <= action < len(self.alphabet):
            return False
        return bool(self.mask(history)[0][action])
