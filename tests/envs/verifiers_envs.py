"""Two environments written with verifiers' own classes (``vf.MultiTurnEnv``, ``vf.ToolEnv``, ``vf.Rubric``), as a
verifiers user writes them, for tests/envs/test_verifiers.py (importable as ``verifiers_envs:load_…``)."""

from __future__ import annotations

import random
import re

import verifiers as vf
from datasets import Dataset

HIGH = 16


class HigherLowerEnv(vf.MultiTurnEnv):
    """Guess a number in 1..16; the environment answers Higher / Lower, and ends the game when it is found."""

    async def env_response(self, messages: vf.Messages, state: vf.State, **kwargs) -> vf.Messages:
        numbers = re.findall(r"\d+", str(messages[-1].content or ""))
        if not numbers:
            return [vf.UserMessage(content="Say a number.")]
        guess, secret = int(numbers[-1]), int(state["answer"])
        if guess == secret:
            state["final_env_response"] = [vf.UserMessage(content="Correct!")]
            return state["final_env_response"]
        return [vf.UserMessage(content="Higher." if guess < secret else "Lower.")]


def found(completion, answer, **kwargs) -> float:
    """1.0 when some assistant turn named the secret number."""
    return float(any(m.role == "assistant" and re.findall(r"\d+", str(m.content or ""))[-1:] == [answer]
                     for m in completion))


def turns_used(completion, **kwargs) -> float:
    return float(sum(m.role == "assistant" for m in completion))


def load_higher_lower(num_rows: int = 40, max_turns: int = 5, group_reward: bool = False) -> vf.Environment:
    rng = random.Random(0)
    rows = [{"question": f"Game {i}: guess my number between 1 and {HIGH}.", "answer": str(rng.randint(1, HIGH))}
            for i in range(num_rows)]
    rubric = vf.Rubric(funcs=[found, turns_used], weights=[1.0, -0.1])
    if group_reward:
        async def best_of_group(completions, answers, **kwargs) -> list[float]:
            return [1.0] * len(completions)

        rubric.add_reward_func(best_of_group)
    return HigherLowerEnv(dataset=Dataset.from_list(rows[num_rows // 4:]), eval_dataset=Dataset.from_list(rows[: num_rows // 4]),
                          system_prompt="Answer with one number.", rubric=rubric, max_turns=max_turns)


def add(a: int, b: int) -> int:
    """Add two integers.

    Args:
        a: the first integer.
        b: the second integer.
    """
    return a + b


def answered(completion, answer, **kwargs) -> float:
    """1.0 when the last assistant message is the answer."""
    last = [m for m in completion if m.role == "assistant"][-1]
    return float(str(last.content or "").strip() == answer)


def load_adder(num_rows: int = 20) -> vf.Environment:
    rng = random.Random(1)
    pairs = [(rng.randint(100, 999), rng.randint(100, 999)) for _ in range(num_rows)]
    rows = [{"question": f"What is {a} + {b}? Use the add tool, then answer with the number.", "answer": str(a + b)}
            for a, b in pairs]
    return vf.ToolEnv(dataset=Dataset.from_list(rows[5:]), eval_dataset=Dataset.from_list(rows[:5]), tools=[add],
                      rubric=vf.Rubric(funcs=[answered]), max_turns=3)
