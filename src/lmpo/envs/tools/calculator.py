"""The calculator tool: arithmetic by walking the expression's syntax tree (``ast``), never ``eval``.

Allowed: integer and decimal literals, ``+ - * / // % **``, unary ``+ -``, parentheses and the functions
``abs``, ``round``, ``min``, ``max``, ``sqrt``. Anything else (names, attributes, calls of other functions,
strings, comprehensions…) is refused before evaluation. Work is bounded: expressions up to
``MAX_EXPRESSION_CHARS`` characters, exponents up to ``MAX_EXPONENT``, numbers (literals, intermediate values and
results) up to ``MAX_DIGITS`` digits, ``round``'s digits up to ``MAX_DIGITS``; every operation is then a few
arithmetic steps on numbers of at most ``MAX_DIGITS * MAX_EXPONENT`` digits. Complex results are refused.
Every refusal is a :class:`CalculatorError`.

>>> calculate("(12+30)*2")
'84'
>>> calculate("7/2")
'3.5'
"""

from __future__ import annotations

import ast
import math
import operator

from lmpo.envs.tools.base import Tool

MAX_EXPRESSION_CHARS = 200
MAX_EXPONENT = 64
MAX_DIGITS = 100

_BINARY = {ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul, ast.Div: operator.truediv,
           ast.FloorDiv: operator.floordiv, ast.Mod: operator.mod, ast.Pow: operator.pow}
_UNARY = {ast.UAdd: operator.pos, ast.USub: operator.neg}
_FUNCTIONS = {"abs": abs, "round": round, "min": min, "max": max, "sqrt": math.sqrt}


class CalculatorError(ValueError):
    """The expression is not allowed or cannot be evaluated; the message says why."""


_LARGEST = 10**MAX_DIGITS


def _check_size(value: int | float) -> int | float:
    # compared, never converted to text: str() of a huge int is itself slow and refused past 4,300 digits
    if isinstance(value, int) and abs(value) >= _LARGEST:
        raise CalculatorError(f"result has more than {MAX_DIGITS} digits")
    if isinstance(value, float) and not math.isfinite(value):
        raise CalculatorError("result is not finite")
    if not isinstance(value, (int, float)):
        raise CalculatorError(f"result is not a real number ({type(value).__name__})")
    return value


def _eval(node: ast.AST) -> int | float:
    if isinstance(node, ast.Expression):
        return _eval(node.body)
    if isinstance(node, ast.Constant) and type(node.value) in (int, float):
        return _check_size(node.value)
    if isinstance(node, ast.BinOp) and type(node.op) in _BINARY:
        left, right = _eval(node.left), _eval(node.right)
        if isinstance(node.op, ast.Pow) and abs(right) > MAX_EXPONENT:
            raise CalculatorError(f"exponent {right} is larger than {MAX_EXPONENT}")
        try:
            return _check_size(_BINARY[type(node.op)](left, right))
        except ZeroDivisionError:
            raise CalculatorError("division by zero") from None
        except OverflowError:
            raise CalculatorError("result is too large") from None
    if isinstance(node, ast.UnaryOp) and type(node.op) in _UNARY:
        return _check_size(_UNARY[type(node.op)](_eval(node.operand)))
    if (isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id in _FUNCTIONS
            and not node.keywords):
        args = [_eval(a) for a in node.args]
        if node.func.id == "round" and len(args) == 2 and isinstance(args[1], int) and abs(args[1]) > MAX_DIGITS:
            # round(2, -10**9) computes 10**(10**9): minutes of work no thread timeout can interrupt
            raise CalculatorError(f"round: digits {args[1]} beyond ±{MAX_DIGITS}")
        try:
            return _check_size(_FUNCTIONS[node.func.id](*args))
        except (TypeError, ValueError, ArithmeticError) as e:
            raise CalculatorError(f"{node.func.id}: {e}") from None
    raise CalculatorError(f"{type(node).__name__} is not allowed (numbers, + - * / // % **, parentheses and "
                          f"{', '.join(_FUNCTIONS)} only)")


def calculate(expression: str) -> str:
    """The value of an arithmetic expression as text: integers exactly, other numbers with 12 significant digits.

    Raises:
        CalculatorError: a syntax error, a construct that is not arithmetic, or a bound exceeded.
    """
    if not isinstance(expression, str):
        raise CalculatorError("expression must be a string")
    if len(expression) > MAX_EXPRESSION_CHARS:
        raise CalculatorError(f"expression is longer than {MAX_EXPRESSION_CHARS} characters")
    try:
        tree = ast.parse(expression.strip(), mode="eval")
    except SyntaxError as e:
        raise CalculatorError(f"not an expression: {e.msg}") from None
    try:
        value = _eval(tree)
    except (ArithmeticError, ValueError, TypeError, RecursionError, MemoryError) as e:
        if isinstance(e, CalculatorError):
            raise
        raise CalculatorError(f"cannot evaluate: {type(e).__name__}: {e}") from None
    if isinstance(value, float):
        return str(int(value)) if value.is_integer() and abs(value) < 1e15 else format(value, ".12g")
    return str(value)


def calculator_tool(timeout_s: float = 2.0, max_output_chars: int = 200) -> Tool:
    """The calculator as a :class:`Tool` named ``calculator`` with one string argument ``expression``."""
    return Tool(
        name="calculator",
        description="Evaluate an arithmetic expression (numbers, + - * / // % **, parentheses, abs, round, min, "
                    "max, sqrt) and return its value.",
        parameters={"type": "object",
                    "properties": {"expression": {"type": "string", "description": "for example (12+30)*2"}},
                    "required": ["expression"]},
        function=calculate, timeout_s=timeout_s, max_output_chars=max_output_chars)
