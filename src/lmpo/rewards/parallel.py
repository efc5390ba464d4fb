"""Reward functions in a thread or process pool, each call with a timeout; async reward functions.

:class:`ParallelRewardScorer` computes what :class:`~lmpo.rewards.RewardScorer` computes — the weighted sum of the
reward functions, undefined values as NaN — but cuts the batch into calls of ``seqs_per_call`` completions per
function and runs the calls ``workers`` at a time:

- ``pool="thread"``: each call in its own daemon thread (I/O-bound rewards: a verifier service, an LLM judge, a
  sandbox). A call still running after ``timeout_s`` is abandoned: its values become NaN, it is counted, and its
  thread no longer holds a worker slot nor the interpreter's exit (a daemon thread).
- ``pool="process"``: a ``multiprocessing`` pool (``spawn``) for CPU-bound pure-Python rewards held back by the GIL
  (math verification); a call past its timeout terminates the pool, which is started again for the next calls.
  Functions given as objects (``RewardSpec.fn``, reward models) run in the calling thread instead.
- ``async def`` reward functions are accepted in both: each call runs its coroutine to completion in its worker.

A call that times out is always a counted error (``stats["reward/timeouts"]``, and ``reward/skipped``, which the
trainer logs as ``reward/errors``); a call that raises follows ``on_error`` (the trainer's ``auto`` gives ``skip``
here) as in the serial scorer: ``skip``
counts it and records NaN, ``raise`` stops with an error naming the function and the sample. Either way the run is
never left waiting on a reward.
"""

from __future__ import annotations

import math
import multiprocessing
import queue
import threading
import time
from collections.abc import Callable, Sequence
from typing import Any

import torch

from lmpo.errors import RunError
from lmpo.rewards.scorer import (
    RewardScorer,
    RewardTypeError,
    _truncate,
    call_reward,
    nonfinite_error,
    reward_values,
)

POOLS = ("thread", "process")


class _Timeout(Exception):
    """A reward call that did not finish within its timeout."""


def _thread_target(out: queue.Queue, index: int, fn, kwargs) -> None:
    try:
        out.put((index, True, call_reward(fn, kwargs)))
    except BaseException as e:  # noqa: BLE001 - handed to the caller, who decides
        out.put((index, False, e))


def run_in_threads(calls: Sequence[tuple[Callable, dict]], workers: int, timeout_s: float
                   ) -> list[tuple[bool, Any]]:
    """Run ``(fn, kwargs)`` calls at most ``workers`` at a time, each in a daemon thread with ``timeout_s`` seconds
    (0 = no limit) from its start. Returns ``(ok, values or exception)`` per call; a late call gets ``_Timeout``."""
    results: list[tuple[bool, Any] | None] = [None] * len(calls)
    done: queue.Queue = queue.Queue()
    waiting = list(range(len(calls)))[::-1]
    running: dict[int, float] = {}  # call index → deadline
    while waiting or running:
        while waiting and len(running) < workers:
            i = waiting.pop()
            fn, kwargs = calls[i]
            threading.Thread(target=_thread_target, args=(done, i, fn, kwargs), daemon=True,
                             name=f"lmpo-reward-{i}").start()
            running[i] = time.monotonic() + timeout_s if timeout_s > 0 else math.inf
        wait = min(running.values()) - time.monotonic()
        try:
            i, ok, value = done.get(timeout=None if wait == math.inf else max(0.0, wait))
            if i in running:  # a call already given up on may still report: ignore it
                del running[i]
                results[i] = (ok, value)
        except queue.Empty:
            now = time.monotonic()
            for i in [i for i, deadline in running.items() if deadline <= now]:
                del running[i]
                results[i] = (False, _Timeout(f"no result after {timeout_s:g} s"))
    return results  # type: ignore[return-value]


def _ready(_: int) -> bool:
    return True


