"""An OpenEnv environment server as an lmpo environment (optional extra: ``pip install 'lmpo[openenv]'``).

`OpenEnv <https://github.com/meta-pytorch/OpenEnv>`_ serves an environment over HTTP and WebSocket (FastAPI):
``reset(seed=…)`` and ``step(action)`` return an observation, a reward and ``done``; actions and observations
are typed (pydantic) on the server. The adapter is a client of such a server through openenv-core's own
``GenericEnvClient`` (one WebSocket session, hence one server-side environment, per episode) and only
translates: the policy's turn becomes one field of the action (or the whole action, written as JSON), the
observation's fields become a user message, the server's reward and ``done`` pass through.

Start the server yourself (``uvicorn <your_env>.server.app:app --port 8000``, a Docker image, a Hugging Face
Space) and name it in the run: ``env: {id: openenv/Remote-v0, options: {base_url: http://127.0.0.1:8000}}``.
The server must accept as many concurrent sessions as a step plays episodes (its ``max_concurrent_envs``).
"""

from __future__ import annotations

import json
from typing import Any

from lmpo.envs.adapters import SeedTask, import_extra
from lmpo.envs.base import LMEnv, Message, StepResult, register_env, strip_thinking
from lmpo.errors import InputError
from lmpo.tasks.base import Example

ENV_ID = "openenv/Remote-v0"


def import_openenv():
    """openenv-core's ``GenericEnvClient``, or InputError saying how to install it."""
    return import_extra("openenv.core.generic_client", "openenv", "OpenEnv environments").GenericEnvClient


def observation_text(observation: dict[str, Any], fields: list[str] | None) -> str:
    """The text of an observation: the chosen ``fields`` (default: all the server sends), one per line as
    ``name: value`` when there are several, a lone field's value as it is; non-string values as JSON."""
    keys = [k for k in (fields if fields is not None else observation) if k in observation]

    def text(value: Any) -> str:
        return value if isinstance(value, str) else json.dumps(value, sort_keys=True)

    if len(keys) == 1:
        return text(observation[keys[0]])
    return "\n".join(f"{k}: {text(observation[k])}" for k in keys)


class OpenEnvEnv(LMEnv):
    """An environment served by an OpenEnv server, played through its HTTP/WebSocket client.

    ## Description
    Connects to the OpenEnv server at ``base_url`` with openenv-core's ``GenericEnvClient`` (one WebSocket
    session per episode) and plays it unchanged. ``reset(example)`` passes ``seed=example.meta["seed"]`` (examples
    of the registered task: held-out seeds ``0 … num_eval−1``) and ``reset_options`` to the server's ``reset``.

    ## Observations
    The opening is one user message: the fields of the server's first observation (``observation_fields``, or
    all it sends: a lone field's text as it is, several as ``name: value`` lines), after ``system_prompt`` as a
    system message when one is given. After each turn, one user message with the new observation the same way.

    ## Actions
    Any text. With ``action_field`` set (default ``message``), the turn (after any ``</think>``) is that field of
    the action and ``action_options`` the other fields; with ``action_field: null`` the turn must be a JSON
    object of the action's fields. A turn the server refuses (its action schema rejects it) or that is not a
    JSON object in JSON mode is answered with a user message saying so (reward 0) and the episode goes on.

    ## Rewards
    The server's reward of each step (``None`` counts as 0.0).

    ## Episode End
    Terminated when the server says ``done``. Never truncated by the adapter: the episode driver's budgets cut
    episodes that run long. A server that fails (unreachable, an exception in its ``step``) raises, and the
    driver reports it naming the environment and the turn (``env.on_env_error``).

    ## Version
    v0: first version (tested with openenv-core 0.3.0).

    Args:
        base_url: the server's URL (``http://host:port``; ``ws://`` works too).
        action_field: the action's text field, or None for actions written as JSON objects.
        action_options: the action's other fields, sent with every step.
        observation_fields: the observation fields shown to the policy (default: all).
        reset_options: keyword options of the server's ``reset`` besides the seed.
        system_prompt: an optional system message before the first observation.
        message_timeout_s: how long to wait for one answer of the server.
    """

    def __init__(self, base_url: str | None = None, action_field: str | None = "message",
                 action_options: dict | None = None, observation_fields: list[str] | None = None,
                 reset_options: dict | None = None, system_prompt: str | None = None,
                 message_timeout_s: float = 60.0) -> None:
        super().__init__()
        client_cls = import_openenv()
        if not base_url:
            raise InputError(f"{ENV_ID} needs the URL of a running OpenEnv server: set env.options.base_url (e.g. "
                             "http://127.0.0.1:8000, the address the server listens on).")
        self.base_url, self.action_field = base_url, action_field
        self.action_options, self.reset_options = dict(action_options or {}), dict(reset_options or {})
        self.observation_fields = list(observation_fields) if observation_fields is not None else None
        self.system_prompt = system_prompt
        self._client = client_cls(base_url=base_url, message_timeout_s=message_timeout_s).sync()
        self._done = True

    def _message(self, payload: Any) -> Message:
        return {"role": "user", "content": observation_text(payload.observation or {}, self.observation_fields)}

    def reset(self, example: Example | None = None, seed: int | None = None) -> tuple[list[Message], dict]:
        super().reset(example, seed)
        server_seed = example.meta.get("seed") if example is not None else None
        if server_seed is None:
            server_seed = seed if seed is not None else int(self.np_random.integers(2**31))
        result = self._client.reset(seed=server_seed, **self.reset_options)
        self._done = bool(result.done)
        opening = [{"role": "system", "content": self.system_prompt}] if self.system_prompt else []
        return [*opening, self._message(result)], {"server_seed": server_seed}

    def _action(self, text: str) -> dict | str:
        """The action sent for a turn, or the text telling the policy why there is none."""
        text = strip_thinking(text)
        if self.action_field is not None:
            return {**self.action_options, self.action_field: text}
        try:
            fields = json.loads(text)
        except json.JSONDecodeError as e:
            return f"The action must be a JSON object of the action's fields ({e.msg} at character {e.pos})."
        if not isinstance(fields, dict):
            return f"The action must be a JSON object of the action's fields, not a {type(fields).__name__}."
        return {**self.action_options, **fields}

    def step(self, action: str) -> StepResult:
        if self._done:
            raise RuntimeError(f"{self.env_id or ENV_ID}: step() called before reset() or after the episode ended")
        sent = self._action(action)
        if isinstance(sent, str):
            return StepResult([{"role": "user", "content": sent}], 0.0, False, False, {"invalid_action": True})
        try:
            result = self._client.step(sent)
        except RuntimeError as e:
            if "VALIDATION_ERROR" not in str(e):
                raise
            refusal = f"The environment refused the action: it does not fit its action schema ({e})."
            return StepResult([{"role": "user", "content": refusal}], 0.0, False, False, {"invalid_action": True})
        self._done = bool(result.done)
        message = self._message(result)
        if not self._done and not message["content"]:  # the episode goes on: the policy needs something to read
            message["content"] = "(no observation)"
        observation = [message] if message["content"] else []
        return StepResult(observation, float(result.reward or 0.0), self._done, False, {})

    def close(self) -> None:
        self._client.close()


def _task(**options: Any) -> SeedTask:
    return SeedTask(ENV_ID, **options)


register_env(ENV_ID, task=_task, requires="openenv")(OpenEnvEnv)
