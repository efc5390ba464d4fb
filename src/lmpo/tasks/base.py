"""Task and example types, and the ``TASKS`` registry of built-in tasks."""

from __future__ import annotations

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


def make_task(name: str, **options: Any) -> Task:
    """Build a registered task: ``make_task("addition", max_digits=3)``."""
    if name not in TASKS:
        raise ValueError(
            f"unknown task {name!r}; built-in tasks: {sorted(TASKS)}. For your own data use a "
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
