"""Tool calls in the Hermes / Qwen format: ``<tool_call>{"name": …, "arguments": {…}}</tool_call>``.

This is the format of the Hermes 2 Pro, Qwen2.5 and Qwen3 chat templates (the model writes one JSON object per
call between the tags, ``arguments`` an object). A block that is not valid JSON, not an object, lacks a string
``name`` or has non-object ``arguments`` still yields a :class:`ToolCall`, with ``error`` saying what is wrong,
so that the policy is told instead of the call vanishing. An opening tag without its closing tag is malformed
too (a turn cut by its token budget is usually one).

>>> parse_tool_calls('<tool_call>{"name": "calculator", "arguments": {"expression": "2+3"}}</tool_call>')
[ToolCall(name='calculator', arguments={'expression': '2+3'}, error=None)]
"""

from __future__ import annotations

import json
import re
from typing import Any

from lmpo.envs.tools.base import ToolCall

OPEN_TAG, CLOSE_TAG = "<tool_call>", "</tool_call>"
_BLOCK = re.compile(re.escape(OPEN_TAG) + r"(.*?)" + re.escape(CLOSE_TAG), re.DOTALL)


def _to_call(body: str) -> ToolCall:
    try:
        obj = json.loads(body)
    except json.JSONDecodeError as e:
        return ToolCall("", error=f"tool call is not valid JSON ({e.msg} at character {e.pos}): {body.strip()[:80]!r}")
    if not isinstance(obj, dict):
        return ToolCall("", error=f"tool call must be a JSON object with 'name' and 'arguments', got {type(obj).__name__}")
    name = obj.get("name")
    if not isinstance(name, str) or not name:
        return ToolCall("", error="tool call has no 'name' string")
    arguments: Any = obj.get("arguments", {})
    if isinstance(arguments, str):  # some models write the arguments as a JSON string, as OpenAI's API does
        try:
            arguments = json.loads(arguments)
        except json.JSONDecodeError:
            return ToolCall(name, error=f"arguments of {name} are a string that is not JSON")
    if not isinstance(arguments, dict):
        return ToolCall(name, error=f"arguments of {name} must be a JSON object, got {type(arguments).__name__}")
    return ToolCall(name, arguments)


def parse_tool_calls(text: str) -> list[ToolCall]:
    """Every tool call in ``text``, in order; malformed ones carry ``error`` (see the module docstring)."""
    calls = [_to_call(m.group(1)) for m in _BLOCK.finditer(text)]
    rest = _BLOCK.sub("", text)
    if OPEN_TAG in rest:
        calls.append(ToolCall("", error=f"{OPEN_TAG} without a closing {CLOSE_TAG}"))
    return calls


def strip_tool_calls(text: str) -> str:
    """``text`` without its tool-call blocks (the assistant's prose)."""
    return _BLOCK.sub("", text).strip()


def format_tool_call(name: str, arguments: dict[str, Any]) -> str:
    """The text a policy writes to call ``name`` (for demonstrations and tests)."""
    return f"{OPEN_TAG}{json.dumps({'name': name, 'arguments': arguments})}{CLOSE_TAG}"
