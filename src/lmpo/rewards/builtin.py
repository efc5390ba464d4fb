"""Built-in reward functions, with TRL's reward signature so they can be shared with TRL unchanged::

    fn(prompts: list[str], completions: list[str], answer: list[str], **kwargs) -> list[float | None]

``None`` means "not applicable to this sample" (TRL's convention); the scorer treats it as NaN and leaves
it out of the weighted total. Extra dataset columns and per-function options arrive as ``kwargs``.
"""

from __future__ import annotations

import ast
import math
import re
import threading
from collections import Counter
from collections.abc import Callable

RewardFn = Callable[..., list]
REWARDS: dict[str, RewardFn] = {}


def register_reward(name: str) -> Callable[[RewardFn], RewardFn]:
    """Decorator adding a reward function to ``REWARDS`` under ``name``."""

    def decorator(fn: RewardFn) -> RewardFn:
        if name in REWARDS:
            raise ValueError(f"reward {name!r} is already registered")
        REWARDS[name] = fn
        return fn

    return decorator


def completion_text(completion) -> str:
    """The text of a completion: a string as it is, or the last message's content of a conversational
    completion (TRL passes those as ``[{"role": "assistant", "content": ...}]``)."""
    if isinstance(completion, list) and completion and isinstance(completion[-1], dict):
        return str(completion[-1].get("content", ""))
    return str(completion)


def prompt_text(prompt) -> str:
    """The text of a prompt: a string as it is, or the last message's content of a conversation (TRL passes
    conversational prompts as ``[{"role": ..., "content": ...}, ...]``)."""
    return completion_text(prompt)


@register_reward("exact_match")
def exact_match(prompts, completions, answer, strip: bool = True, **kwargs) -> list[float]:
    """1.0 when the completion equals the answer (both stripped of surrounding whitespace), else 0.0."""
    out = []
    for completion, ref in zip(completions, answer):
        c, r = completion_text(completion), str(ref)
        if strip:
            c, r = c.strip(), r.strip()
        out.append(1.0 if c == r else 0.0)
    return out


_NUMBER = re.compile(r"[-+]?(?:\d[\d,]*\.?\d*|\.\d+)(?:[eE][-+]?\d+)?")


def parse_number(text: str, which: str = "last") -> float | None:
    """The first or last number in ``text`` (``1,234.5`` -> 1234.5, ``-3`` -> -3.0), or None."""
    matches = _NUMBER.findall(text)
    if not matches:
        return None
    token = (matches[-1] if which == "last" else matches[0]).replace(",", "")
    try:
        return float(token)
    except ValueError:
        return None


@register_reward("numeric_match")
def numeric_match(
    prompts,
    completions,
    answer,
    which: str = "last",
    abs_tol: float = 1e-6,
    rel_tol: float = 1e-9,
    **kwargs,
) -> list[float | None]:
    """1.0 when the first/last number of the completion equals the numeric answer within tolerance.

    ``|pred − ref| ≤ max(abs_tol, rel_tol·|ref|)``; 0.0 when the completion has no number; None when the
    answer itself is not a number (the sample is not applicable).
    """
    if which not in ("first", "last"):
        raise ValueError(f"numeric_match: which={which!r} must be 'first' or 'last'")
    out: list[float | None] = []
    for completion, ref in zip(completions, answer):
        ref_value = parse_number(str(ref), which="last")
        if ref_value is None:
            out.append(None)
            continue
        pred = parse_number(completion_text(completion), which=which)
        ok = pred is not None and math.isclose(pred, ref_value, rel_tol=rel_tol, abs_tol=abs_tol)
        out.append(1.0 if ok else 0.0)
    return out


