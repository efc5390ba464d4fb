"""``ToolArithmetic-v0``: arithmetic too long to do in one's head, with a calculator to call."""

from __future__ import annotations

import random
import re

from lmpo.envs.base import Message, StepResult, register_env, strip_thinking
from lmpo.envs.tool_env import ToolEnv
from lmpo.envs.tools.calculator import calculator_tool
from lmpo.envs.tools.parser import format_tool_call
from lmpo.tasks.base import Example
from lmpo.tasks.synthetic import GeneratedTask

_NUMBER = re.compile(r"-?\d+")


class ToolArithmeticTask(GeneratedTask):
    """Problems ``a op b`` with ``a`` of ``left_digits`` digits and ``b`` of ``right_digits`` digits.

    The example's ``messages`` are the opening user message (``"What is 347*29?"``), ``answer`` the value and
    ``meta["expression"]`` the expression (what a demonstration passes to the calculator).
    """

    name = "tool_arithmetic"

    def __init__(self, left_digits: int = 3, right_digits: int = 2, operations: str = "*",
                 num_train: int = 10_000, num_eval: int = 200, eval_seed: int = 1234) -> None:
        if not (1 <= left_digits <= 9 and 1 <= right_digits <= 9):
            raise ValueError(f"left_digits={left_digits} and right_digits={right_digits} must be in 1..9")
        if not operations or set(operations) - set("+-*"):
            raise ValueError(f"operations={operations!r} must be a non-empty string over '+-*'")
        self.left_digits, self.right_digits, self.operations = left_digits, right_digits, operations
        super().__init__(num_train, num_eval, eval_seed)

    @staticmethod
    def _number(rng: random.Random, digits: int) -> int:
        return rng.randint(0 if digits == 1 else 10 ** (digits - 1), 10**digits - 1)

    def _sample(self, rng: random.Random) -> Example:
        a, b = self._number(rng, self.left_digits), self._number(rng, self.right_digits)
        op = rng.choice(self.operations)
        expression = f"{a}{op}{b}"
        value = a + b if op == "+" else a - b if op == "-" else a * b
        question = f"What is {expression}?"
        return Example(prompt=question, answer=str(value), meta={"expression": expression},
                       messages=[{"role": "user", "content": question}])

    def _space_size(self) -> int:
        def count(d: int) -> int:
            return 10**d - (0 if d == 1 else 10 ** (d - 1))
        return count(self.left_digits) * count(self.right_digits) * len(set(self.operations))

    def describe(self) -> str:
        return f"{self.left_digits}- and {self.right_digits}-digit arithmetic ({self.operations}) with a calculator"


@register_env("ToolArithmetic-v0", task=ToolArithmeticTask)
class ToolArithmeticEnv(ToolEnv):
    """Answer an arithmetic question, calling a calculator for the computation.

    ## Description
    The user asks for the value of an expression such as ``347*29``, too long for a small model to compute in
    its head. The assistant may call the ``calculator`` tool (Hermes/Qwen format,
    ``<tool_call>{"name": "calculator", "arguments": {"expression": "347*29"}}</tool_call>``) and then answers.
    Examples come from ``ToolArithmeticTask`` (``make_env_task("ToolArithmetic-v0")``); ``reset(None)`` draws
    one from the environment's own generator.

    ## Observations
    The opening is one user message, ``What is <expression>?``. After a turn with tool calls, one ``tool``
    message per call with the calculator's output or an error text.

    ## Actions
    Any text. A turn containing ``<tool_call>`` blocks is a tool turn; any other turn is the final answer, read
    as the last integer it contains after any ``</think>``.

    ## Rewards
    1.0 when the final answer equals the expression's value, 0.0 otherwise; tool turns earn 0.0.
    ``info["correct"]`` says whether the answer was right.

    ## Episode End
    Terminated at the final answer. Truncated when ``max_turns`` turns pass without an answer (reward 0).

    ## Version
    v0: first version.

    ``expert_action()`` calls the calculator on the example's ``meta["expression"]``, then answers.

    Args:
        max_turns: turns (tool turns and the answer) before the episode is truncated.
        task_options: options of ``ToolArithmeticTask`` for the problems ``reset(None)`` draws.
    """

    def __init__(self, max_turns: int = 4, **task_options) -> None:
        if max_turns < 1:
            raise ValueError(f"max_turns={max_turns} must be >= 1")
        super().__init__([calculator_tool()])
        self.max_turns = max_turns
        self._task = ToolArithmeticTask(**{"num_train": 1, "num_eval": 1, **task_options})
        self._answer: str | None = None
        self._turns = 0

    def reset(self, example: Example | None = None, seed: int | None = None) -> tuple[list[Message], dict]:
        super().reset(example, seed)
        if example is None:
            example = self._task._sample(random.Random(int(self.np_random.integers(2**62))))
        if not (example.answer.lstrip("-").isdigit() and (example.messages or example.prompt)):
            raise ValueError(f"{self.env_id}: example needs an integer answer and a question, got {example!r}")
        self._answer, self._turns, self._called = example.answer, 0, False
        self._expression = example.meta.get("expression")
        messages = example.messages or [{"role": "user", "content": example.prompt}]
        return [dict(m) for m in messages], {"answer": example.answer}

    def step(self, action: str) -> StepResult:
        if self._answer is None:
            raise RuntimeError(f"{self.env_id}: step() called before reset() or after the episode ended")
        self._turns += 1
        result = super().step(action)
        self._called = self._called or result.info["tool_calls"] - result.info["tool_errors"] > 0
        if not result.terminated and self._turns >= self.max_turns:
            result = result._replace(truncated=True)
        if result.terminated or result.truncated:
            self._answer = None
        return result

    def expert_action(self) -> str:
        """Call the calculator on the expression, then answer with its value."""
        if self._answer is None:
            raise RuntimeError(f"{self.env_id}: no episode is running")
        if self._called or self._expression is None:
            return self._answer
        return format_tool_call("calculator", {"expression": self._expression})

    def answer(self, text: str) -> StepResult:
        numbers = _NUMBER.findall(strip_thinking(text))
        given = numbers[-1] if numbers else None
        correct = given is not None and int(given) == int(self._answer)
        return StepResult([], 1.0 if correct else 0.0, True, False, {"correct": correct, "given": given})
