"""Tools: Python callables with a JSON schema, run one call at a time under a timeout and an exception boundary.

>>> def add(a: int, b: int) -> int:
...     '''Add two integers.
...
...     Args:
...         a: the first term.
...         b: the second term.
...     '''
...     return a + b
>>> t = Tool.from_function(add)
>>> t.schema["function"]["parameters"]["required"]
['a', 'b']
>>> run_tool_call([t], ToolCall("add", {"a": 2, "b": 3})).output
'5'

A call never raises: an unknown tool, arguments that do not fit the schema, an exception inside the tool and a
call that outlives its timeout all come back as a :class:`ToolResult` with ``ok=False`` and an error text the
policy reads as the tool's observation. Outputs are capped at ``max_output_chars``.

The timeout of an in-process tool is a wall-clock wait on a daemon thread: the caller gets its error on time,
but Python cannot kill a thread, so a tool that never returns keeps its thread (and CPU) until the process
ends. Tools that may run untrusted or unbounded work run in a subprocess that is killed instead
(``lmpo.envs.tools.sandbox``).
"""

from __future__ import annotations

import inspect
import json
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, get_type_hints

from lmpo.envs.base import call_with_timeout

_JSON_TYPES = {int: "integer", float: "number", str: "string", bool: "boolean", list: "array", dict: "object"}


@dataclass(frozen=True)
class ToolCall:
    """One call the policy asked for: a tool name and its arguments (``error`` set when it could not be parsed)."""

    name: str
    arguments: dict[str, Any] = field(default_factory=dict)
    error: str | None = None


@dataclass(frozen=True)
class ToolResult:
    """What one call gave: ``output`` is the text the policy sees (an error text when ``ok`` is False)."""

    name: str
    output: str
    ok: bool
    truncated_output: bool = False


def cap_output(text: str, max_chars: int) -> tuple[str, bool]:
    """``text`` cut to ``max_chars`` characters with a note saying how much was dropped, and whether it was cut."""
    if len(text) <= max_chars:
        return text, False
    return text[:max_chars] + f"\n[output truncated: {len(text) - max_chars} more characters]", True


def _param_docs(doc: str) -> dict[str, str]:
    """``name: text`` lines of a Google-style ``Args:`` section."""
    out, in_args = {}, False
    for line in doc.splitlines():
        stripped = line.strip()
        if stripped in ("Args:", "Arguments:", "Parameters:"):
            in_args = True
            continue
        if in_args:
            m = re.match(r"^(\w+)(?:\s*\([^)]*\))?:\s*(.*)$", stripped)
            if m:
                out[m.group(1)] = m.group(2)
            elif stripped and not line.startswith((" " * 8, "\t\t")) and stripped.endswith(":"):
                in_args = False
    return out


