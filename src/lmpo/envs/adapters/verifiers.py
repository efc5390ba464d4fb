"""A verifiers environment (``MultiTurnEnv``, ``ToolEnv``, ``SingleTurnEnv``) with its rubric as an lmpo environment
and reward (optional extra: ``pip install 'lmpo[verifiers]'``).

`verifiers <https://github.com/PrimeIntellect-ai/verifiers>`_ (the environments of Prime Intellect's
Environments Hub) writes an environment as an ``Environment`` subclass: a dataset of prompts, ``env_response`` (the
environment's answer to an assistant turn), stop conditions (``is_completed``: ``@vf.stop`` methods such as
``max_turns_reached``, or ``no_tools_called`` for a ``ToolEnv``) and a ``Rubric`` of weighted reward functions. Its
own rollout loop asks an OpenAI-style client for each turn; here lmpo's policy writes the turns instead, and the
adapter drives the environment's own pieces in the same order as ``MultiTurnEnv.rollout``: ``init_state`` and
``setup_state`` at reset; per turn, the assistant message appended as a trajectory step
(``add_trajectory_step``), the stop conditions, then ``get_prompt_messages`` (which calls ``env_response``); at
the end, the cleanup handlers and ``rubric.score_rollout``, whose reward is the episode's.

The adapter uses verifiers' classic API (``import verifiers as vf``: 0.2 and 0.3; verifiers 0.4 has only its new
``verifiers.v1`` stack). The environment is named by ``environment``: an import path ``package.module:function``
returning a ``vf.Environment`` (called with ``env_args``), or the id of an installed verifiers environment package
(``vf.load_environment(id, **env_args)``).
"""

from __future__ import annotations

import asyncio
import functools
import importlib
import json
import threading
import time
from typing import Any

from lmpo.envs.adapters import import_extra
from lmpo.envs.base import LMEnv, Message, StepResult, register_env, strip_thinking
from lmpo.envs.tools.parser import parse_tool_calls, strip_tool_calls
from lmpo.errors import InputError
from lmpo.tasks.base import Example, Task

ENV_ID = "verifiers/Environment-v0"
META_KEY = "verifiers"
#: verifiers' stop conditions that cut an episode for a limit rather than end it (truncated, not terminated)
LIMIT_STOPS = ("max_turns_reached", "max_total_completion_tokens_reached", "prompt_too_long", "timeout_reached")
_loops = threading.local()


def import_verifiers():
    """``verifiers`` (its classic API), or InputError saying how to install it."""
    vf = import_extra("verifiers", "verifiers", "verifiers environments")
    if not hasattr(vf, "MultiTurnEnv"):
        raise InputError(f"verifiers {getattr(vf, '__version__', '?')} has no classic API (vf.MultiTurnEnv): the "
                         "adapter needs verifiers >= 0.2.1, < 0.4 (pip install 'lmpo[verifiers]').")
    return vf


def run(coroutine):
    """Run a verifiers coroutine to completion on this thread's event loop (one per thread, kept: environments
    may hold loop-bound objects between calls)."""
    loop = getattr(_loops, "loop", None)
    if loop is None or loop.is_closed():
        loop = _loops.loop = asyncio.new_event_loop()
    return loop.run_until_complete(coroutine)


@functools.lru_cache(maxsize=16)
def _load(environment: str, env_args_json: str):
    vf = import_verifiers()
    env_args = json.loads(env_args_json)
    try:
        if ":" in environment:
            module, _, attribute = environment.partition(":")
            built = getattr(importlib.import_module(module), attribute)(**env_args)
        else:
            built = vf.load_environment(environment, **env_args)
    except (ImportError, AttributeError, ValueError, TypeError) as e:
        raise InputError(f"verifiers environment {environment!r} cannot be loaded ({type(e).__name__}: {e}); give "
                         "`environment` as 'package.module:function' returning a vf.Environment, or the id of an "
                         "installed verifiers environment, with its keyword arguments in `env_args`.") from e
    if not isinstance(built, vf.Environment):
        raise InputError(f"verifiers environment {environment!r} gave a {type(built).__name__}, not a vf.Environment.")
    if not isinstance(built, vf.MultiTurnEnv):
        raise InputError(f"verifiers environment {environment!r} is a {type(built).__name__}: the adapter plays "
                         "MultiTurnEnv subclasses (SingleTurnEnv, ToolEnv, your own env_response).")
    group = [f.__name__ for r in getattr(built.rubric, "rubrics", [built.rubric]) for f in r.funcs if r._is_group_func(f)]
    if group:
        raise InputError(f"verifiers environment {environment!r} has group-level reward functions {group}: lmpo scores "
                         "each episode on its own (Rubric.score_rollout); make them per-rollout functions.")
    return built


def load_environment(environment: str, env_args: dict | None = None):
    """The ``vf.Environment`` named by ``environment`` (see the module docstring), built once per process."""
    return _load(environment, json.dumps(env_args or {}, sort_keys=True))