class ParallelRewardScorer(RewardScorer):
    """:class:`RewardScorer` whose calls run in a pool, each with a timeout (see the module docstring).

    Args:
        specs, on_error: as :class:`RewardScorer`.
        workers: calls running at the same time (threads or processes), >= 1.
        pool: ``"thread"`` or ``"process"``.
        timeout_s: seconds one call may take; 0 = no limit.
        seqs_per_call: completions per call of one function (0 = the whole batch in one call per function).
    """

    def __init__(self, specs: Sequence[Any], on_error: str = "raise", *, workers: int = 4, pool: str = "thread",
                 timeout_s: float = 0.0, seqs_per_call: int = 0) -> None:
        super().__init__(specs, on_error=on_error)
        if pool not in POOLS:
            raise ValueError(f"pool={pool!r} must be one of {POOLS}")
        if workers < 1 or timeout_s < 0 or seqs_per_call < 0 or not math.isfinite(timeout_s):
            raise ValueError(f"workers={workers} must be >= 1, timeout_s={timeout_s} >= 0 (0 = no limit) and "
                             f"seqs_per_call={seqs_per_call} >= 0 (0 = the whole batch)")
        self.workers, self.pool, self.timeout_s, self.seqs_per_call = workers, pool, timeout_s, seqs_per_call
        self._inline = {s.name for s in self.specs if s.fn is not None}  # objects stay in this process
        self._processes = None
        self.timed_out_calls = 0  # cumulative

    def close(self) -> None:
        """Stop the process pool (if one was started)."""
        if self._processes is not None:
            self._processes.terminate()
            self._processes.join()
            self._processes = None

    def __del__(self) -> None:
        try:
            self.close()
        except Exception:  # noqa: BLE001 - interpreter shutdown
            pass

    def _run(self, calls: list[tuple[str, Callable, dict]]) -> list[tuple[bool, Any]]:
        if self.pool == "thread":
            return run_in_threads([(fn, kw) for _, fn, kw in calls], self.workers, self.timeout_s)
        results: list[tuple[bool, Any] | None] = [None] * len(calls)
        remote = [i for i, (name, _, _) in enumerate(calls) if name not in self._inline]
        if remote:
            if self._processes is None:
                self._processes = multiprocessing.get_context("spawn").Pool(self.workers)
                # the workers' start-up (a fresh interpreter importing lmpo) is not any call's time
                self._processes.map(_ready, range(self.workers), chunksize=1)
            handles = {i: self._processes.apply_async(call_reward, (calls[i][1], calls[i][2])) for i in remote}
            started = time.monotonic()
            broken = False
            for n, (i, handle) in enumerate(handles.items()):
                # calls share the pool: allow each its timeout past the time the pool needs to reach it; once one
                # call hung, the others get what they have finished by then
                limit = None if self.timeout_s == 0 else max(0.0, started + self.timeout_s * (
                    1 + n // self.workers) - time.monotonic())
                if broken and not handle.ready():
                    results[i] = (False, _Timeout("its pool was stopped for a call that hung"))
                    continue
                try:
                    results[i] = (True, handle.get(timeout=0 if broken else limit))
                except multiprocessing.TimeoutError:
                    results[i] = (False, _Timeout(f"no result after {self.timeout_s:g} s"))
                    broken = True
                except Exception as e:  # noqa: BLE001 - the reward's own exception, re-raised in the parent
                    results[i] = (False, e)
            if broken:  # a hung worker cannot be interrupted: stop the pool, start a new one next time
                self.close()
        for i, (name, fn, kw) in enumerate(calls):
            if name in self._inline:
                try:
                    results[i] = (True, call_reward(fn, kw))
                except Exception as e:  # noqa: BLE001
                    results[i] = (False, e)
        return results  # type: ignore[return-value]

    def score(self, prompts: Sequence[str], completions: Sequence[str], answers: Sequence[str], **columns: Any
              ) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        """As :meth:`RewardScorer.score`; ``last_stats`` also holds ``reward/timeouts`` (calls past the timeout)."""
        prompts, completions, answers = list(prompts), list(completions), list(answers)
        if not (len(prompts) == len(completions) == len(answers)):
            raise ValueError(f"prompts ({len(prompts)}), completions ({len(completions)}) and answers "
                             f"({len(answers)}) must have the same length")
        batch = len(completions)
        size = self.seqs_per_call or max(1, batch)
        chunks = [(s, min(s + size, batch)) for s in range(0, batch, size)]
        calls, where = [], []
        for name, fn in self.fns.items():
            for s, e in chunks:
                cols = {k: v[s:e] if isinstance(v, list) and len(v) == batch else v for k, v in columns.items()}
                calls.append((name, fn, {"prompts": prompts[s:e], "completions": completions[s:e],
                                         "answer": answers[s:e], **cols}))
                where.append((name, s, e))
        outcomes = self._run(calls)
        values = {name: torch.full((batch,), math.nan) for name in self.fns}
        skipped = timeouts = nonfinite = 0
        self.nonfinite_note = None
        for (name, s, e), (ok, value) in zip(where, outcomes):
            if ok and len(value) != e - s:
                ok, value = False, ValueError(f"reward function {name!r} returned {len(value)} values for "
                                              f"{e - s} completions")
            if ok:
                try:
                    values[name][s:e], bad = reward_values(name, value)
                except RewardTypeError as err:
                    ok, value = False, err
            if ok:
                if bad and self.on_error == "raise":
                    raise nonfinite_error(name, value[bad[0]], s + bad[0], len(bad), e - s, prompts,
                                          completions, answers)
                if bad:
                    nonfinite += len(bad)
                    self.nonfinite_note = f"{name!r} returned {value[bad[0]]!r} for completion {s + bad[0]}"
                continue
            skipped += 1
            if isinstance(value, _Timeout):
                timeouts += 1
            elif self.on_error == "raise":
                raise RunError(f"reward function {name!r} raised {type(value).__name__}: {value} on completions "
                               f"{s}..{e - 1} (first: prompt {_truncate(prompts[s])}, completion "
                               f"{_truncate(completions[s])}). Fix the function, or set on_error='skip' to record "
                               "NaN for it and continue.") from value
        total = torch.zeros(batch, dtype=torch.float32)
        for name, tensor in values.items():
            total += self.weights[name] * torch.nan_to_num(tensor, nan=0.0)
        self.skipped_calls += skipped
        self.timed_out_calls += timeouts
        self.last_stats = {"reward/skipped": float(skipped), "reward/timeouts": float(timeouts),
                           "reward/nonfinite": float(nonfinite)}
        return total, values

    def __repr__(self) -> str:
        return (f"Parallel{super().__repr__()[:-1]}, workers={self.workers}, pool={self.pool!r}, "
                f"timeout_s={self.timeout_s:g})")


__all__ = ["POOLS", "ParallelRewardScorer", "call_reward", "run_in_threads"]
