"""Tools for environments: callables with JSON schemas (``Tool``), the Hermes/Qwen tool-call parser, and the
built-ins (``TOOLS``): ``calculator`` (safe arithmetic) and ``python`` (a sandboxed subprocess)."""

from lmpo.envs.tools.base import Tool, ToolCall, ToolResult, cap_output, run_tool_call
from lmpo.envs.tools.calculator import CalculatorError, calculate, calculator_tool
from lmpo.envs.tools.parser import format_tool_call, parse_tool_calls, strip_tool_calls
from lmpo.envs.tools.sandbox import (
    Isolation,
    SandboxError,
    SandboxResult,
    isolation,
    network_isolation,
    python_tool,
    run_python,
)

#: built-in tool name -> factory taking the tool's limits as keyword options
TOOLS = {"calculator": calculator_tool, "python": python_tool}

__all__ = [
    "TOOLS",
    "CalculatorError",
    "Isolation",
    "SandboxError",
    "SandboxResult",
    "Tool",
    "ToolCall",
    "ToolResult",
    "calculate",
    "calculator_tool",
    "cap_output",
    "format_tool_call",
    "isolation",
    "network_isolation",
    "parse_tool_calls",
    "python_tool",
    "run_python",
    "run_tool_call",
    "strip_tool_calls",
]