@functools.cache
def _policy_is_lmpo():
    """A ``vf.Client`` for ``init_state``, which needs one: lmpo's policy writes the turns, so any call of it (an
    environment sampling from the policy model itself) fails saying so."""
    vf = import_verifiers()
    from verifiers.clients import Client

    class PolicyIsLmpo(Client):
        def _refuse(self, *args: Any, **kwargs: Any):
            raise vf.Error("the lmpo adapter plays the policy's turns itself: this environment called the rollout "
                           "client, which lmpo does not provide")

        setup_client = to_native_tool = to_native_prompt = get_native_response = _refuse
        raise_from_native_response = from_native_response = _refuse

        async def close(self) -> None:
            return None

    return PolicyIsLmpo(None)


def to_lmpo(message: Any, call_names: dict[str, str]) -> Message:
    """A verifiers message as an lmpo chat message (text content; a tool message names its tool)."""
    content = message.content
    if isinstance(content, list):  # content parts: the text ones, in order
        content = "".join(p.get("text", "") if isinstance(p, dict) else getattr(p, "text", "") or "" for p in content)
    out: Message = {"role": message.role, "content": content or ""}
    if message.role == "tool":
        out["name"] = call_names.get(message.tool_call_id, "")
    return out


class VerifiersTask(Task):
    """The verifiers environment's own rows as examples: its eval dataset (``get_eval_dataset``; its train dataset
    when it has none, as verifiers does) is the held-out split, its train dataset the training pool; a row's
    prompt is never in both (rows of the eval split are removed from the pool)."""

    def __init__(self, environment: str, env_args: dict | None = None, num_eval: int = 100) -> None:
        self.environment, self.env_args, self.num_eval = environment, dict(env_args or {}), num_eval
        self.name = f"verifiers/{environment}"
        self._env = load_environment(environment, self.env_args)

    def _example(self, row: dict) -> Example:
        prompt = row["prompt"]
        text = prompt if isinstance(prompt, str) else "\n".join(str(m.get("content", "")) for m in prompt)
        spec = {"environment": self.environment, "env_args": self.env_args, "row": row}
        return Example(prompt=text, answer=str(row.get("answer", "")), meta={META_KEY: spec})

    def eval_examples(self) -> list[Example]:
        return [self._example(dict(r)) for r in self._env.get_eval_dataset(n=self.num_eval)]

    def train_examples(self, seed: int = 0) -> list[Example]:
        held_out = {e.prompt for e in self.eval_examples()}
        pool = [e for e in (self._example(dict(r)) for r in self._env.get_dataset()) if e.prompt not in held_out]
        if not pool:
            raise ValueError(f"{self.name}: every row of the train dataset is in the held-out split; give the "
                             "environment an eval_dataset of its own or more rows")
        return pool