@dataclass(frozen=True)
class Tool:
    """A callable the policy may call, described by a JSON schema.

    Args:
        name: the name the policy calls it by.
        description: what it does (shown to the policy through the chat template).
        parameters: the JSON schema of its keyword arguments (``{"type": "object", "properties": …,
            "required": […]}``).
        function: called as ``function(**arguments)``; its result is turned into text with ``str`` (dicts and
            lists as JSON).
        timeout_s: wall-clock limit of one call.
        max_output_chars: longest output the policy sees; longer ones are cut with a note.
    """

    name: str
    description: str
    parameters: dict[str, Any]
    function: Callable[..., Any]
    timeout_s: float = 5.0
    max_output_chars: int = 1000

    def __post_init__(self) -> None:
        if not re.match(r"^[A-Za-z_][A-Za-z0-9_-]*$", self.name):
            raise ValueError(f"tool name {self.name!r} must be letters, digits, '_' or '-'")
        if self.parameters.get("type") != "object" or not isinstance(self.parameters.get("properties"), Mapping):
            raise ValueError(f"tool {self.name!r}: parameters must be a JSON schema of type 'object' with 'properties'")
        if self.timeout_s <= 0 or self.max_output_chars < 1:
            raise ValueError(f"tool {self.name!r}: timeout_s and max_output_chars must be positive")

    @property
    def schema(self) -> dict[str, Any]:
        """The OpenAI / Hugging Face function schema, the format of ``apply_chat_template(tools=[…])``."""
        return {"type": "function",
                "function": {"name": self.name, "description": self.description, "parameters": self.parameters}}

    @classmethod
    def from_function(cls, function: Callable[..., Any], name: str | None = None, **options: Any) -> Tool:
        """A tool from a type-annotated function: its first docstring paragraph is the description and its
        ``Args:`` lines describe the parameters (the format ``transformers.utils.get_json_schema`` reads)."""
        doc = inspect.getdoc(function) or ""
        hints = get_type_hints(function)
        params, required = {}, []
        for pname, p in inspect.signature(function).parameters.items():
            if p.kind in (p.VAR_POSITIONAL, p.VAR_KEYWORD):
                raise ValueError(f"tool {function.__name__}: *args/**kwargs cannot be described by a JSON schema")
            tp = hints.get(pname)
            if tp not in _JSON_TYPES:
                raise ValueError(f"tool {function.__name__}: parameter {pname!r} needs one of the annotations "
                                 f"{[t.__name__ for t in _JSON_TYPES]}, got {tp!r}")
            params[pname] = {"type": _JSON_TYPES[tp]}
            if pname in (docs := _param_docs(doc)):
                params[pname]["description"] = docs[pname]
            if p.default is inspect.Parameter.empty:
                required.append(pname)
        description = doc.split("\n\n")[0].strip() if doc else function.__name__
        schema = {"type": "object", "properties": params, "required": required}
        return cls(name=name or function.__name__, description=description, parameters=schema, function=function,
                   **options)

    def check_arguments(self, arguments: Mapping[str, Any]) -> str | None:
        """Why ``arguments`` do not fit the schema (missing, unknown or mistyped keys), or None if they do."""
        props = self.parameters["properties"]
        missing = [k for k in self.parameters.get("required", []) if k not in arguments]
        if missing:
            return f"missing argument(s) {missing}"
        unknown = [k for k in arguments if k not in props]
        if unknown:
            return f"unknown argument(s) {unknown}; {self.name} takes {sorted(props)}"
        for key, value in arguments.items():
            want = props[key].get("type")
            ok = {"integer": isinstance(value, int) and not isinstance(value, bool),
                  "number": isinstance(value, (int, float)) and not isinstance(value, bool),
                  "string": isinstance(value, str), "boolean": isinstance(value, bool),
                  "array": isinstance(value, list), "object": isinstance(value, dict)}.get(want, True)
            if not ok:
                return f"argument {key!r} must be of type {want}, got {type(value).__name__}"
        return None


def _as_text(value: Any) -> str:
    if isinstance(value, str):
        return value
    if isinstance(value, (dict, list)):
        return json.dumps(value)
    return str(value)


def _call_with_timeout(tool: Tool, arguments: dict[str, Any]) -> tuple[bool, str]:
    try:
        return True, _as_text(call_with_timeout(lambda: tool.function(**arguments), tool.timeout_s,
                                                f"lmpo-tool-{tool.name}"))
    except TimeoutError:
        return False, f"error: {tool.name} timed out after {tool.timeout_s:g} s"
    except BaseException as e:  # noqa: BLE001 - the boundary: whatever the tool raises becomes an observation
        return False, f"error: {tool.name} failed: {type(e).__name__}: {e}"


def run_tool_call(tools: Sequence[Tool], call: ToolCall) -> ToolResult:
    """Run one call against ``tools``; never raises (see the module docstring)."""
    by_name = {t.name: t for t in tools}
    if call.error is not None:
        return ToolResult(call.name or "?", f"error: {call.error}", ok=False)
    tool = by_name.get(call.name)
    if tool is None:
        return ToolResult(call.name, f"error: unknown tool {call.name!r}; available tools: "
                          f"{', '.join(sorted(by_name)) or 'none'}", ok=False)
    problem = tool.check_arguments(call.arguments)
    if problem is not None:
        return ToolResult(call.name, f"error: bad arguments for {call.name}: {problem}", ok=False)
    ok, text = _call_with_timeout(tool, dict(call.arguments))
    text, cut = cap_output(text, tool.max_output_chars)
    return ToolResult(call.name, text, ok=ok, truncated_output=cut)
