"""Task and example types, the ``TASKS`` registry of built-in tasks and ``TASK_FAMILIES`` (``<family>/<name>``)."""

from __future__ import annotations

import importlib
import importlib.util
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any


@dataclass(frozen=True)
class Example:
    """One prompt with its verifiable reference answer.

    ``prompt`` is fed to the model as plain text; the model should complete it with ``answer`` then EOS.
    ``meta`` holds extra columns (passed to reward functions as keyword arguments, TRL-style).
    ``messages`` is the prompt as a conversation (TRL's conversational format, ``[{"role", "content"}, …]``)
    when it is one; ``prompt`` is then its rendering by the policy's chat template, empty until
    ``lmpo.tasks.render_prompts`` has rendered it (the trainer and ``lmpo eval`` do).
    """

    prompt: str
    answer: str
    meta: dict[str, Any] = field(default_factory=dict)
    messages: list[dict[str, Any]] | None = None


class Task:
    """A source of training prompts and a disjoint held-out evaluation split.

    Subclasses implement ``train_examples`` and ``eval_examples``. ``default_rewards`` lists
    ``(reward name, weight)`` pairs used when a run does not configure rewards; ``accuracy_reward`` names
    the reward whose value ``>= 1`` counts a completion as correct (held-out accuracy).
    """

    name: str = "task"
    default_rewards: tuple[tuple[str, float], ...] = (("exact_match", 1.0),)
    accuracy_reward: str = "exact_match"

    def train_examples(self, seed: int = 0) -> list[Example]:
        """The training pool. Generated tasks draw it from ``seed``; file tasks ignore ``seed``."""
        raise NotImplementedError

    def eval_examples(self) -> list[Example]:
        """The held-out split: fixed, and never overlapping any ``train_examples(seed)`` prompt."""
        raise NotImplementedError

    def reference_completion(self, example: Example) -> str:
        """The text a supervised warm-up should teach for ``example`` (EOS is appended by the caller)."""
        return example.answer

    def describe(self) -> str:
        return self.name


TaskFactory = Callable[..., Task]
TASKS: dict[str, TaskFactory] = {}


def register_task(name: str) -> Callable[[TaskFactory], TaskFactory]:
    """Decorator adding a task class (or factory taking keyword options) to ``TASKS`` under ``name``."""

    def decorator(factory: TaskFactory) -> TaskFactory:
        if name in TASKS:
            raise ValueError(f"task {name!r} is already registered")
        TASKS[name] = factory
        return factory

    return decorator


@dataclass(frozen=True)
class TaskFamily:
    """Tasks named ``<prefix>/<name>``, built by ``factory(name, **options)``: a suite of generators (one per
    name) behind one adapter. ``factory`` is an import path (``"package.module:attribute"``) resolved on first
    use, so that a family whose package is an optional extra costs nothing until a run names one of its tasks;
    ``requires`` is that package's module."""

    prefix: str
    factory: str
    requires: str | None = None

    @property
    def available(self) -> bool:
        return self.requires is None or importlib.util.find_spec(self.requires) is not None

    def build(self, name: str, **options: Any) -> Task:
        if not self.available:
            raise ValueError(f"task {self.prefix}/{name} needs the {self.requires} package, which is not installed: "
                             f"pip install 'lmpo[{self.requires}]'")
        module, _, attribute = self.factory.partition(":")
        return getattr(importlib.import_module(module), attribute)(name, **options)


TASK_FAMILIES: dict[str, TaskFamily] = {}


def register_task_family(prefix: str, factory: str, requires: str | None = None) -> None:
    """Add the family of tasks ``<prefix>/<name>`` (see :class:`TaskFamily`)."""
    if prefix in TASK_FAMILIES or "/" in prefix:
        raise ValueError(f"task family {prefix!r} is already registered or contains '/'")
    TASK_FAMILIES[prefix] = TaskFamily(prefix, factory, requires)


def task_family(name: str) -> TaskFamily | None:
    """The family of a task name ``<prefix>/<name>``, or None."""
    prefix, slash, rest = name.partition("/")
    return TASK_FAMILIES.get(prefix) if slash and rest else None


def make_task(name: str, **options: Any) -> Task:
    """Build a registered task: ``make_task("addition", max_digits=3)``, ``make_task("reasoning_gym/chain_sum")``."""
    family = task_family(name) if name not in TASKS else None
    if family is not None:
        try:
            return family.build(name.partition("/")[2], **options)
        except TypeError as e:
            raise TypeError(f"bad options {options} for task {name!r}: {e}") from e
    if name not in TASKS:
        raise ValueError(
            f"unknown task {name!r}; built-in tasks: {sorted(TASKS)}, task families: "
            f"{[f + '/<name>' for f in sorted(TASK_FAMILIES)]}. For your own data use a "
            "JSON/JSONL/Parquet file (load_file_task) or a Hugging Face dataset name (load_hf_task)."
        )
    try:
        return TASKS[name](**options)
    except TypeError as e:
        raise TypeError(f"bad options {options} for task {name!r}: {e}") from e


class ListTask(Task):
    """A task over fixed example lists (files, datasets): ``train`` and ``eval`` given up front."""

    def __init__(
        self,
        name: str,
        train: list[Example],
        eval: list[Example],
        default_rewards: tuple[tuple[str, float], ...] = (("exact_match", 1.0),),
        accuracy_reward: str = "exact_match",
    ) -> None:
        self.name = name
        self._train = list(train)
        self._eval = list(eval)
        self.default_rewards = tuple(default_rewards)
        self.accuracy_reward = accuracy_reward

    def train_examples(self, seed: int = 0) -> list[Example]:
        return list(self._train)

    def eval_examples(self) -> list[Example]:
        return list(self._eval)

    def describe(self) -> str:
        return f"{self.name} ({len(self._train)} train / {len(self._eval)} eval examples)"