@register_reward("math")
def math_answer(prompts, completions, answer, timeout_seconds: int | None = 5, **kwargs) -> list[float]:
    """1.0 when ``math-verify`` judges the completion's final answer equal to the reference (LaTeX,
    ``\\boxed{}``, fractions, sets...), else 0.0. Needs ``pip install 'lmpo[math]'``.

    math-verify implements its timeouts with ``signal.alarm``, which only works in the main thread, so
    they are switched off when called from another thread (e.g. a data-loader worker).
    """
    try:
        from math_verify import parse, verify
    except ImportError as e:
        raise ImportError(
            "the 'math' reward needs the math-verify package: pip install 'lmpo[math]' "
            "(or use 'numeric_match' for plain numbers)"
        ) from e
    if threading.current_thread() is not threading.main_thread():
        timeout_seconds = None
    out = []
    for completion, ref in zip(completions, answer):
        ref_text = str(ref)
        # math-verify extracts LaTeX answers from $...$ or \boxed{}; a bare "42" / "1/2" parses as an expression.
        gold = parse(
            ref_text if "$" in ref_text or "\\" in ref_text else f"${ref_text}$",
            parsing_timeout=timeout_seconds,
        )
        pred = parse(completion_text(completion), parsing_timeout=timeout_seconds)
        ok = bool(gold) and bool(pred) and verify(gold, pred, timeout_seconds=timeout_seconds)
        out.append(1.0 if ok else 0.0)
    return out


@register_reward("format")
def format_reward(
    prompts, completions, answer=None, pattern: str | None = None, mode: str = "fullmatch", **kwargs
) -> list[float]:
    """1.0 when the completion matches the regular expression ``pattern`` (``mode``: fullmatch, match or
    search; flags ``re.DOTALL``), else 0.0. Example: ``pattern=r"<think>.*</think>\\s*<answer>.*</answer>"``.
    """
    if pattern is None:
        raise ValueError("the 'format' reward needs a regular expression: kwargs: {pattern: '...'}")
    if mode not in ("fullmatch", "match", "search"):
        raise ValueError(f"format reward: mode={mode!r} must be fullmatch, match or search")
    regex = re.compile(pattern, re.DOTALL)
    matcher = getattr(regex, mode)
    return [1.0 if matcher(completion_text(c)) else 0.0 for c in completions]


@register_reward("length_penalty")
def length_penalty(
    prompts, completions, answer=None, target_chars: int = 0, scale_chars: float = 100.0, **kwargs
) -> list[float]:
    """``−max(0, len(completion) − target_chars) / scale_chars``: zero up to the target length, then linear.

    Lengths are in characters (reward functions see text, not token ids).
    """
    if scale_chars <= 0:
        raise ValueError(f"length_penalty: scale_chars={scale_chars} must be > 0")
    return [-max(0, len(completion_text(c)) - target_chars) / scale_chars for c in completions]


_COUNTDOWN_PROMPT = re.compile(r"((?:-?\d+\s+)*-?\d+)\s*>\s*(-?\d+)\s*:")
_ALLOWED_NODES = (ast.Expression, ast.BinOp, ast.UnaryOp, ast.Constant, ast.Add, ast.Sub, ast.Mult, ast.USub)


def _safe_eval(expr: str) -> tuple[float, list[int]] | None:
    """Value and integer literals of an arithmetic expression over ``+ - *`` and parentheses, or None."""
    if not expr or len(expr) > 200 or not re.fullmatch(r"[\d\s+\-*()]+", expr):
        return None
    try:
        tree = ast.parse(expr, mode="eval")
    except SyntaxError:
        return None
    if not all(isinstance(node, _ALLOWED_NODES) for node in ast.walk(tree)):
        return None
    literals = [n.value for n in ast.walk(tree) if isinstance(n, ast.Constant)]
    if not all(isinstance(v, int) for v in literals):
        return None
    try:
        value = eval(compile(tree, "<countdown>", "eval"), {"__builtins__": {}}, {})  # nodes checked above
    except (ArithmeticError, ValueError):
        return None
    return value, literals


@register_reward("countdown")
def countdown(prompts, completions, answer, **kwargs) -> list[float | None]:
    """1.0 when the completion is an expression over the prompt's numbers (each used at most once,
    ``+ - *`` and parentheses) whose value is the target; prompts look like ``"3 5 7>22:"``.
    None when the prompt is not of that form.
    """
    out: list[float | None] = []
    for prompt, completion, ref in zip(prompts, completions, answer):
        m = _COUNTDOWN_PROMPT.search(prompt_text(prompt))
        if m is None:
            out.append(None)
            continue
        numbers = Counter(int(x) for x in m.group(1).split())
        target = int(ref) if str(ref).strip().lstrip("-").isdigit() else int(m.group(2))
        parsed = _safe_eval(completion_text(completion).strip())
        ok = parsed is not None and parsed[0] == target and not (Counter(parsed[1]) - numbers)
        out.append(1.0 if ok else 0.0)
    return out
