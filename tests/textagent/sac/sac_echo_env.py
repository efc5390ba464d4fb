"""A tiny masked "echo" environment with the CharTextEnv interface, for agent tests.

Observation: a window whose last id is a target character t (ids 3..A−1); the legal mask always allows t
and <eos> and forbids a random other character.  Reward 1 for emitting t, else 0; the episode is
truncated after ``episode_steps``.  ``teacher_action()`` is t; ``set_teacher(True)`` forces it.
"""

from __future__ import annotations

import gymnasium as gym
import numpy as np


class EchoEnv(gym.Env):
    def __init__(self, num_actions: int = 10, window: int = 3, episode_steps: int = 8) -> None:
        self.A, self.M, self.T = num_actions, window, episode_steps
        self.observation_space = gym.spaces.Dict({
            "window": gym.spaces.Box(0, num_actions - 1, (window,), dtype=np.int64),
            "legal_mask": gym.spaces.MultiBinary(num_actions),
        })
        self.action_space = gym.spaces.Discrete(num_actions)
        self._teacher = False

    def _draw(self) -> None:
        self.target = int(self.np_random.integers(3, self.A))
        self.window = np.roll(self.window, -1)
        self.window[-1] = self.target
        self.legal = np.zeros(self.A, dtype=np.int8)
        self.legal[3:] = 1
        self.legal[1] = 1
        others = [a for a in range(3, self.A) if a != self.target]
        self.legal[int(self.np_random.choice(others))] = 0

    def _obs(self) -> dict:
        return {"window": self.window.copy(), "legal_mask": self.legal.copy()}

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self.t = 0
        self.window = np.zeros(self.M, dtype=np.int64)
        self._draw()
        return self._obs(), {}

    def action_masks(self) -> np.ndarray:
        return self.legal.astype(bool)

    def teacher_action(self) -> int:
        return self.target

    def set_teacher(self, on: bool) -> None:
        self._teacher = bool(on)

    def step(self, action):
        a = self.target if self._teacher else int(action)
        illegal = not bool(self.legal[a])
        reward = float(a == self.target)
        info = {"is_teacher": self._teacher, "teacher_action": self.target, "is_illegal": illegal,
                "reward/base": reward, "reward/potential": 0.0, "reward/soft": 0.0,
                "prev_char": str(self.window[-2]), "target_char": str(self.target), "action_char": str(a)}
        self.t += 1
        self._draw()
        return self._obs(), reward, False, self.t >= self.T, info

    def state_dict(self) -> dict:
        """What a SAC checkpoint stores of the env (plain data, as CharTextEnv.state_dict)."""
        return {"np_random": self.np_random.bit_generator.state, "t": self.t, "window": self.window.copy(),
                "target": self.target, "legal": self.legal.copy(), "teacher": self._teacher}

    def load_state_dict(self, state: dict) -> None:
        self.np_random.bit_generator.state = state["np_random"]
        self.t, self.target, self._teacher = int(state["t"]), int(state["target"]), bool(state["teacher"])
        self.window, self.legal = state["window"].copy(), state["legal"].copy()
