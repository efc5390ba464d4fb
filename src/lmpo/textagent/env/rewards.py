"""Reward pieces of the character environment: n-gram coverage, EMA standardisation, potential shaping.

Coverage (docs/textenv.md). Let ``y`` be the episode's character sequence (the ``h0`` history characters
followed by the characters the environment appended, one per step) and ``r`` the reference characters at
the same positions. After a step, with ``L = len(y) - 1`` the last index and ``w0 = max(0, L - W + 1)`` the
first index of the last ``W`` characters,

    S_t = { y[q-n+1 .. q] : q >= h0, q-n+1 >= w0 }         agent n-grams in the last W characters
    G_t = { r[q-n+1 .. q] : q >= h0, q-n+1 >= w0 }         reference n-grams of the aligned window
    cov_t = |S_t ∩ G_t| / |S_t|   (sets of distinct n-grams; 0 when S_t is empty)

Only n-grams that end on an appended character count (n-grams lying entirely in the starting history would
give free coverage). ``NgramCoverage`` maintains both multisets with counters and the number of distinct
agent n-grams present in G_t, updating in O(1) per step (one n-gram enters, at most one leaves);
``coverage_from_scratch`` is the direct set computation it is tested against.
"""

from __future__ import annotations

import math
from collections.abc import Sequence


def coverage_from_scratch(y: Sequence[int], r: Sequence[int], h0: int, n: int, window_chars: int) -> float:
    """``cov_t`` by direct set construction (the slow reference for ``NgramCoverage``)."""
    last = len(y) - 1
    w0 = max(0, last - window_chars + 1)
    s, g = set(), set()
    for q in range(max(h0, w0 + n - 1), last + 1):
        s.add(tuple(y[q - n + 1 : q + 1]))
        g.add(tuple(r[q - n + 1 : q + 1]))
    if not s:
        return 0.0
    return len(s & g) / len(s)


def ngram_keys(ids: Sequence[int], n: int, base: int) -> list[int]:
    """Integer key of the n-gram ending at each position (``-1`` where fewer than n characters precede).

    ``key(x_1..x_n) = Σ_k x_k · base^(n-k)`` — unique for ids < base.
    """
    keys = [-1] * len(ids)
    for e in range(n - 1, len(ids)):
        k = 0
        for j in range(e - n + 1, e + 1):
            k = k * base + ids[j]
        keys[e] = k
    return keys


class NgramCoverage:
    """Incremental ``cov_t`` (see module docstring).

    Use: ``start(ref_keys, offset, h0)`` at reset, where ``ref_keys[e]`` is the key of the reference n-gram
    ending at chapter position ``e`` and ``offset`` maps y-index ``q`` to chapter position ``offset + q``;
    then ``push(y)`` after each append to ``y`` (a list of ids) returns ``cov_t``.
    """

    def __init__(self, n: int, window_chars: int, base: int) -> None:
        if n < 1:
            raise ValueError(f"coverage n={n} must be >= 1")
        if window_chars < n:
            raise ValueError(f"coverage window_chars={window_chars} must be >= n={n}")
        self.n, self.window_chars, self.base = n, window_chars, base
        self._mod = base ** (n - 1)
        self.start([], 0, 0)

    def start(self, ref_keys: Sequence[int], offset: int, h0: int) -> None:
        self.ref_keys, self.offset, self.h0 = ref_keys, offset, h0
        self.agent: dict[int, int] = {}
        self.ref: dict[int, int] = {}
        self.hits = 0  # distinct agent n-grams with ref count > 0
        self._agent_keys: dict[int, int] = {}  # end index -> agent key, for removal

    def _agent_key(self, y: Sequence[int], q: int) -> int:
        k = 0
        for j in range(q - self.n + 1, q + 1):
            k = k * self.base + y[j]
        return k

    def _add(self, ak: int, rk: int) -> None:
        agent, ref = self.agent, self.ref
        c = agent.get(ak, 0)
        agent[ak] = c + 1
        if c == 0 and ref.get(ak, 0) > 0:
            self.hits += 1
        c = ref.get(rk, 0)
        ref[rk] = c + 1
        if c == 0 and agent.get(rk, 0) > 0:
            self.hits += 1

    def _remove(self, ak: int, rk: int) -> None:
        agent, ref = self.agent, self.ref
        c = agent[ak] - 1
        if c == 0:
            del agent[ak]
            if ref.get(ak, 0) > 0:
                self.hits -= 1
        else:
            agent[ak] = c
        c = ref[rk] - 1
        if c == 0:
            del ref[rk]
            if agent.get(rk, 0) > 0:
                self.hits -= 1
        else:
            ref[rk] = c

    def push(self, y: Sequence[int]) -> float:
        n, last = self.n, len(y) - 1
        if last >= self.h0 and last - n + 1 >= 0:
            ak = self._agent_key(y, last)
            self._agent_keys[last] = ak
            self._add(ak, self.ref_keys[self.offset + last])
        # the n-gram starting just before the new window start leaves (end = w0 + n - 2)
        w0 = last - self.window_chars + 1
        if w0 >= 1:
            q_out = w0 + n - 2
            ak = self._agent_keys.pop(q_out, None)
            if ak is not None:
                self._remove(ak, self.ref_keys[self.offset + q_out])
        size = len(self.agent)
        return self.hits / size if size else 0.0

    @property
    def value(self) -> float:
        size = len(self.agent)
        return self.hits / size if size else 0.0

    def state_dict(self) -> dict:
        """The counters of the current episode (``ref_keys`` is the chapter's, rebuilt by the caller)."""
        return {"offset": self.offset, "h0": self.h0, "agent": dict(self.agent), "ref": dict(self.ref),
                "hits": self.hits, "agent_keys": dict(self._agent_keys)}

    def load_state_dict(self, state: dict, ref_keys: Sequence[int]) -> None:
        self.start(ref_keys, int(state["offset"]), int(state["h0"]))
        self.agent = {int(k): int(v) for k, v in state["agent"].items()}
        self.ref = {int(k): int(v) for k, v in state["ref"].items()}
        self.hits = int(state["hits"])
        self._agent_keys = {int(k): int(v) for k, v in state["agent_keys"].items()}


