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
    EpisodeBudget,
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


def check_failure(env: LMEnv, rule: str) -> EnvCheckError:
    return EnvCheckError(f"{type(env).__name__} ({env.env_id or 'unregistered'}): {rule}")


def check_card(env: LMEnv) -> dict[str, str]:
    """The environment card is complete and its Version section documents the id's version."""
    card = env_card(env)
    missing = [s for s in CARD_SECTIONS if not card.get(s)]
    if missing:
        raise check_failure(env, f"the class docstring lacks the card section(s) {missing} (Markdown '## <section>' headings "
                         f"with text under each: {', '.join(CARD_SECTIONS)})")
    match = ENV_ID_PATTERN.match(env.env_id or "")
    if match is None:
        raise check_failure(env, "env_id is not of the form Name-vN (register the class with @register_env)")
    if f"v{match.group(1)}:" not in card["Version"]:
        raise check_failure(env, f"the card's Version section has no 'v{match.group(1)}: …' entry for {env.env_id}")
    return card


def _check_step(env: LMEnv, result: object, action: str) -> StepResult:
    where = f"step({action[:30]!r})"
    if not isinstance(result, tuple) or len(result) != 5:
        raise check_failure(env, f"{where} must return (observation, reward, terminated, truncated, info), got {result!r:.200}")
    observation, reward, terminated, truncated, info = result
    try:
        observation = check_messages(observation, OBSERVATION_ROLES, f"{where} observation")
    except ValueError as e:
        raise check_failure(env, str(e)) from None
    if isinstance(reward, bool) or not isinstance(reward, (int, float)) or not math.isfinite(reward):
        raise check_failure(env, f"{where} reward must be a finite number, got {reward!r}")
    for name, flag in (("terminated", terminated), ("truncated", truncated)):
        if not isinstance(flag, bool):
            raise check_failure(env, f"{where} {name} must be a bool, got {type(flag).__name__}")
    if not isinstance(info, dict):
        raise check_failure(env, f"{where} info must be a dict, got {type(info).__name__}")
    if not (terminated or truncated) and not observation:
        raise check_failure(env, f"{where} returned no observation for an episode that goes on: the policy would be asked "
                         "to speak twice in a row")
    return StepResult(observation, float(reward), terminated, truncated, info)


def checked_call(env: LMEnv, what: str, function: Callable[[], object]) -> object:
    """``function()``; an exception becomes the EnvCheckError of the rule it breaks."""
    try:
        return function()
    except Exception as e:  # noqa: BLE001 - any exception is the broken rule
        detail = " ".join(str(e).split())[:300]
        if what.startswith("step("):
            rule = ("an environment must answer any text with an observation saying what was expected, never an "
                    "exception (a policy writes garbage early in training)")
        elif what.startswith("reset("):
            rule = "reset must start an episode for every example of its task and for example=None"
        else:
            rule = "the expert must be able to act in every state of an episode it plays"
        raise check_failure(env, f"{what} raised {type(e).__name__}: {detail}; {rule}") from e


def _step(env: LMEnv, action: str) -> StepResult:
    return _check_step(env, checked_call(env, f"step({action[:30]!r})", lambda: env.step(action)), action)


def _reset(env: LMEnv, example: Example | None, seed: int) -> object:
    return checked_call(env, f"reset(example, seed={seed})", lambda: env.reset(example, seed=seed))


def _play_to_end(env: LMEnv, example: Example | None, seed: int, max_steps: int, action: Callable[[int], str],
                 infos: list | None = None) -> bool:
    """Reset, then step with ``action(i)`` until the episode ends (True) or ``max_steps`` pass (False); the step
    results' rewards and infos are appended to ``infos`` as ``(reward, info)``."""
    _reset(env, example, seed)
    for i in range(max_steps):
        text = action(i)
        if not isinstance(text, str):
            raise check_failure(env, f"an action must be text, got {type(text).__name__}")
        result = _step(env, text)
        if infos is not None:
            infos.append((result.reward, result.info))
        if result.terminated or result.truncated:
            return True
    return False


def episode_succeeded(rewards: Sequence[float], infos: Sequence[dict]) -> bool:
    """An episode's success as the trainer judges it: a turn whose ``info["correct"]`` is true when the
    environment reports ``correct``, else a positive return."""
    if any("correct" in info for info in infos):
        return any(bool(info.get("correct")) for info in infos)
    return sum(rewards) > 0


