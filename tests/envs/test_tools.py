"""Tools: schemas, the Hermes/Qwen parser, the exception and timeout boundary, the calculator."""

from __future__ import annotations

import time

import pytest

from lmpo.envs.tools import (
    CalculatorError,
    Tool,
    ToolCall,
    calculate,
    calculator_tool,
    cap_output,
    format_tool_call,
    parse_tool_calls,
    run_tool_call,
    strip_tool_calls,
)
from lmpo.models import build_chat_tokenizer
from lmpo.tasks.chat import render_conversation


def add(a: int, b: int, note: str = "") -> int:
    """Add two integers.

    Args:
        a: the first term.
        b: the second term.
        note: ignored.
    """
    return a + b


def test_schema_from_function():
    tool = Tool.from_function(add)
    assert tool.schema == {
        "type": "function",
        "function": {
            "name": "add",
            "description": "Add two integers.",
            "parameters": {
                "type": "object",
                "properties": {"a": {"type": "integer", "description": "the first term."},
                               "b": {"type": "integer", "description": "the second term."},
                               "note": {"type": "string", "description": "ignored."}},
                "required": ["a", "b"],
            },
        },
    }


def test_schema_refuses_undescribable_functions():
    def untyped(x):
        return x

    def varargs(*xs: int) -> int:
        return 0

    with pytest.raises(ValueError, match="annotations"):
        Tool.from_function(untyped)
    with pytest.raises(ValueError, match=r"\*args"):
        Tool.from_function(varargs)


def test_schemas_reach_the_chat_template():
    template = ("{% if tools %}TOOLS:{% for t in tools %}{{ t['function']['name'] }};{% endfor %}\n{% endif %}"
                "{% for m in messages %}{{ m['role'] }}:{{ m['content'] }}\n{% endfor %}")
    tok = build_chat_tokenizer(template)
    text = render_conversation(tok, [{"role": "user", "content": "hi"}], add_generation_prompt=False,
                               tools=[calculator_tool().schema, Tool.from_function(add).schema])
    assert text == "TOOLS:calculator;add;user:hi\n"  # HF renders with trim_blocks: no newline after endif


@pytest.mark.parametrize("text, expected", [
    ('<tool_call>{"name": "add", "arguments": {"a": 1, "b": 2}}</tool_call>', [ToolCall("add", {"a": 1, "b": 2})]),
    # Qwen's templates put the JSON on its own line; arguments as a JSON string (OpenAI style) are accepted
    ('x <tool_call>\n{"name": "add", "arguments": "{\\"a\\": 1, \\"b\\": 2}"}\n</tool_call> y',
     [ToolCall("add", {"a": 1, "b": 2})]),
    ('<tool_call>{"name": "a"}</tool_call><tool_call>{"name": "b", "arguments": {}}</tool_call>',
     [ToolCall("a", {}), ToolCall("b", {})]),
    ("no call here", []),
])
def test_parse_well_formed(text, expected):
    assert parse_tool_calls(text) == expected


@pytest.mark.parametrize("text, error", [
    ("<tool_call>{'name': 'add'}</tool_call>", "not valid JSON"),
    ("<tool_call>[1, 2]</tool_call>", "JSON object"),
    ('<tool_call>{"arguments": {}}</tool_call>', "no 'name'"),
    ('<tool_call>{"name": "add", "arguments": [1]}</tool_call>', "must be a JSON object"),
    ('<tool_call>{"name": "add", "arguments": "a=1"}</tool_call>', "not JSON"),
    ('<tool_call>{"name": "add", "arguments": {"a": 1', "without a closing"),
])
def test_parse_malformed_gives_error_calls(text, error):
    calls = parse_tool_calls(text)
    assert len(calls) == 1 and error in calls[0].error
    result = run_tool_call([Tool.from_function(add)], calls[0])
    assert not result.ok and result.output.startswith("error:")


def test_format_and_strip_round_trip():
    text = "let me add " + format_tool_call("add", {"a": 1, "b": 2})
    assert parse_tool_calls(text) == [ToolCall("add", {"a": 1, "b": 2})]
    assert strip_tool_calls(text) == "let me add"


