"""Environments and a model factory for the tests of episodes played in the rollout worker
(``lmpo.generation.worker.AsyncRollout`` with ``episodes=``, ``rollout.async_staleness`` on ``env.id`` runs).

A user's environment module, as ``env.import`` names it (the tests pass this file's path): importing it registers

* ``TickingGuess-v0``: ``GuessNumber-v0`` whose ``reset`` and ``step`` count themselves (``tick``), in a process
  other than ``main_pid`` only (the worker's), and SIGKILL their process at the points numbered in ``kill_at``.
* ``SandboxOpening-v0``: its opening message is what the Python sandbox printed running the example's prompt
  (``lmpo.envs.tools.sandbox.run_python``), after writing ``<ticks>/sandbox`` when it starts: the jail runs in
  whichever process plays the episode.

``ticking_model(ticks, kill_at)`` is a model factory whose model counts its forward calls (``tick``: inside
generation) and SIGKILLs its process at the points in ``kill_at``.

Kill points are numbered in the order of the uninterrupted run: each call has a key naming where it is in the run
(an environment call: its episode's seed and the actions so far; a forward: its inputs), and point n is the n-th
distinct key. A restarted worker replays its unfinished requests, whose keys are already seen, so it dies at the
next new point: the kills spread over the run as drawn, and each is reached once.
"""

from __future__ import annotations

import hashlib
import os
import signal

from lmpo.envs.base import LMEnv, StepResult, register_env
from lmpo.envs.guess import GuessNumberEnv, GuessNumberTask
from lmpo.tasks.base import Example, Task

#: the model of these tests: the 1-layer tiny preset with the offline ChatML tokenizer
MODEL = {"hidden_size": 32, "num_layers": 1, "num_heads": 2, "intermediate_size": 64}


_seen: dict[str, set[str]] = {}  # this process's view of each keys file (one worker process writes at a time)


def _append(path: str, data: bytes) -> None:
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        os.write(fd, data)
    finally:
        os.close(fd)


def tick(ticks: str | None, what: str, key: str = "", kill_at=()) -> None:
    """Count one call of ``what`` (one byte in ``ticks/what``) and its key once (a line of ``ticks/what.keys``);
    SIGKILL this process when a new key's number is in ``kill_at``."""
    if ticks is None:
        return
    _append(os.path.join(ticks, what), b".")
    path = os.path.join(ticks, what + ".keys")
    if path not in _seen:
        _seen[path] = set(open(path).read().split()) if os.path.exists(path) else set()
    key = hashlib.sha1(key.encode()).hexdigest()
    if key in _seen[path]:
        return
    _seen[path].add(key)
    _append(path, key.encode() + b"\n")
    if len(_seen[path]) in kill_at:
        os.kill(os.getpid(), signal.SIGKILL)


def count(ticks, what: str) -> int:
    """Calls of ``what`` counted in ``ticks``."""
    path = os.path.join(ticks, what)
    return os.path.getsize(path) if os.path.exists(path) else 0


def points(ticks, what: str) -> int:
    """Distinct kill points of ``what`` seen in ``ticks``."""
    path = os.path.join(ticks, what + ".keys")
    return len(open(path).read().split()) if os.path.exists(path) else 0


@register_env("TickingGuess-v0", task=GuessNumberTask)
class TickingGuess(GuessNumberEnv):
    def __init__(self, ticks: str | None = None, kill_at=(), main_pid: int = 0, **options) -> None:
        super().__init__(**options)
        worker = ticks is not None and os.getpid() != main_pid
        self.ticks, self.kill_at = (ticks if worker else None), set(kill_at)

    def reset(self, example=None, seed=None):
        self._where = [seed]
        tick(self.ticks, "env", repr(self._where), self.kill_at)
        return super().reset(example, seed=seed)

    def step(self, action):
        self._where.append(action)
        tick(self.ticks, "env", repr(self._where), self.kill_at)
        return super().step(action)


class _CodeTask(Task):
    name = "sandbox_code"

    def train_examples(self, seed: int = 0):
        return [Example(prompt="print(6 * 7)", answer="42")]

    def eval_examples(self):
        return self.train_examples()


@register_env("SandboxOpening-v0", task=_CodeTask)
class SandboxOpening(LMEnv):
    def __init__(self, ticks: str | None = None, timeout_s: float = 60.0) -> None:
        super().__init__()
        self.ticks, self.timeout_s = ticks, timeout_s

    def reset(self, example=None, seed=None):
        from lmpo.envs.tools.sandbox import run_python

        tick(self.ticks, "sandbox")
        out = run_python(example.prompt, timeout_s=self.timeout_s, cpu_time_s=int(self.timeout_s) + 1).as_text()
        return [{"role": "user", "content": f"The program printed: {out}"}], {}

    def step(self, action):
        return StepResult([], 0.0, True, False, {})


def chat_model(seed: int = 0, template: bool = True):
    from lmpo.models import CHATML_TEMPLATE, build_chat_tokenizer, build_tiny_model

    tok = build_chat_tokenizer(CHATML_TEMPLATE if template else None)
    return build_tiny_model(tok, seed=seed, **MODEL), tok


def ticking_model(ticks: str | None = None, kill_at=(), seed: int = 1, template: bool = True):
    """``chat_model(seed, template)`` (other initial weights than the training model's: the pushed ones must win)
    counting its forward calls in ``ticks/forward``."""
    model, tok = chat_model(seed, template)
    if ticks is not None:
        kill = set(kill_at)

        def hook(module, args, kwargs):
            ids, mask = kwargs["input_ids"], kwargs.get("attention_mask")
            where = (ids.tolist(), None if mask is None else mask.tolist())
            tick(ticks, "forward", repr(where), kill)

        model.register_forward_pre_hook(hook, with_kwargs=True)
    return model, tok
