"""Environments for multi-turn language-model episodes.

- the protocol (``LMEnv``: ``reset(example, seed)`` → opening messages, ``step(text)`` → observation messages,
  reward, terminated, truncated, info), the ``ENVS`` registry (``register_env``, ``make_env``,
  ``make_env_task``), episode budgets (``EpisodeBudget``) and environment cards (``env_card``);
- ``check_env``, the protocol checker run over every registered environment in the tests;
- ``ToolEnv``, the base of environments whose turns call tools (``lmpo.envs.tools``);
- the built-in environments: ``ToolArithmetic-v0`` (a calculator task) and ``GuessNumber-v0`` (higher/lower);
- adapters of third-party suites (``lmpo.envs.adapters``, each an optional extra): TextArena's single-player games
  as ``textarena/<Game>-vN``, reasoning-gym's problems with retries as ``reasoning_gym/Feedback-v0``, an OpenEnv
  server as ``openenv/Remote-v0``, a verifiers environment as ``verifiers/Environment-v0``.

The episode driver that turns an environment and a policy into token-exact training sequences is
``lmpo.generation.episodes``.

>>> env = make_env("GuessNumber-v0")
>>> messages, info = env.reset(seed=0)
>>> observation, reward, terminated, truncated, info = env.step("8")
"""

from lmpo.envs import arithmetic, guess  # noqa: F401  (registers the built-in environments)
from lmpo.envs.adapters import openenv, reasoning_gym, textarena, verifiers  # noqa: F401  (register; lazy imports)
from lmpo.envs.arithmetic import ToolArithmeticEnv, ToolArithmeticTask
from lmpo.envs.base import (
    CARD_SECTIONS,
    ENVS,
    EnvError,
    EnvSpec,
    EpisodeBudget,
    LMEnv,
    Message,
    StepResult,
    call_with_timeout,
    check_messages,
    env_card,
    make_env,
    make_env_task,
    register_env,
    strip_thinking,
)
from lmpo.envs.checker import EnvCheckError, check_card, check_env
from lmpo.envs.guess import GuessNumberEnv, GuessNumberTask
from lmpo.envs.tool_env import ToolEnv

__all__ = [
    "CARD_SECTIONS",
    "ENVS",
    "EnvCheckError",
    "EnvError",
    "EnvSpec",
    "EpisodeBudget",
    "GuessNumberEnv",
    "GuessNumberTask",
    "LMEnv",
    "Message",
    "StepResult",
    "ToolArithmeticEnv",
    "ToolArithmeticTask",
    "ToolEnv",
    "call_with_timeout",
    "check_card",
    "check_env",
    "check_messages",
    "env_card",
    "make_env",
    "make_env_task",
    "register_env",
    "strip_thinking",
]
