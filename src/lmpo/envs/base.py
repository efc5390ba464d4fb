"""The environment protocol for language-model episodes, the ``ENVS`` registry and episode budgets.

An environment speaks in chat messages (``{"role": ..., "content": ...}``), following Gymnasium where it fits::

    env = make_env("GuessNumber-v0")
    messages, info = env.reset(example, seed=0)        # the opening conversation (system / user messages)
    observation, reward, terminated, truncated, info = env.step("I guess 8")   # one assistant turn (text)

``observation`` is a list of ``user`` or ``tool`` messages that the policy sees before its next turn.
``terminated`` means the episode reached a terminal state of the task (solved, lost); ``truncated`` means it
was cut short for a reason outside the task (a limit of the environment). The episode driver
(``lmpo.generation.episodes``) adds its own budgets (:class:`EpisodeBudget`) and truncates on those too.

Every environment documents itself with an *environment card*: its class docstring has the Markdown sections
``## Description``, ``## Observations``, ``## Actions``, ``## Rewards``, ``## Episode End`` and ``## Version``
(the last one lists ``vN: what changed`` for the id's version), as Gymnasium's environments do;
``lmpo.envs.check_env`` checks the card along with the behaviour.
"""

from __future__ import annotations

import difflib
import importlib.util
import re
import threading
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, NamedTuple

import numpy as np

from lmpo.config import check_fields, option
from lmpo.errors import InputError, RunError
from lmpo.tasks.base import Example, Task

Message = dict[str, Any]

#: roles an environment may open an episode with, and roles of the observations it returns after a turn
OPENING_ROLES = ("system", "user")
OBSERVATION_ROLES = ("user", "tool")
#: the sections of an environment card (Markdown ``## `` headings in the class docstring), in order
CARD_SECTIONS = ("Description", "Observations", "Actions", "Rewards", "Episode End", "Version")
#: ``Name-vN``: a name and a version, bumped whenever the environment's behaviour changes
ENV_ID_PATTERN = re.compile(r"^[A-Za-z][A-Za-z0-9_]*(?:[/.][A-Za-z0-9_]+)*-v(\d+)$")


class EnvError(RunError):
    """An environment failed during an episode (raised, returned a malformed result, outlived its time limit);
    the message names the environment, the episode and the turn."""


class StepResult(NamedTuple):
    """What :meth:`LMEnv.step` returns; unpacks as Gymnasium's five-tuple."""

    observation: list[Message]
    reward: float
    terminated: bool
    truncated: bool
    info: dict[str, Any]


class LMEnv:
    """Base class of language-model environments (see the module docstring for the protocol).

    Subclasses implement :meth:`reset` (calling ``super().reset(example, seed)`` first, which seeds
    ``self.np_random``) and :meth:`step`. An environment must accept *any* text as an action — a policy writes
    garbage early in training — and answer it with an observation (say what was expected), never an exception.
    ``tools`` are the tools whose JSON schemas the driver passes to the chat template (``tools=``); an
    environment that runs tool calls is a :class:`lmpo.envs.ToolEnv`.
    """

    #: set by :func:`register_env` (``Name-vN``)
    env_id: str = ""
    tools: tuple = ()

    def __init__(self) -> None:
        self.np_random = np.random.default_rng()

    def reset(self, example: Example | None = None, seed: int | None = None) -> tuple[list[Message], dict[str, Any]]:
        """Start an episode on ``example`` (``None``: the environment draws one from ``self.np_random``).

        Returns the opening messages and an info dict. The base implementation only seeds ``self.np_random``
        (when ``seed`` is given) and returns nothing: subclasses call it first and return their own pair.
        """
        if seed is not None:
            self.np_random = np.random.default_rng(seed)
        return [], {}

    def step(self, action: str) -> StepResult:
        """Take one assistant turn (its text, special tokens removed) and return a :class:`StepResult`."""
        raise NotImplementedError

    def close(self) -> None:
        """Release what the environment holds (processes, files); called by the driver after each episode."""

    def expert_action(self) -> str:
        """The turn a scripted expert would take now (demonstrations for a supervised warm-up, tests).

        Optional: environments without an expert raise NotImplementedError (the default).
        """
        raise NotImplementedError(f"{type(self).__name__} ({self.env_id or 'unregistered'}) has no expert policy")

    @property
    def tool_schemas(self) -> list[dict[str, Any]] | None:
        """The JSON schemas of ``tools`` in the chat template's ``tools=`` format, or None without tools."""
        return [t.schema for t in self.tools] or None