def test_run_tool_call_boundary():
    def boom(x: int) -> int:
        """Fails."""
        raise RuntimeError("kaput")

    def slow(x: int) -> int:
        """Sleeps."""
        time.sleep(5)
        return x

    def chatty(x: int) -> str:
        """Talks."""
        return "a" * 5000

    tools = [Tool.from_function(add), Tool.from_function(boom), Tool.from_function(slow, timeout_s=0.2),
             Tool.from_function(chatty, max_output_chars=100)]
    assert run_tool_call(tools, ToolCall("add", {"a": 2, "b": 3})).output == "5"
    cases = [
        (ToolCall("nope", {}), "unknown tool 'nope'"),
        (ToolCall("add", {"a": 1}), "missing argument(s) ['b']"),
        (ToolCall("add", {"a": 1, "b": 2, "c": 3}), "unknown argument(s) ['c']"),
        (ToolCall("add", {"a": "1", "b": 2}), "'a' must be of type integer"),
        (ToolCall("add", {"a": True, "b": 2}), "'a' must be of type integer"),
        (ToolCall("boom", {"x": 1}), "RuntimeError: kaput"),
        (ToolCall("slow", {"x": 1}), "timed out after 0.2 s"),
    ]
    for call, message in cases:
        start = time.monotonic()
        result = run_tool_call(tools, call)
        assert not result.ok and message in result.output, (call, result)
        assert time.monotonic() - start < 2.0
    long = run_tool_call(tools, ToolCall("chatty", {"x": 1}))
    assert long.ok and long.truncated_output
    assert long.output == "a" * 100 + "\n[output truncated: 4900 more characters]"


def test_cap_output():
    assert cap_output("abc", 3) == ("abc", False)
    assert cap_output("abcd", 3) == ("abc\n[output truncated: 1 more characters]", True)


@pytest.mark.parametrize("expression, value", [
    ("347*29", "10063"), ("(12+30)*2", "84"), ("7/2", "3.5"), ("8/2", "4"), ("-3**2", "-9"), ("2**10", "1024"),
    ("17//5", "3"), ("17%5", "2"), ("sqrt(16)", "4"), ("max(3, 9, 4)", "9"), ("abs(-2.5)", "2.5"), ("1/3", "0.333333333333"),
])
def test_calculator_values(expression, value):
    assert calculate(expression) == value


@pytest.mark.parametrize("expression, error", [
    ("__import__('os').system('true')", "not allowed"),
    ("(1).__class__", "not allowed"),
    ("x + 1", "not allowed"),
    ("'a' * 3", "not allowed"),
    ("[1, 2]", "not allowed"),
    ("open('f')", "not allowed"),
    ("9**9**9", "exponent"),
    ("10**64 * 10**64", "more than 100 digits"),
    ("1/0", "division by zero"),
    ("1 +", "not an expression"),
    ("1+" * 150 + "1", "longer than 200"),
    ("sqrt(-1)", "sqrt"),
    ("9" * 190 + "**64", "more than 100 digits"),  # str() of the power would pass Python's 4,300-digit guard
    ("9" * 101, "more than 100 digits"),
    ("(-8)**0.5", "not a real number"),
    ("round(2, -10**9)", "digits -1000000000 beyond"),  # 10**(10**9): minutes of uninterruptible work
    ("round(2.5, 10**9)", "digits 1000000000 beyond"),
    ("round(1, 1.5)", "round:"),
    ("1e308*10", "not finite"),
])
def test_calculator_refuses(expression, error):
    start = time.monotonic()
    with pytest.raises(CalculatorError, match=error):
        calculate(expression)
    # refused before any large computation: round(2, -10**9) used to run for minutes; a loaded machine's scheduling
    # noise stays far below this bound
    assert time.monotonic() - start < 10.0
    result = run_tool_call([calculator_tool()], ToolCall("calculator", {"expression": expression}))
    assert not result.ok and error in result.output
