"""The trainer's side of ``rollout.async_staleness`` = k >= 1: prompts drawn k steps ahead, in step order, and
handed to the rollout worker (``lmpo.generation.worker.AsyncRollout``), which samples their completions or, on an
environment (``env.id``), plays their episodes; what a checkpoint keeps to go on.

Weights W_j are the policy after j RL steps (W_0: after the warm-up). RL step t (1-based) trains on completions
sampled with ``W_max(0, t − 1 − k)``; the synchronous loop is k = 0 (``W_t−1``). The worker numbers its own
steps and versions from where this run started (step ``start``, a checkpoint's or 0)::

    worker version v   = W_max(0, start − k + v)     (versions 0 … k pushed at start: the held ones, then W_start)
    worker step s      = t − 1 − start + k           (so that its version max(0, s − k) is the one above)

Prompts are drawn from the one ``PromptOrder`` in step order, k steps before their step trains, and kept by step;
the data position a checkpoint after step c records is the one before step c + 1's draw, so a resumed run draws
the same prompts for steps c + 1 … c + k again. The checkpoint also keeps W_c−k … W_c−1 (the worker's shared
memory holds them: ``AsyncRollout.held_weights``); the resumed run pushes them again before W_c, and its worker
generates exactly what the uninterrupted run's did.
"""

from __future__ import annotations

from lmpo.generation import Rollout
from lmpo.generation.worker import AsyncRollout
from lmpo.trainer.step.sampling import PromptOrder, seed_for


class AsyncPipeline:
    """Steps ``start + 1 … last_step`` of a run through ``engine`` (built by ``build.build_async_rollout``)."""

    def __init__(self, engine: AsyncRollout, prompts: PromptOrder, *, start: int, last_step: int,
                 prompts_per_step: int, completions_per_prompt: int, seed: int) -> None:
        self.engine, self.prompts = engine, prompts
        self.play = engine.episodes is not None  # multi-turn: the worker plays episodes of the examples
        self.k = engine.staleness
        self.base = start - self.k  # worker step s = t − 1 − base
        self.last_step = last_step
        self.prompts_per_step, self.completions_per_prompt, self.seed = prompts_per_step, completions_per_prompt, seed
        self._examples: dict[int, list] = {}  # RL step → its examples, drawn k steps early
        self._data_before: dict[int, dict] = {}  # RL step → the data position before its draw

    def _request(self, s: int) -> tuple[list[str], int, int]:
        step = s + 1 + self.base
        self._data_before[step] = self.prompts.state_dict()
        examples = self.prompts.take(self.prompts_per_step)
        self._examples[step] = examples
        # the seeds the synchronous loop's draw (or episodes: lmpo.trainer.collect.play) of this step uses
        seed = seed_for(self.seed, step, 1)
        if self.play:
            return examples, self.completions_per_prompt, seed % 2**31, seed
        return [e.prompt for e in examples], self.completions_per_prompt, seed

    def rollout(self, step: int) -> tuple[list, Rollout]:
        """RL step ``step``'s examples and rollout (sampled with ``W_max(0, step − 1 − k)``); submits the steps up
        to ``step + k`` not submitted yet. Call it after the previous step's ``engine.push_weights``."""
        return self._take(step, self.engine.rollout_for)

    def episodes(self, step: int) -> tuple[list, list]:
        """``rollout`` of a multi-turn run: RL step ``step``'s examples and their episodes (example-major)."""
        return self._take(step, self.engine.episodes_for)

    def _take(self, step: int, fetch) -> tuple[list, object]:
        got = fetch(step - 1 - self.base, self._request, last_step=self.last_step - 1 - self.base)
        self._data_before.pop(step, None)
        return self._examples.pop(step), got

    def data_state(self, step: int) -> dict:
        """The data position a checkpoint after RL step ``step`` records: before step ``step + 1``'s draw."""
        return self._data_before.get(step + 1, self.prompts.state_dict())

    def state_dict(self) -> dict:
        """What a checkpoint after the current step keeps: k and W_c−k … W_c−1 (oldest first)."""
        newest = self.engine.version
        return {"staleness": self.k,
                "weights": [self.engine.held_weights(v) for v in range(newest - self.k, newest)]}