class EmaStandardizer:
    """EMA standardisation (the seed's "PopArt/EMA"): running mean and variance, then a z-score.

    Per update with observation x, the n-th (docs/textenv.md)::

        b  = max(β, 1/n)   with warmup,   b = β   without
        μ  ← (1−b)·μ + b·x
        σ² ← (1−b)·σ² + b·(x − μ)²        (with the updated μ)
        N(x) = (x − μ) / (σ + ε)

    Without warm-up the statistics start from ``μ = init_mean`` (0), ``σ² = init_var`` (1) and settle after
    about 1/β updates, so a quantity far from 0 is mis-centred for that long (the text environment's InfoNCE
    score sits near −4; with β = 1e-3 an environment that steps 1,500 times in a run never gets there, and its
    rewards drift upwards the whole run).  With warm-up the first 1/β updates are a running average (μ is
    then the exact sample mean and the init values drop out), and the EMA takes over from there.
    """

    def __init__(self, beta: float = 1e-3, eps: float = 1e-8, init_mean: float = 0.0, init_var: float = 1.0,
                 warmup: bool = False):
        if not 0.0 < beta <= 1.0:
            raise ValueError(f"EMA standardisation beta={beta} must be in (0, 1]")
        if init_var < 0:
            raise ValueError(f"init_var={init_var} must be >= 0")
        self.beta, self.eps = float(beta), float(eps)
        self.init_mean, self.init_var = float(init_mean), float(init_var)
        self.warmup = bool(warmup)
        self.reset()

    def reset(self) -> None:
        self.mean, self.var, self.count = self.init_mean, self.init_var, 0

    @property
    def std(self) -> float:
        return math.sqrt(self.var)

    def update(self, x: float) -> float:
        """Update the statistics with ``x`` and return ``N(x)``."""
        self.count += 1
        b = max(self.beta, 1.0 / self.count) if self.warmup else self.beta
        mean = (1.0 - b) * self.mean + b * x
        d = x - mean
        var = (1.0 - b) * self.var + b * d * d
        self.mean, self.var = mean, var
        scale = math.sqrt(var) + self.eps
        return d / scale if scale > 0 else 0.0  # σ = ε = 0 only when every value so far was x itself

    def normalize(self, x: float) -> float:
        """``N(x)`` with the current statistics, without updating them."""
        return (x - self.mean) / (math.sqrt(self.var) + self.eps)

    def state_dict(self) -> dict[str, float]:
        return {"mean": self.mean, "var": self.var, "count": self.count}

    def load_state_dict(self, state: dict[str, float]) -> None:
        self.mean, self.var, self.count = float(state["mean"]), float(state["var"]), int(state["count"])
