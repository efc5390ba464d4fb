"""Adapters that run third-party environment suites unchanged behind the ``lmpo.envs`` protocol, one file per
suite, each an optional extra: ``textarena`` (TextArena's single-player games, ``textarena/<Game>-vN``),
``reasoning_gym`` (reasoning-gym's generators: tasks ``reasoning_gym/<dataset>`` and the retry environment
``reasoning_gym/Feedback-v0``), ``openenv`` (an OpenEnv server, ``openenv/Remote-v0``) and ``verifiers``
(a verifiers ``MultiTurnEnv`` / ``ToolEnv`` with its rubric, ``verifiers/Environment-v0``).

:class:`SeedTask` is the task of suites whose instances are drawn from a seed (games, servers)."""

from __future__ import annotations

import importlib
import random
import warnings
from types import ModuleType

from lmpo.errors import InputError
from lmpo.tasks.base import Example, Task


def import_extra(module: str, extra: str, what: str) -> ModuleType:
    """``module`` imported, or InputError saying that ``what`` needs the optional extra ``lmpo[extra]``."""
    try:
        with warnings.catch_warnings():  # compile-time SyntaxWarnings of the suite's own dependencies are not the user's
            warnings.simplefilter("ignore", SyntaxWarning)
            return importlib.import_module(module)
    except ImportError as e:
        raise InputError(f"{what} need an optional extra: pip install 'lmpo[{extra}]' (importing {module} "
                         f"failed: {e}).") from e


class SeedTask(Task):
    """Instances as examples: an example is a seed (``meta["seed"]``). The held-out split is seeds
    ``0 … num_eval−1``; training seeds are drawn from ``[10**6, 2**31)``, so the two never overlap."""

    def __init__(self, name: str, num_train: int = 10_000, num_eval: int = 100) -> None:
        if num_train < 1 or not 1 <= num_eval <= 10**6:
            raise ValueError(f"num_train={num_train} must be >= 1 and num_eval={num_eval} in 1..10**6")
        self.name, self.num_train, self.num_eval = name, num_train, num_eval

    def example(self, seed: int) -> Example:
        return Example(prompt=f"{self.name} #{seed}", answer="", meta={"seed": seed})

    def train_examples(self, seed: int = 0) -> list[Example]:
        rng = random.Random(f"{self.name}-train-{seed}")
        return [self.example(rng.randrange(10**6, 2**31)) for _ in range(self.num_train)]

    def eval_examples(self) -> list[Example]:
        return [self.example(s) for s in range(self.num_eval)]
