"""``ToolEnv``: an environment whose assistant turns either call tools or give the final answer."""

from __future__ import annotations

from typing import Any

from lmpo.envs.base import LMEnv, Message, StepResult
from lmpo.envs.tools.base import Tool, run_tool_call
from lmpo.envs.tools.parser import parse_tool_calls


class ToolEnv(LMEnv):
    """Base class: a turn with ``<tool_call>`` blocks runs them, any other turn is the answer.

    A tool turn's observation is one ``tool`` message per call, in order, holding the tool's output or an error
    text (unknown tool, malformed JSON, bad arguments, an exception, a timeout: see
    ``lmpo.envs.tools.run_tool_call``); it earns ``tool_reward`` per call that ran without error (0 by
    default) and the episode goes on. At most ``max_calls_per_turn`` calls of a turn run; the rest are
    answered with an error. A turn without tool calls goes to :meth:`answer`, which subclasses implement.

    ``info`` of every step counts ``tool_calls``, ``tool_errors`` and ``tool_outputs_truncated`` of that turn,
    so that a driver can report the rate of valid calls.
    """

    tool_reward: float = 0.0
    max_calls_per_turn: int = 4

    def __init__(self, tools: tuple[Tool, ...] | list[Tool]) -> None:
        super().__init__()
        self.tools = tuple(tools)

    def answer(self, text: str) -> StepResult:
        """Judge a turn that calls no tool (the final answer, or whatever else the policy wrote)."""
        raise NotImplementedError

    def step(self, action: str) -> StepResult:
        calls = parse_tool_calls(action)
        if not calls:
            result = self.answer(action)
            info = {"tool_calls": 0, "tool_errors": 0, "tool_outputs_truncated": 0, **result.info}
            return result._replace(info=info)
        observation: list[Message] = []
        errors = truncated = 0
        for i, call in enumerate(calls):
            if i >= self.max_calls_per_turn:
                output, ok, cut = f"error: at most {self.max_calls_per_turn} tool calls per turn", False, False
            else:
                result = run_tool_call(self.tools, call)
                output, ok, cut = result.output, result.ok, result.truncated_output
            errors += not ok
            truncated += cut
            observation.append({"role": "tool", "name": call.name or "error", "content": output})
        info: dict[str, Any] = {"tool_calls": len(calls), "tool_errors": errors, "tool_outputs_truncated": truncated}
        return StepResult(observation, self.tool_reward * (len(calls) - errors), False, False, info)
