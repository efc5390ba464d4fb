"""Built-in synthetic tasks with verifiable answers, short enough for the character-level tiny model.

Each generator is deterministic given its seed. The held-out split is drawn with ``eval_seed``, and the
training pool rejects every prompt that appears in it, so the two never overlap whatever the seed.
"""

from __future__ import annotations

import random
import string

from lmpo.tasks.base import Example, Task, register_task


class GeneratedTask(Task):
    """A task drawn from a generator: subclasses give ``_sample(rng) -> Example`` and ``_space_size()``; the
    eval split is drawn first and the train pool excludes its prompts (also the base of ``lmpo.envs``' tasks)."""

    def __init__(self, num_train: int, num_eval: int, eval_seed: int) -> None:
        if num_train < 1 or num_eval < 1:
            raise ValueError(f"num_train={num_train} and num_eval={num_eval} must both be >= 1")
        self.num_train = num_train
        self.num_eval = num_eval
        self.eval_seed = eval_seed
        self._eval_cache: list[Example] | None = None

    def _sample(self, rng: random.Random) -> Example:
        raise NotImplementedError

    def _space_size(self) -> int:
        raise NotImplementedError

    def eval_examples(self) -> list[Example]:
        if self._eval_cache is None:
            if self.num_eval > self._space_size() // 2:
                raise ValueError(
                    f"{self.name}: num_eval={self.num_eval} is more than half of the "
                    f"{self._space_size()} distinct prompts; lower num_eval or widen the task"
                )
            rng = random.Random(f"{self.name}-eval-{self.eval_seed}")
            seen: set[str] = set()
            examples: list[Example] = []
            while len(examples) < self.num_eval:
                ex = self._sample(rng)
                if ex.prompt not in seen:  # distinct eval prompts: accuracy is over num_eval problems
                    seen.add(ex.prompt)
                    examples.append(ex)
            self._eval_cache = examples
        return list(self._eval_cache)

    def train_examples(self, seed: int = 0) -> list[Example]:
        held_out = {ex.prompt for ex in self.eval_examples()}
        rng = random.Random(f"{self.name}-train-{seed}")
        examples: list[Example] = []
        while len(examples) < self.num_train:
            ex = self._sample(rng)
            if ex.prompt not in held_out:
                examples.append(ex)
        return examples


@register_task("addition")
class AdditionTask(GeneratedTask):
    """Multi-digit addition: prompt ``"12+345="``, answer ``"357"``.

    Operands have ``min_digits``..``max_digits`` digits (digit count drawn uniformly, then the number),
    so short and long operands are equally frequent.

    Args:
        min_digits, max_digits: operand digit counts (1 ≤ min ≤ max ≤ 9).
        num_train: size of the training pool (drawn with replacement from the non-held-out prompts).
        num_eval: size of the held-out split (distinct prompts).
        eval_seed: seed of the held-out split (keep it fixed across runs to compare accuracies).
    """

    name = "addition"
    default_rewards = (("exact_match", 1.0),)
    accuracy_reward = "exact_match"

    def __init__(
        self,
        min_digits: int = 1,
        max_digits: int = 2,
        num_train: int = 10_000,
        num_eval: int = 200,
        eval_seed: int = 1234,
    ) -> None:
        if not 1 <= min_digits <= max_digits <= 9:
            raise ValueError(
                f"addition needs 1 <= min_digits <= max_digits <= 9, got min_digits={min_digits}, "
                f"max_digits={max_digits}"
            )
        self.min_digits = min_digits
        self.max_digits = max_digits
        super().__init__(num_train, num_eval, eval_seed)

    def _number(self, rng: random.Random) -> int:
        digits = rng.randint(self.min_digits, self.max_digits)
        low = 0 if digits == 1 else 10 ** (digits - 1)
        return rng.randint(low, 10**digits - 1)

    def _sample(self, rng: random.Random) -> Example:
        a, b = self._number(rng), self._number(rng)
        return Example(prompt=f"{a}+{b}=", answer=str(a + b), meta={"a": a, "b": b})

    def _space_size(self) -> int:
        low = 0 if self.min_digits == 1 else 10 ** (self.min_digits - 1)
        return (10**self.max_digits - low) ** 2

    def describe(self) -> str:
        return f"addition of {self.min_digits}-{self.max_digits} digit numbers"


