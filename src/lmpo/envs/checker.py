"""``check_env``: does an environment keep the protocol of ``lmpo.envs.base``? (Gymnasium's ``check_env`` for
language-model environments.)"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence

from lmpo.envs.base import (
    CARD_SECTIONS,
    ENV_ID_PATTERN,
    OBSERVATION_ROLES,
    OPENING_ROLES,
    LMEnv,
    StepResult,
    check_messages,
    env_card,
)
from lmpo.envs.tools.base import Tool
from lmpo.envs.tools.parser import format_tool_call
from lmpo.tasks.base import Example

#: actions every environment must answer without raising: empty, prose, digits, reasoning, half a tool call,
#: malformed and unknown tool calls, a very long turn
PROBE_ACTIONS = (
    "",
    "hello",
    "42",
    "<think>let me think</think>7",
    "<tool_call>{\"name\": ",
    "<tool_call>not json</tool_call>",
    format_tool_call("no_such_tool", {}),
    "x" * 5000,
)


class EnvCheckError(AssertionError):
    """An environment breaks the protocol; the message names the environment and the rule."""


def _fail(env: LMEnv, rule: str) -> EnvCheckError:
    return EnvCheckError(f"{type(env).__name__} ({env.env_id or 'unregistered'}): {rule}")


def check_card(env: LMEnv) -> dict[str, str]:
    """The environment card is complete and its Version section documents the id's version."""
    card = env_card(env)
    missing = [s for s in CARD_SECTIONS if not card.get(s)]
    if missing:
        raise _fail(env, f"the class docstring lacks the card section(s) {missing} (Markdown '## <section>' headings "
                         f"with text under each: {', '.join(CARD_SECTIONS)})")
    match = ENV_ID_PATTERN.match(env.env_id or "")
    if match is None:
        raise _fail(env, "env_id is not of the form Name-vN (register the class with @register_env)")
    if f"v{match.group(1)}:" not in card["Version"]:
        raise _fail(env, f"the card's Version section has no 'v{match.group(1)}: …' entry for {env.env_id}")
    return card


def _check_step(env: LMEnv, result: object, action: str) -> StepResult:
    where = f"step({action[:30]!r})"
    if not isinstance(result, tuple) or len(result) != 5:
        raise _fail(env, f"{where} must return (observation, reward, terminated, truncated, info), got {result!r:.200}")
    observation, reward, terminated, truncated, info = result
    try:
        observation = check_messages(observation, OBSERVATION_ROLES, f"{where} observation")
    except ValueError as e:
        raise _fail(env, str(e)) from None
    if isinstance(reward, bool) or not isinstance(reward, (int, float)) or not math.isfinite(reward):
        raise _fail(env, f"{where} reward must be a finite number, got {reward!r}")
    for name, flag in (("terminated", terminated), ("truncated", truncated)):
        if not isinstance(flag, bool):
            raise _fail(env, f"{where} {name} must be a bool, got {type(flag).__name__}")
    if not isinstance(info, dict):
        raise _fail(env, f"{where} info must be a dict, got {type(info).__name__}")
    if not (terminated or truncated) and not observation:
        raise _fail(env, f"{where} returned no observation for an episode that goes on: the policy would be asked "
                         "to speak twice in a row")
    return StepResult(observation, float(reward), terminated, truncated, info)


def _play_to_end(env: LMEnv, example: Example | None, seed: int, max_steps: int, action: Callable[[int], str]) -> bool:
    """Reset, then step with ``action(i)`` until the episode ends (True) or ``max_steps`` pass (False)."""
    env.reset(example, seed=seed)
    for i in range(max_steps):
        text = action(i)
        if not isinstance(text, str):
            raise _fail(env, f"an action must be text, got {type(text).__name__}")
        result = _check_step(env, env.step(text), text)
        if result.terminated or result.truncated:
            return True
    return False


def check_env(env: LMEnv, examples: Sequence[Example | None] = (None,), seed: int = 0,
              max_steps: int = 64) -> None:
    """Raise :class:`EnvCheckError` naming the rule an environment breaks; return None when it keeps them all.

    Checks: the environment card (:func:`check_card`); tool schemas; ``reset`` returns a non-empty opening of
    system/user messages and an info dict, the same for the same seed; every action in ``PROBE_ACTIONS`` gets a
    well-formed step result (observation messages of user/tool roles, a finite reward, bool flags, an info
    dict, an observation whenever the episode goes on) and never an exception; ``step`` after the episode has
    ended raises; an episode of repeated probe actions ends within ``max_steps`` steps or keeps answering; an
    environment with an ``expert_action`` gets an expert episode that ends within ``max_steps`` steps.
    """
    check_card(env)
    for tool in env.tools:
        if not isinstance(tool, Tool):
            raise _fail(env, f"tools must be lmpo.envs.tools.Tool objects, got {type(tool).__name__}")
        if tool.schema["function"]["name"] != tool.name:
            raise _fail(env, f"tool {tool.name!r}'s schema names another function")
    for example in examples:
        first = env.reset(example, seed=seed)
        again = env.reset(example, seed=seed)
        for result in (first, again):
            if not isinstance(result, tuple) or len(result) != 2 or not isinstance(result[1], dict):
                raise _fail(env, f"reset() must return (messages, info), got {result!r:.200}")
        try:
            opening = check_messages(first[0], OPENING_ROLES, "reset() messages")
        except ValueError as e:
            raise _fail(env, str(e)) from None
        if not opening:
            raise _fail(env, "reset() returned no opening messages")
        if first[0] != again[0]:
            raise _fail(env, f"reset(example, seed={seed}) is not deterministic: two calls gave different openings")
        for action in PROBE_ACTIONS:  # each probe on a fresh episode, so that every one is answered mid-episode
            env.reset(example, seed=seed)
            _check_step(env, env.step(action), action)
        if _play_to_end(env, example, seed, max_steps, lambda i: PROBE_ACTIONS[i % len(PROBE_ACTIONS)]):
            try:
                env.step("hello")
            except Exception:  # noqa: BLE001 - any exception is the expected refusal
                pass
            else:
                raise _fail(env, "step() after the episode ended must raise (call reset() first), but it returned")
        if type(env).expert_action is not LMEnv.expert_action:
            if not _play_to_end(env, example, seed, max_steps, lambda i: env.expert_action()):
                raise _fail(env, f"the expert's episode did not end within {max_steps} steps")
    env.close()
