"""``GuessNumber-v0``: find a secret number from higher / lower feedback."""

from __future__ import annotations

import random
import re

from lmpo.envs.base import LMEnv, Message, StepResult, register_env, strip_thinking
from lmpo.tasks.base import Example, Task

_NUMBER = re.compile(r"-?\d+")


class GuessNumberTask(Task):
    """Secrets drawn uniformly from ``low..high``; the held-out split is every secret once (the prompt is the
    same for all secrets, so train and held-out differ only in the secret)."""

    name = "guess_number"

    def __init__(self, low: int = 1, high: int = 16, num_train: int = 10_000) -> None:
        if not low < high:
            raise ValueError(f"low={low} must be below high={high}")
        if num_train < 1:
            raise ValueError(f"num_train={num_train} must be >= 1")
        self.low, self.high, self.num_train = low, high, num_train

    def question(self) -> str:
        return f"Guess my number from {self.low} to {self.high}. Reply with one number."

    def example(self, secret: int) -> Example:
        question = self.question()
        return Example(prompt=question, answer=str(secret), meta={"secret": secret, "low": self.low, "high": self.high},
                       messages=[{"role": "user", "content": question}])

    def train_examples(self, seed: int = 0) -> list[Example]:
        rng = random.Random(f"{self.name}-train-{seed}")
        return [self.example(rng.randint(self.low, self.high)) for _ in range(self.num_train)]

    def eval_examples(self) -> list[Example]:
        return [self.example(s) for s in range(self.low, self.high + 1)]

    def describe(self) -> str:
        return f"guess a number from {self.low} to {self.high} with higher/lower feedback"


@register_env("GuessNumber-v0", task=GuessNumberTask)
class GuessNumberEnv(LMEnv):
    """Guess a secret number; after each wrong guess the user says whether it is higher or lower.

    ## Description
    The classic bisection game. With ``low..high`` = 1..16, a policy that halves the interval always wins within
    ``ceil(log2(16)) + 1 = 5`` guesses. Examples come from ``GuessNumberTask`` (``meta["secret"]``);
    ``reset(None)`` draws the secret from the environment's own generator.

    ## Observations
    The opening is one user message, ``Guess my number from <low> to <high>. Reply with one number.``. After a
    wrong guess one user message: ``Higher.`` or ``Lower.``; after a turn without a number in range,
    ``Reply with one number from <low> to <high>.``.

    ## Actions
    Any text; the guess is the last integer in it after any ``</think>``.

    ## Rewards
    1.0 for the correct guess; ``-turn_penalty`` for every other turn (0 by default, so the return is 1 for a
    won game and 0 for a lost one). ``info["correct"]``, ``info["guess"]`` and ``info["valid"]`` describe the turn.

    ## Episode End
    Terminated at the correct guess (won) or when ``max_guesses`` turns are used (lost: the game is over, which
    is a terminal state of the task, not a time limit).

    ## Version
    v0: first version.

    ``expert_action()`` bisects the interval that the feedback so far allows.

    Args:
        low, high: the range of secrets (used when ``reset(None)``; an example carries its own).
        max_guesses: turns (valid or not) before the game is lost.
        turn_penalty: reward subtracted for each turn that is not the correct guess.
    """

    def __init__(self, low: int = 1, high: int = 16, max_guesses: int = 6, turn_penalty: float = 0.0) -> None:
        super().__init__()
        if not low < high or max_guesses < 1 or turn_penalty < 0:
            raise ValueError(f"GuessNumber needs low < high, max_guesses >= 1 and turn_penalty >= 0, got low={low}, "
                             f"high={high}, max_guesses={max_guesses}, turn_penalty={turn_penalty}")
        self.low, self.high, self.max_guesses, self.turn_penalty = low, high, max_guesses, turn_penalty
        self._secret: int | None = None
        self._guesses = 0

    def reset(self, example: Example | None = None, seed: int | None = None) -> tuple[list[Message], dict]:
        super().reset(example, seed)
        if example is None:
            example = GuessNumberTask(self.low, self.high, 1).example(int(self.np_random.integers(self.low, self.high + 1)))
        meta = example.meta
        if not all(isinstance(meta.get(k), int) for k in ("secret", "low", "high")):
            raise ValueError(f"{self.env_id}: example needs integer meta 'secret', 'low', 'high', got {meta!r}")
        self._secret, self._range, self._guesses = meta["secret"], (meta["low"], meta["high"]), 0
        self._bounds = self._range  # what the feedback so far allows (the expert's interval)
        messages = example.messages or [{"role": "user", "content": example.prompt}]
        return [dict(m) for m in messages], {"secret": self._secret}

    def expert_action(self) -> str:
        """Bisection: the middle of the interval the feedback so far allows."""
        if self._secret is None:
            raise RuntimeError(f"{self.env_id}: no episode is running")
        return str(sum(self._bounds) // 2)

    def step(self, action: str) -> StepResult:
        if self._secret is None:
            raise RuntimeError(f"{self.env_id}: step() called before reset() or after the episode ended")
        self._guesses += 1
        low, high = self._range
        numbers = _NUMBER.findall(strip_thinking(action))
        guess = int(numbers[-1]) if numbers else None
        valid = guess is not None and low <= guess <= high
        correct = guess == self._secret
        info = {"guess": guess, "valid": valid, "correct": correct, "guesses": self._guesses}
        if correct:
            self._secret = None
            return StepResult([], 1.0, True, False, info)
        if not valid:
            text = f"Reply with one number from {low} to {high}."
        elif guess < self._secret:
            text, self._bounds = "Higher.", (max(self._bounds[0], guess + 1), self._bounds[1])
        else:
            text, self._bounds = "Lower.", (self._bounds[0], min(self._bounds[1], guess - 1))
        lost = self._guesses >= self.max_guesses
        if lost:
            self._secret = None
        return StepResult([{"role": "user", "content": text}], -self.turn_penalty, lost, False, info)