def expert_budget_problem(episode, budget: EpisodeBudget, turn_tokens: Sequence[int] = (),
                          prefix: str = "budget", require_success: bool = True) -> str | None:
    """Why an expert episode played under ``budget`` is no demonstration, or None: a budget cut it (named as
    ``{prefix}.<field>`` with its value and what the expert needed), the environment failed, or (with
    ``require_success``) it ended without success.

    ``episode``: an ``lmpo.generation.episodes.Episode`` played with ``expert=True``; ``turn_tokens``: the
    tokens each expert turn needed (its text and the stop token), when known.
    """
    turn = episode.num_turns - 1
    reason = episode.end_reason
    if reason == "max_new_tokens_per_turn":
        need = f" (it needs {turn_tokens[turn]} tokens)" if turn < len(turn_tokens) else ""
        return (f"the expert's turn {turn} was cut by `{prefix}.max_new_tokens_per_turn` = "
                f"{budget.max_new_tokens_per_turn}{need}; raise it, or the demonstrations teach cut-off turns")
    if reason == "max_total_tokens":
        return (f"the expert's episode was cut at turn {turn} by `{prefix}.max_total_tokens` = "
                f"{budget.max_total_tokens} ({len(episode.prompt_ids) + len(episode.completion_ids)} tokens so far); "
                "raise it")
    if reason == "max_turns":
        return (f"the expert's episode did not end within `{prefix}.max_turns` = {budget.max_turns} turns; raise "
                "it (or the environment's own turn limit is higher than the budget's)")
    if reason == "env_error":
        return f"the environment failed during the expert's episode: {episode.error}"
    if require_success and not episode_succeeded(episode.rewards, episode.infos):
        return (f"the expert's episode ended ({reason}) without success (return {episode.episode_return:g}): the "
                "expert or the reward is wrong, and its demonstrations would teach failing")
    return None


def check_env(env: LMEnv, examples: Sequence[Example | None] = (None,), seed: int = 0,
              max_steps: int = 64) -> None:
    """Raise :class:`EnvCheckError` naming the rule an environment breaks; return None when it keeps them all.

    Checks: the environment card (:func:`check_card`); tool schemas; ``reset`` returns a non-empty opening of
    system/user messages and an info dict, the same for the same seed, and never raises; every action in
    ``PROBE_ACTIONS`` gets a well-formed step result (observation messages of user/tool roles, a finite reward,
    bool flags, an info dict, an observation whenever the episode goes on) and never an exception; ``step``
    after the episode has ended raises; an episode of repeated probe actions ends within ``max_steps`` steps or
    keeps answering; an environment with an ``expert_action`` gets, on every example, an expert episode that
    ends within ``max_steps`` steps and succeeds (a turn with ``info["correct"]``, or a positive return).

    Under a token budget and a chat template, ``lmpo.generation.episodes.check_expert_budget`` plays the expert
    through the episode driver, as a supervised warm-up does (the driver sits above this layer).
    """
    check_card(env)
    for tool in env.tools:
        if not isinstance(tool, Tool):
            raise check_failure(env, f"tools must be lmpo.envs.tools.Tool objects, got {type(tool).__name__}")
        if tool.schema["function"]["name"] != tool.name:
            raise check_failure(env, f"tool {tool.name!r}'s schema names another function")
    for example in examples:
        first = _reset(env, example, seed)
        again = _reset(env, example, seed)
        for result in (first, again):
            if not isinstance(result, tuple) or len(result) != 2 or not isinstance(result[1], dict):
                raise check_failure(env, f"reset() must return (messages, info), got {result!r:.200}")
        try:
            opening = check_messages(first[0], OPENING_ROLES, "reset() messages")
        except ValueError as e:
            raise check_failure(env, str(e)) from None
        if not opening:
            raise check_failure(env, "reset() returned no opening messages")
        if first[0] != again[0]:
            raise check_failure(env, f"reset(example, seed={seed}) is not deterministic: two calls gave different openings")
        for action in PROBE_ACTIONS:  # each probe on a fresh episode, so that every one is answered mid-episode
            _reset(env, example, seed)
            _step(env, action)
        if _play_to_end(env, example, seed, max_steps, lambda i: PROBE_ACTIONS[i % len(PROBE_ACTIONS)]):
            try:
                env.step("hello")
            except Exception:  # noqa: BLE001 - any exception is the expected refusal
                pass
            else:
                raise check_failure(env, "step() after the episode ended must raise (call reset() first), but it returned")
        if type(env).expert_action is not LMEnv.expert_action:
            results: list = []
            expert = lambda i: checked_call(env, "expert_action()", env.expert_action)  # noqa: E731
            if not _play_to_end(env, example, seed, max_steps, expert, results):
                raise check_failure(env, f"the expert's episode did not end within {max_steps} steps")
            if not episode_succeeded([r for r, _ in results], [i for _, i in results]):
                raise check_failure(env, f"the expert's episode (seed {seed}) ended without success (return "
                                 f"{sum(r for r, _ in results):g}): the expert or the reward is wrong")
    env.close()