# ----------------------------------------------------------------------------------------------------
# registry
# ----------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class EnvSpec:
    """A registered environment: its id, the factory that builds it and the task that supplies its examples."""

    env_id: str
    factory: Callable[..., LMEnv]
    task: Callable[..., Task] | None = None
    requires: str | None = None  # the module an optional extra provides (``textarena``)

    @property
    def available(self) -> bool:
        """Whether the module the environment requires is installed."""
        return self.requires is None or importlib.util.find_spec(self.requires) is not None

    @property
    def version(self) -> int:
        return int(ENV_ID_PATTERN.match(self.env_id).group(1))


ENVS: dict[str, EnvSpec] = {}


def register_env(env_id: str, task: Callable[..., Task] | None = None, requires: str | None = None) -> Callable:
    """Decorator adding an environment class (or a factory taking keyword options) to ``ENVS``.

    ``task`` builds the :class:`lmpo.tasks.Task` whose examples the environment is reset on (held-out split
    included), so that a trainer can draw prompts for it like for any task. ``requires`` names the module of
    an optional extra the environment needs (``make_env`` says how to install it when it is missing).
    """
    match = ENV_ID_PATTERN.match(env_id)
    if match is None:
        raise ValueError(f"environment id {env_id!r} is not of the form Name-vN (a name, '-v' and a version number)")

    def decorator(factory):
        if env_id in ENVS:
            raise ValueError(f"environment {env_id!r} is already registered")
        ENVS[env_id] = EnvSpec(env_id, factory, task, requires)
        if isinstance(factory, type):
            factory.env_id = env_id
        return factory

    return decorator


def is_registered(env_id: str) -> bool:
    """Whether ``env_id`` is registered, after loading the ``lmpo.envs`` entry points if it is not yet."""
    if env_id not in ENVS:
        from lmpo.envs.plugins import load_env_plugins

        load_env_plugins()
    return env_id in ENVS


def unknown_env_message(env_id: str, what: str = "unknown environment") -> str:
    """Why ``env_id`` is not found: the closest registered id, every registered id and how to bring one."""
    from lmpo.envs.plugins import HOW_TO_REGISTER, plugin_failures

    close = difflib.get_close_matches(env_id, list(ENVS), n=1)
    hint = f" Did you mean {close[0]!r}?" if close else ""
    return (f"{what} {env_id!r}.{hint} Registered environments: {', '.join(sorted(ENVS))}. {HOW_TO_REGISTER}"
            f"{plugin_failures()}")


def _spec(env_id: str) -> EnvSpec:
    if not is_registered(env_id):
        raise InputError(unknown_env_message(env_id))
    return ENVS[env_id]


def make_env(env_id: str, **options: Any) -> LMEnv:
    """Build a registered environment: ``make_env("ToolArithmetic-v0", max_turns=4)``."""
    spec = _spec(env_id)
    if not spec.available:
        raise InputError(f"environment {env_id!r} needs the {spec.requires} package, which is not installed: "
                         f"pip install 'lmpo[{spec.requires}]'.")
    try:
        env = spec.factory(**options)
    except TypeError as e:
        raise InputError(f"bad options {options} for environment {env_id!r}: {e}") from e
    env.env_id = env_id
    return env


def make_env_task(env_id: str, **options: Any) -> Task:
    """The task whose examples ``env_id`` is reset on (train pool and held-out split)."""
    spec = _spec(env_id)
    if spec.task is None:
        raise InputError(f"environment {env_id!r} registers no task; give it examples of your own (lmpo.tasks) or "
                         "reset it with example=None to let it draw its own.")
    return spec.task(**options)


