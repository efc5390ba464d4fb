"""Replay buffers with typed samples: an agent buffer, a demo (teacher) buffer, ρ-mixed batches (docs/sac.md).

Legal masks are stored bit-packed (|Σ|/8 bytes per mask) so a 100k-transition buffer over a 5k alphabet
takes ~125 MB of masks rather than 1 GB.  Shapes: ``B`` transitions, ``M`` window, ``A`` actions.
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np
import torch


class ReplaySample(NamedTuple):
    """One batch of transitions (torch tensors on the requested device).

    obs (B, M) int64 window; legal (B, A) bool mask of A(s); action (B,) int64; reward (B,) float32;
    next_obs (B, M); next_legal (B, A); terminated (B,) float32 (1 = no bootstrap); truncated (B,) float32
    (bookkeeping only: truncation bootstraps); is_demo (B,) bool; teacher_action (B,) int64 reference
    character c_t of the step (the BC label on demo rows; for agent rows, what the teacher would have done);
    is_relabeled (B,) bool (teacher action replaced by the nearest legal character).
    """

    obs: torch.Tensor
    legal: torch.Tensor
    action: torch.Tensor
    reward: torch.Tensor
    next_obs: torch.Tensor
    next_legal: torch.Tensor
    terminated: torch.Tensor
    truncated: torch.Tensor
    is_demo: torch.Tensor
    teacher_action: torch.Tensor
    is_relabeled: torch.Tensor


class ReplayBuffer:
    """Ring buffer of transitions; ``sample`` draws uniformly with a ``numpy.random.Generator``."""

    def __init__(self, capacity: int, window: int, num_actions: int, is_demo: bool) -> None:
        if capacity < 1:
            raise ValueError(f"replay capacity must be ≥ 1, got {capacity}")
        self.capacity, self.window, self.num_actions, self.is_demo = capacity, window, num_actions, is_demo
        packed = (num_actions + 7) // 8
        self.obs = np.zeros((capacity, window), dtype=np.int32)
        self.next_obs = np.zeros((capacity, window), dtype=np.int32)
        self.legal = np.zeros((capacity, packed), dtype=np.uint8)
        self.next_legal = np.zeros((capacity, packed), dtype=np.uint8)
        self.action = np.zeros(capacity, dtype=np.int64)
        self.teacher_action = np.zeros(capacity, dtype=np.int64)
        self.reward = np.zeros(capacity, dtype=np.float32)
        self.terminated = np.zeros(capacity, dtype=np.float32)
        self.truncated = np.zeros(capacity, dtype=np.float32)
        self.is_relabeled = np.zeros(capacity, dtype=bool)
        self.pos = 0
        self.size = 0

    def __len__(self) -> int:
        return self.size

    def add(self, obs: np.ndarray, legal: np.ndarray, action: int, reward: float, next_obs: np.ndarray,
            next_legal: np.ndarray, terminated: bool, truncated: bool, teacher_action: int,
            is_relabeled: bool = False) -> None:
        i = self.pos
        self.obs[i] = obs
        self.next_obs[i] = next_obs
        self.legal[i] = np.packbits(np.asarray(legal, dtype=bool))
        self.next_legal[i] = np.packbits(np.asarray(next_legal, dtype=bool))
        self.action[i] = action
        self.teacher_action[i] = teacher_action
        self.reward[i] = reward
        self.terminated[i] = float(terminated)
        self.truncated[i] = float(truncated)
        self.is_relabeled[i] = is_relabeled
        self.pos = (i + 1) % self.capacity
        self.size = min(self.size + 1, self.capacity)

    def _unpack(self, packed: np.ndarray) -> np.ndarray:
        return np.unpackbits(packed, axis=-1, count=self.num_actions).astype(bool)

    def sample_arrays(self, idx: np.ndarray) -> dict[str, np.ndarray]:
        n = len(idx)
        return {
            "obs": self.obs[idx], "legal": self._unpack(self.legal[idx]), "action": self.action[idx],
            "reward": self.reward[idx], "next_obs": self.next_obs[idx],
            "next_legal": self._unpack(self.next_legal[idx]), "terminated": self.terminated[idx],
            "truncated": self.truncated[idx], "is_demo": np.full(n, self.is_demo),
            "teacher_action": self.teacher_action[idx], "is_relabeled": self.is_relabeled[idx],
        }

    def state_dict(self) -> dict[str, np.ndarray | int]:
        keys = ("obs", "next_obs", "legal", "next_legal", "action", "teacher_action", "reward", "terminated",
                "truncated", "is_relabeled")
        state: dict[str, np.ndarray | int] = {k: getattr(self, k)[: self.size].copy() for k in keys}
        state["pos"], state["size"] = self.pos, self.size
        return state

    def load_state_dict(self, state: dict[str, np.ndarray | int]) -> None:
        size = int(state["size"])
        for k, v in state.items():
            if k in ("pos", "size"):
                continue
            getattr(self, k)[:size] = v
        self.pos, self.size = int(state["pos"]), size


def mixed_counts(batch: int, agent_fraction: float, agent_size: int, demo_size: int) -> tuple[int, int]:
    """How many agent and demo rows to draw: round(ρ·B) agent rows, the rest demo; a buffer that is empty
    (or too small) hands its share to the other so the batch size stays B."""
    n_agent = int(round(agent_fraction * batch))
    if agent_size == 0:
        n_agent = 0
    if demo_size == 0:
        n_agent = batch
    return n_agent, batch - n_agent


def sample_mixed(agent: ReplayBuffer, demo: ReplayBuffer, batch: int, agent_fraction: float,
                 rng: np.random.Generator, device: torch.device | str = "cpu") -> ReplaySample:
    """ρ-mixed batch: agent rows first, then demo rows, drawn uniformly with replacement."""
    n_agent, n_demo = mixed_counts(batch, agent_fraction, len(agent), len(demo))
    parts = []
    if n_agent:
        parts.append(agent.sample_arrays(rng.integers(0, len(agent), n_agent)))
    if n_demo:
        if len(demo) == 0:
            raise ValueError("both replay buffers are empty: collect transitions before sampling")
        parts.append(demo.sample_arrays(rng.integers(0, len(demo), n_demo)))
    cat = {k: np.concatenate([p[k] for p in parts]) for k in parts[0]}
    as_t = {
        "obs": torch.from_numpy(cat["obs"].astype(np.int64)),
        "legal": torch.from_numpy(cat["legal"]),
        "action": torch.from_numpy(cat["action"]),
        "reward": torch.from_numpy(cat["reward"]),
        "next_obs": torch.from_numpy(cat["next_obs"].astype(np.int64)),
        "next_legal": torch.from_numpy(cat["next_legal"]),
        "terminated": torch.from_numpy(cat["terminated"]),
        "truncated": torch.from_numpy(cat["truncated"]),
        "is_demo": torch.from_numpy(cat["is_demo"]),
        "teacher_action": torch.from_numpy(cat["teacher_action"]),
        "is_relabeled": torch.from_numpy(cat["is_relabeled"]),
    }
    return ReplaySample(**{k: v.to(device) for k, v in as_t.items()})


def teacher_ratio(env_steps: int, start: float, end: float, anneal_env_steps: int) -> float:
    """DAgger schedule: linear from ``start`` to ``end`` over ``anneal_env_steps``, then constant."""
    if anneal_env_steps <= 0:
        return end
    frac = min(1.0, max(0.0, env_steps / anneal_env_steps))
    return start + (end - start) * frac


def nearest_legal(action: int, legal: np.ndarray, code_points: np.ndarray, eos_id: int) -> int | None:
    """Relabel a forbidden teacher action to the legal character with the nearest code point.

    ``code_points`` (A,) code point per action id (−1 for special ids such as pad/eos, never chosen).
    Ties go to the lower code point.  Returns None when no legal character exists (only specials legal).
    """
    ok = legal.astype(bool) & (code_points >= 0)
    ok[eos_id] = False
    if not ok.any():
        return None
    target = code_points[action] if code_points[action] >= 0 else 0
    dist = np.where(ok, np.abs(code_points - target), np.iinfo(np.int64).max)
    best = np.flatnonzero(dist == dist.min())
    return int(best[np.argmin(code_points[best])])
