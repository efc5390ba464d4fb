"""``ToolArithmetic-v0``: arithmetic too long to do in one's head, with a calculator to call."""

from __future__ import annotations

import math
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
    ``info["correct"]`` says whether the answer was right (success is judged on it alone, shaping or not).

    Shaped rewards, off by default (each a constructor option, so ``env.options`` of a training config):
    ``valid_call_reward`` is added once per episode, on the first tool turn whose calculator call returns a number
    (any expression: the step of calling the tool at all, for a policy that rarely calls it and never copies
    right); ``call_reward`` is added once per episode, on the first tool turn whose calculator output equals the
    expression's value (the expression was copied into the call correctly); ``tool_answer_reward`` is added to
    the final answer when its number equals the output of the episode's last calculator call (the tool's result
    copied into the answer, right or wrong). They split the sparse 0/1 outcome into its two copying steps, so
    that a group of episodes that all failed can still differ; the right answer after a right call always
    earns the most (1 + ``call_reward`` + ``tool_answer_reward``). ``info["right_call"]`` and
    ``info["used_tool_output"]`` say when each was earned.

    ## Episode End
    Terminated at the final answer. Truncated when ``max_turns`` turns pass without an answer (reward 0).

    ## Version
    v0: first version (the shaped rewards are options of v0: off, they leave its rewards unchanged).

    ``expert_action()`` calls the calculator on the example's ``meta["expression"]``, then answers; with
    ``expert="memory"`` it answers at once with the right number (demonstrations of a second behaviour, for a
    warm-up that leaves the choice to call the tool to the policy).

    Args:
        max_turns: turns (tool turns and the answer) before the episode is truncated.
        valid_call_reward: shaped reward for a calculator call that returns a number, any value (0: off).
        call_reward: shaped reward for calling the calculator on an expression with the right value (0: off).
        tool_answer_reward: shaped reward for answering with the last calculator output (0: off).
        expert: what ``expert_action()`` demonstrates: ``"calculator"`` (call it, then answer) or ``"memory"``
            (answer at once). It changes no reward or observation.
        task_options: options of ``ToolArithmeticTask`` for the problems ``reset(None)`` draws.
    """

    def __init__(self, max_turns: int = 4, call_reward: float = 0.0, tool_answer_reward: float = 0.0,
                 expert: str = "calculator", valid_call_reward: float = 0.0, **task_options) -> None:
        if max_turns < 1:
            raise ValueError(f"max_turns={max_turns} must be >= 1")
        if expert not in ("calculator", "memory"):
            raise ValueError(f"expert={expert!r} must be 'calculator' (call the tool, then answer) or 'memory' "
                             "(answer at once)")
        self.expert = expert
        for name, value in (("call_reward", call_reward), ("tool_answer_reward", tool_answer_reward),
                            ("valid_call_reward", valid_call_reward)):
            if not (isinstance(value, (int, float)) and math.isfinite(value) and 0 <= value <= 1):
                raise ValueError(f"{name}={value!r} must be a number in [0, 1] (a fraction of the answer's reward "
                                 "1.0, so that the right answer stays the best outcome); use 0 to turn it off")
        super().__init__([calculator_tool()])
        self.max_turns = max_turns
        self.call_reward, self.tool_answer_reward = float(call_reward), float(tool_answer_reward)
        self.valid_call_reward = float(valid_call_reward)
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
        self._last_output: int | None = None  # the last calculator output that is a number (None: no call gave one)
        self._right_call = False
        self._expression = example.meta.get("expression")
        messages = example.messages or [{"role": "user", "content": example.prompt}]
        return [dict(m) for m in messages], {"answer": example.answer}

    def step(self, action: str) -> StepResult:
        if self._answer is None:
            raise RuntimeError(f"{self.env_id}: step() called before reset() or after the episode ended")
        self._turns += 1
        result = super().step(action)
        self._called = self._called or result.info["tool_calls"] - result.info["tool_errors"] > 0
        if result.observation:
            result = self._shape_tool_turn(result)
        if not result.terminated and self._turns >= self.max_turns:
            result = result._replace(truncated=True)
        if result.terminated or result.truncated:
            self._answer = None
        return result

    def _shape_tool_turn(self, result: StepResult) -> StepResult:
        """Record the turn's numeric calculator outputs; ``valid_call_reward`` for the episode's first numeric
        output, ``call_reward`` for its first right one."""
        values = [int(m["content"]) for m in result.observation
                  if m.get("name") == "calculator" and _NUMBER.fullmatch(m["content"].strip())]
        if not values:
            return result
        first = self._last_output is None
        self._last_output = values[-1]
        right = not self._right_call and int(self._answer) in values
        self._right_call = self._right_call or right
        reward = result.reward + (self.call_reward if right else 0.0) + (self.valid_call_reward if first else 0.0)
        return result._replace(reward=reward, info={**result.info, "right_call": right})

    def expert_action(self) -> str:
        """Call the calculator on the expression, then answer with its value."""
        if self._answer is None:
            raise RuntimeError(f"{self.env_id}: no episode is running")
        if self._called or self._expression is None or self.expert == "memory":
            return self._answer
        return format_tool_call("calculator", {"expression": self._expression})

    def answer(self, text: str) -> StepResult:
        numbers = _NUMBER.findall(strip_thinking(text))
        given = numbers[-1] if numbers else None
        correct = given is not None and int(given) == int(self._answer)
        used = given is not None and self._last_output is not None and int(given) == self._last_output
        reward = (1.0 if correct else 0.0) + (self.tool_answer_reward if used else 0.0)
        return StepResult([], reward, True, False, {"correct": correct, "given": given, "used_tool_output": used})