# ----------------------------------------------------------------------------------------------------
# environment cards
# ----------------------------------------------------------------------------------------------------


def env_card(env: LMEnv | type | Callable[..., LMEnv]) -> dict[str, str]:
    """The sections of an environment's card, ``{heading: text}``, parsed from its class docstring (the nearest
    class in the hierarchy that has one: a subclass without a docstring keeps its parent's card)."""
    if isinstance(env, LMEnv) or isinstance(env, type):
        cls = env if isinstance(env, type) else type(env)
        doc = next((c.__dict__["__doc__"] for c in cls.__mro__ if c.__dict__.get("__doc__")), "")
    else:  # a registered factory function carries the card of what it builds
        doc = getattr(env, "__doc__", None) or ""
    sections: dict[str, str] = {}
    current, lines = None, []
    for line in doc.splitlines():
        heading = re.match(r"^\s*##\s+(.+?)\s*$", line)
        if heading:
            if current is not None:
                sections[current] = "\n".join(lines).strip()
            current, lines = heading.group(1), []
        elif current is not None:
            lines.append(line.strip())
    if current is not None:
        sections[current] = "\n".join(lines).strip()
    return sections


# ----------------------------------------------------------------------------------------------------
# budgets
# ----------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class EpisodeBudget:
    """Limits the episode driver enforces on every episode, whatever the environment does.

    An episode that reaches one is *truncated* (``Episode.end_reason`` names the budget); the tokens the policy
    sampled before the limit keep their log-probs, and whether they are trained on is the driver's
    ``mask_truncated`` choice.
    """

    max_turns: int = option(8, "Assistant turns per episode.", ge=1)
    max_total_tokens: int = option(2048, "Tokens per episode: the opening prompt, every assistant turn and every "
                                   "observation together (the length of the sequence the model is trained on).",
                                   ge=2)
    max_new_tokens_per_turn: int = option(256, "Tokens the policy may sample in one turn; a turn that reaches it "
                                          "without a stop token ends the episode (truncated).", ge=1)

    def __post_init__(self) -> None:
        check_fields(self, "budget")


def check_messages(messages: Any, roles: Sequence[str], what: str) -> list[Message]:
    """``messages`` as a list of role/content dicts whose roles are in ``roles``; ValueError saying what is wrong."""
    if not isinstance(messages, (list, tuple)):
        raise ValueError(f"{what} must be a list of messages, got {type(messages).__name__}")
    out = []
    for i, m in enumerate(messages):
        if not isinstance(m, Mapping):
            raise ValueError(f"{what}[{i}] must be a dict with 'role' and 'content', got {type(m).__name__}")
        if m.get("role") not in roles:
            raise ValueError(f"{what}[{i}] has role {m.get('role')!r}; allowed roles: {', '.join(roles)}")
        if not isinstance(m.get("content"), str):
            raise ValueError(f"{what}[{i}] content must be a string, got {type(m.get('content')).__name__}")
        out.append(dict(m))
    return out


def strip_thinking(text: str) -> str:
    """The part of an assistant turn after its reasoning (after the last ``</think>``, if any), stripped."""
    return text.rsplit("</think>", 1)[-1].strip()


def call_with_timeout(function: Callable[[], Any], timeout_s: float | None, name: str = "lmpo-call") -> Any:
    """``function()``, re-raising what it raises, or TimeoutError after ``timeout_s`` seconds (None: no limit).

    The call runs on a daemon thread; past the limit it is abandoned, not stopped (Python cannot kill a thread),
    so it keeps its thread until it returns or the process ends.
    """
    if timeout_s is None:
        return function()
    outcome: dict[str, Any] = {}

    def target() -> None:
        try:
            outcome["value"] = function()
        except BaseException as e:  # noqa: BLE001 - re-raised in the caller's thread
            outcome["error"] = e

    thread = threading.Thread(target=target, name=name, daemon=True)
    thread.start()
    thread.join(timeout_s)
    if thread.is_alive():
        raise TimeoutError(f"no answer within {timeout_s:g} s")
    if "error" in outcome:
        raise outcome["error"]
    return outcome["value"]