class VerifiersEnv(LMEnv):
    """A verifiers ``MultiTurnEnv`` / ``ToolEnv``, its turns written by lmpo's policy, scored by its ``Rubric``.

    ## Description
    Plays the verifiers environment named by the example (examples of ``VerifiersTask``, whose ``task.options``
    name it: ``{environment: 'package.module:load_environment', env_args: {…}}``) with the environment's own
    ``init_state``/``setup_state``, ``env_response``, stop conditions, cleanup and rubric, in the order of
    verifiers' ``MultiTurnEnv.rollout``; only the model call is lmpo's. ``reset(None, seed)`` plays a row of the
    env's ``environment`` option drawn from the seed.

    ## Observations
    The opening is the row's prompt as verifiers formats it (system prompt and the question; chat prompts only, and
    no few-shot assistant turns: an lmpo opening holds system and user messages).
    After each turn, the messages ``env_response`` added (user messages, or one ``tool`` message per call for a
    ``ToolEnv``), and at the end any final environment response. Tool schemas are the environment's
    ``tool_defs`` (rendered by the chat template).

    ## Actions
    Any text. ``<tool_call>{"name": …, "arguments": {…}}</tool_call>`` blocks (Hermes / Qwen format) become the
    assistant message's tool calls (a malformed block is passed on as a call whose arguments are not JSON, which
    verifiers answers with its error text); the rest, after any ``</think>``, is the content.

    ## Rewards
    0.0 on every turn but the last; the last turn gets the rubric's reward (``Rubric.score_rollout``: the
    weighted sum of its reward functions), ``info["metrics"]`` each function's value. Group-level reward
    functions are refused (lmpo scores each episode on its own).

    ## Episode End
    When one of the environment's stop conditions fires: truncated for its limits (``max_turns_reached``, token
    or time limits, ``prompt_too_long``), terminated otherwise (``info["stop_condition"]`` names it; an error an
    ``env_response`` raises as ``vf.Error`` ends the episode as verifiers does, ``info["error"]``).

    ## Version
    v0: first version (tested with verifiers 0.3.1).

    Args:
        environment, env_args: the environment ``reset(None, seed)`` plays (see the module docstring).
    """

    def __init__(self, environment: str | None = None, env_args: dict | None = None) -> None:
        super().__init__()
        self._vf = import_verifiers()
        self.environment, self.env_args = environment, dict(env_args or {})
        self._env: Any = None
        self._state: Any = None
        self._prompt: list = []
        self._turn = 0
        self._call_names: dict[str, str] = {}
        self._tool_schemas: list[dict] | None = None
        if environment is not None:
            self._use(environment, self.env_args)

    def _use(self, environment: str, env_args: dict) -> None:
        self._env = load_environment(environment, env_args)
        tool_defs = self._env.tool_defs or []
        self._tool_schemas = [{"type": "function", "function": {"name": t.name, "description": t.description,
                                                                "parameters": t.parameters}} for t in tool_defs] or None

    @property
    def tool_schemas(self) -> list[dict[str, Any]] | None:
        return self._tool_schemas

    def reset(self, example: Example | None = None, seed: int | None = None) -> tuple[list[Message], dict]:
        super().reset(example, seed)
        if example is not None:
            if META_KEY not in example.meta:
                raise InputError(f"{self.env_id or ENV_ID}: the example has no meta[{META_KEY!r}]; reset it on "
                                 "examples of its task (VerifiersTask).")
            spec = example.meta[META_KEY]
            self._use(spec["environment"], spec["env_args"])
            row = spec["row"]
        elif self._env is None:
            raise InputError(f"{self.env_id or ENV_ID} has no environment to draw from: set env.options.environment "
                             "or reset it on examples of its task.")
        else:
            dataset = self._env.get_dataset()
            row = dict(dataset[int(self.np_random.integers(len(dataset)))])
        self._call_names, self._turn = {}, 0
        state = run(self._env.init_state(row, client=_policy_is_lmpo(), model="lmpo-policy"))
        try:
            state = run(self._env.setup_state(state)) or state
        except self._vf.Error as e:
            state["error"] = e
        self._state, self._prompt = state, state["prompt"]
        return [to_lmpo(m, self._call_names) for m in state["prompt"]], {"example_id": row.get("example_id")}

    def _response(self, text: str):
        vf = self._vf
        calls = parse_tool_calls(text) if self._tool_schemas else []
        tool_calls = []
        for i, call in enumerate(calls):
            call_id = f"call_{self._turn}_{i}"
            self._call_names[call_id] = call.name
            arguments = json.dumps(call.arguments) if call.error is None else f"<not JSON: {call.error}>"
            tool_calls.append(vf.ToolCall(id=call_id, name=call.name, arguments=arguments))
        content = strip_thinking(strip_tool_calls(text) if calls else text)
        reasoning = text.rsplit("</think>", 1)[0] if "</think>" in text else None
        message = vf.ResponseMessage(content=content, reasoning_content=reasoning, tool_calls=tool_calls or None,
                                     finish_reason="tool_calls" if tool_calls else "stop", is_truncated=False)
        return vf.Response(id=f"lmpo-{self._turn}", created=int(time.time()), model="lmpo-policy", message=message)

    async def _advance(self, text: str) -> tuple[list, bool]:
        """Append the turn and run the environment until the policy's next turn or the end: (new messages, ended)."""
        env, state = self._env, self._state
        await env.add_model_response(state, self._prompt, self._response(text))
        if await env.is_completed(state):
            return [], True
        seen = len(self._prompt) + 1  # the prompt of this turn and its assistant message
        try:
            self._prompt = await env.get_prompt_messages(state)
        except self._vf.Error as e:  # verifiers' rollout loop records it and stops (has_error)
            state["error"] = e
            return [], await env.is_completed(state)
        return list(self._prompt[seen:]), await env.is_completed(state)

    def step(self, action: str) -> StepResult:
        if self._state is None:
            raise RuntimeError(f"{self.env_id or ENV_ID}: step() called before reset() or after the episode ended")
        state = self._state
        new, ended = run(self._advance(action))
        self._turn += 1
        observation = [to_lmpo(m, self._call_names) for m in new]
        if not ended:
            return StepResult(observation, 0.0, False, False, {})
        self._state = None
        run(self._env.cleanup(state))
        run(self._env.rubric.score_rollout(state))
        run(self._env.rubric.cleanup(state))
        if not observation and state.get("final_env_response"):
            observation = [to_lmpo(m, self._call_names) for m in state["final_env_response"]]
        stop = state.get("stop_condition")
        info = {"stop_condition": stop, "metrics": dict(state.get("metrics") or {})}
        if state.get("error") is not None:
            info["error"] = repr(state["error"])
        limited = stop in LIMIT_STOPS
        return StepResult(observation, float(state.get("reward") or 0.0), not limited, limited, info)


def _task(environment: str, env_args: dict | None = None, num_eval: int = 100) -> VerifiersTask:
    return VerifiersTask(environment, env_args, num_eval)


register_env(ENV_ID, task=_task, requires="verifiers")(VerifiersEnv)
