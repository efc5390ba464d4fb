"""A built-in task whose completions have a thinking part and an answer part (RLVCR, docs/rlvcr.md).

``thinking_addition``: prompt ``"57+68="``, answer ``"125"``, reference completion
``"<think>7+8=15 5+6+1=12</think>125"``.
The scratchpad adds column by column from the right (``da+db[+carry]=sum``), so its length grows with the
number of digits (1 digit: 5–6 characters, 2 digits: 11–14, 3 digits: 17–22) and RLVCR's thinking levels
have something to choose between. The reward functions read only what follows ``</think>``.

Rewards (registered in ``lmpo.rewards.REWARDS``):

- ``thinking_answer``: 1.0 when the completion has one ``<think>…</think>`` block and the text after it
  equals the reference's text after its block (or the whole reference when it has none), else 0.0;
- ``thinking_format``: 1.0 when the completion is exactly ``<think>…</think>answer`` (one block, a non-empty
  answer, no stray tags), else 0.0.
"""

from __future__ import annotations

import random
import re

from lmpo.rewards.builtin import completion_text, register_reward
from lmpo.tasks.base import Example, register_task
from lmpo.tasks.synthetic import AdditionTask

THINK_OPEN = "<think>"
THINK_CLOSE = "</think>"


def addition_scratchpad(a: int, b: int) -> str:
    """Column-by-column addition from the right: ``addition_scratchpad(57, 68) == "7+8=15 5+6+1=12"``."""
    if a < 0 or b < 0:
        raise ValueError(f"addition_scratchpad needs non-negative operands, got {a} and {b}")
    steps = []
    carry = 0
    while True:
        da, db = a % 10, b % 10
        total = da + db + carry
        steps.append(f"{da}+{db}" + (f"+{carry}" if carry else "") + f"={total}")
        carry = total // 10
        a, b = a // 10, b // 10
        if a == 0 and b == 0:
            break
    return " ".join(steps)


def split_thinking(text: str, think_open: str = THINK_OPEN, think_close: str = THINK_CLOSE
                   ) -> tuple[str, str] | None:
    """``"<think>x</think>y"`` -> ``("x", "y")``; None unless the text holds exactly one well-formed block
    at its start (leading whitespace allowed)."""
    stripped = text.lstrip()
    if not stripped.startswith(think_open):
        return None
    rest = stripped[len(think_open):]
    end = rest.find(think_close)
    if end < 0:
        return None
    thinking, action = rest[:end], rest[end + len(think_close):]
    if think_open in thinking or think_open in action or think_close in action:
        return None
    return thinking, action


@register_reward("thinking_answer")
def thinking_answer(prompts, completions, answer, think_open: str = THINK_OPEN, think_close: str = THINK_CLOSE,
                    **kwargs) -> list[float]:
    """1.0 when the answer after ``</think>`` equals the reference's (both stripped), else 0.0."""
    out = []
    for completion, ref in zip(completions, answer):
        parsed = split_thinking(completion_text(completion), think_open, think_close)
        ref_parsed = split_thinking(str(ref), think_open, think_close)
        target = (ref_parsed[1] if ref_parsed is not None else str(ref)).strip()
        out.append(1.0 if parsed is not None and parsed[1].strip() == target else 0.0)
    return out


@register_reward("thinking_format")
def thinking_format(prompts, completions, answer=None, think_open: str = THINK_OPEN,
                    think_close: str = THINK_CLOSE, **kwargs) -> list[float]:
    """1.0 when the completion is ``<think>…</think>answer`` with a non-empty answer, else 0.0."""
    out = []
    for completion in completions:
        parsed = split_thinking(completion_text(completion), think_open, think_close)
        out.append(1.0 if parsed is not None and parsed[1].strip() else 0.0)
    return out


_PROMPT = re.compile(r"^(\d+)\+(\d+)=$")


@register_task("thinking_addition")
class ThinkingAdditionTask(AdditionTask):
    """Addition with a scratchpad: prompt ``"12+34="``, answer ``"46"``, reference completion
    ``"<think>2+4=6 1+3=4</think>46"`` (what the supervised warm-up teaches).

    ``meta`` keeps ``a``, ``b`` and the scratchpad (``thinking``).

    Args:
        min_digits, max_digits: operand digit counts (1 ≤ min ≤ max ≤ 9); default 1..2.
        num_train, num_eval, eval_seed: as for ``addition``.
    """

    name = "thinking_addition"
    default_rewards = (("thinking_answer", 1.0),)
    accuracy_reward = "thinking_answer"

    def _sample(self, rng: random.Random) -> Example:
        a, b = self._number(rng), self._number(rng)
        thinking = addition_scratchpad(a, b)
        return Example(prompt=f"{a}+{b}=", answer=str(a + b), meta={"a": a, "b": b, "thinking": thinking})

    def reference_completion(self, example: Example) -> str:
        return f"{THINK_OPEN}{example.meta['thinking']}{THINK_CLOSE}{example.answer}"

    def describe(self) -> str:
        return f"addition of {self.min_digits}-{self.max_digits} digit numbers with a <think> scratchpad"