@register_task("reversal")
class ReversalTask(GeneratedTask):
    """String reversal: prompt ``"rev abcd="``, answer ``"dcba"``.

    Args:
        min_length, max_length: string lengths (1 ≤ min ≤ max ≤ 32).
        alphabet: characters to draw from (default: lowercase letters).
        num_train, num_eval, eval_seed: as for ``addition``.
    """

    name = "reversal"
    default_rewards = (("exact_match", 1.0),)
    accuracy_reward = "exact_match"

    def __init__(
        self,
        min_length: int = 3,
        max_length: int = 6,
        alphabet: str = string.ascii_lowercase,
        num_train: int = 10_000,
        num_eval: int = 200,
        eval_seed: int = 1234,
    ) -> None:
        if not 1 <= min_length <= max_length <= 32:
            raise ValueError(
                f"reversal needs 1 <= min_length <= max_length <= 32, got min_length={min_length}, "
                f"max_length={max_length}"
            )
        if len(set(alphabet)) < 2:
            raise ValueError(f"reversal alphabet {alphabet!r} needs at least 2 distinct characters")
        self.min_length = min_length
        self.max_length = max_length
        self.alphabet = alphabet
        super().__init__(num_train, num_eval, eval_seed)

    def _sample(self, rng: random.Random) -> Example:
        length = rng.randint(self.min_length, self.max_length)
        s = "".join(rng.choice(self.alphabet) for _ in range(length))
        return Example(prompt=f"rev {s}=", answer=s[::-1], meta={"text": s})

    def _space_size(self) -> int:
        k = len(set(self.alphabet))
        return sum(k**n for n in range(self.min_length, self.max_length + 1))

    def describe(self) -> str:
        return f"reversal of {self.min_length}-{self.max_length} character strings"


@register_task("countdown")
class CountdownTask(GeneratedTask):
    """Countdown-style arithmetic: reach a target with the given numbers, each used at most once.

    Prompt ``"3 5 7>22:"``; any expression over those numbers with ``+ - *`` and parentheses that
    evaluates to the target is correct (answer column holds the target; one solution is in
    ``meta["solution"]``). Scored by the ``countdown`` reward.

    Args:
        num_numbers: how many numbers are given (2..4).
        max_number: numbers are drawn from 1..max_number.
        num_train, num_eval, eval_seed: as for ``addition``.
    """

    name = "countdown"
    default_rewards = (("countdown", 1.0),)
    accuracy_reward = "countdown"

    def __init__(
        self,
        num_numbers: int = 3,
        max_number: int = 9,
        num_train: int = 10_000,
        num_eval: int = 200,
        eval_seed: int = 1234,
    ) -> None:
        if not 2 <= num_numbers <= 4:
            raise ValueError(f"countdown needs 2 <= num_numbers <= 4, got {num_numbers}")
        if not 2 <= max_number <= 99:
            raise ValueError(f"countdown needs 2 <= max_number <= 99, got {max_number}")
        self.num_numbers = num_numbers
        self.max_number = max_number
        super().__init__(num_train, num_eval, eval_seed)

    def _sample(self, rng: random.Random) -> Example:
        numbers = [rng.randint(1, self.max_number) for _ in range(self.num_numbers)]
        # The target is built from a random expression over a random ordering, so it is always reachable.
        order = numbers[:]
        rng.shuffle(order)
        expr = str(order[0])
        value = order[0]
        for n in order[1:]:
            op = rng.choice("+-*")
            if op == "*" and ("+" in expr or "-" in expr):
                expr = f"({expr})"
            expr = f"{expr}{op}{n}"
            value = value + n if op == "+" else value - n if op == "-" else value * n
        prompt = " ".join(map(str, numbers)) + f">{value}:"
        return Example(prompt=prompt, answer=str(value), meta={"numbers": numbers, "solution": expr})

    def reference_completion(self, example: Example) -> str:
        return example.meta["solution"]

    def _space_size(self) -> int:
        return self.max_number**self.num_numbers  # a lower bound on distinct prompts (targets vary too)

    def describe(self) -> str:
        return f"countdown with {self.num_numbers} numbers in 1..{self.max_number}"
