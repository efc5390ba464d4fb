"""reasoning-gym's procedural generators as lmpo tasks and as a multi-turn environment with feedback (optional
extra: ``pip install 'lmpo[reasoning_gym]'``).

`reasoning-gym <https://github.com/open-thought/reasoning-gym>`_ (Stojanovski et al., 2025, "REASONING GYM:
Reasoning Environments for Reinforcement Learning with Verifiable Rewards") has 100+ generators of problems with
verifiable answers, each a *dataset* (``reasoning_gym.create_dataset(name, size=…, seed=…, **config)``) whose
entries are ``{"question", "answer", "metadata"}`` and whose ``score_answer(answer, entry)`` gives a score in
[0, 1]. The adapter uses both unchanged:

- **single-turn task** ``reasoning_gym/<dataset>`` (``task.name`` in a config, ``make_task``): the prompt is the
  entry's question through ``prompt_template``; the reward is the dataset's ``score_answer`` of the completion
  (:func:`score_answer`), 1.0 counted as correct;
- **multi-turn environment** ``reasoning_gym/Feedback-v0``: a wrong answer is told so and the policy answers again,
  up to ``max_attempts`` turns (:class:`ReasoningGymEnv`).

What a completion answers: the text inside its last ``<answer>…</answer>`` when it has one (reasoning-gym's own
convention, ``reasoning_gym.utils.extract_answer``), otherwise the whole completion, stripped, after any
``</think>``.
"""

from __future__ import annotations

import difflib
import functools
import json
import random
from typing import Any

from lmpo.envs.adapters import import_extra
from lmpo.envs.base import LMEnv, Message, StepResult, register_env, strip_thinking
from lmpo.errors import InputError
from lmpo.rewards.builtin import completion_text
from lmpo.tasks.base import Example, Task

#: the meta key of an example that holds its reasoning-gym entry (a reward keyword argument: see score_answer)
META_KEY = "reasoning_gym"
#: the reward of the tasks, as an import path (a process reward pool imports it without registration)
REWARD = "lmpo.envs.adapters.reasoning_gym:score_answer"


def import_reasoning_gym():
    """The ``reasoning_gym`` module, or InputError saying how to install it."""
    return import_extra("reasoning_gym", "reasoning_gym", "reasoning-gym tasks")


@functools.lru_cache(maxsize=64)
def _scorer(dataset: str, config_json: str):
    """A dataset instance for ``score_answer`` (its configuration can matter to the score, its size does not)."""
    return import_reasoning_gym().create_dataset(dataset, size=1, seed=0, **json.loads(config_json))


def _entries(dataset: str, config: dict, size: int, seed: int) -> list[dict]:
    rg = import_reasoning_gym()
    try:
        generator = rg.create_dataset(dataset, size=size, seed=seed, **config)
    except (TypeError, AssertionError) as e:
        raise InputError(f"reasoning-gym dataset {dataset!r} rejects the config {config} ({type(e).__name__}: {e}); "
                         "give keyword options of its config class (reasoning_gym.factory.DATASETS[name][1]) "
                         "in `task.options.config`.") from e
    return [generator[i] for i in range(size)]


def extract_answer(text: str) -> str:
    """What a completion answers (see the module docstring)."""
    text = strip_thinking(text)
    answer = import_reasoning_gym().utils.extract_answer(text)
    return text.strip() if answer is None else answer


def score_entry(text: str, item: dict) -> float:
    """The dataset's ``score_answer`` of ``text`` for one example's ``meta["reasoning_gym"]``."""
    scorer = _scorer(item["dataset"], json.dumps(item["config"], sort_keys=True))
    return float(scorer.score_answer(extract_answer(text), item["entry"]))


def score_answer(prompts, completions, answer, reasoning_gym: list[dict] | None = None, **kwargs) -> list[float]:
    """Reward function of the ``reasoning_gym/<dataset>`` tasks: the dataset's own ``score_answer`` (in [0, 1]) of
    each completion's answer, given the example's entry (``meta["reasoning_gym"]``, passed as a keyword column)."""
    if reasoning_gym is None:
        raise ValueError("score_answer needs the examples' meta column 'reasoning_gym' (examples of a "
                         "reasoning_gym/<dataset> task)")
    return [score_entry(completion_text(c), item) for c, item in zip(completions, reasoning_gym)]


class ReasoningGymTask(Task):
    """``reasoning_gym/<dataset>``: one reasoning-gym generator as a task with a held-out split.

    The held-out split is the first ``num_eval`` entries of the generator seeded with ``eval_seed``; the training
    pool draws entries from other seeds and rejects every question of the held-out split, so the two never
    overlap. ``prompt_template`` is formatted with the entry's ``question`` and ``metadata`` (``"{question}"``, or
    e.g. ``"{metadata[expression]} ="`` for chain_sum, short enough for a character-level model). ``config``
    holds keyword options of the dataset's config class (difficulty ranges…).

    Args:
        dataset: a reasoning-gym dataset name (``reasoning_gym.factory.DATASETS``).
        num_train, num_eval: sizes of the training pool and of the held-out split.
        eval_seed: seed of the held-out split (keep it fixed across runs to compare accuracies).
        prompt_template: the prompt (``str.format`` with ``question`` and ``metadata``).
        config: options of the dataset's config class.
    """

    default_rewards = ((REWARD, 1.0),)
    accuracy_reward = REWARD

    def __init__(self, dataset: str = "chain_sum", num_train: int = 2000, num_eval: int = 100, eval_seed: int = 0,
                 prompt_template: str = "{question}", config: dict | None = None) -> None:
        DATASETS = import_reasoning_gym().factory.DATASETS
        if dataset not in DATASETS:
            close = difflib.get_close_matches(dataset, list(DATASETS), n=1)
            hint = f" Did you mean {close[0]!r}?" if close else ""
            raise InputError(f"reasoning-gym has no dataset {dataset!r}.{hint} Its {len(DATASETS)} datasets are the "
                             f"keys of reasoning_gym.factory.DATASETS ({', '.join(sorted(DATASETS)[:4])}, …).")
        if num_train < 1 or num_eval < 1:
            raise ValueError(f"num_train={num_train} and num_eval={num_eval} must both be >= 1")
        self.dataset, self.num_train, self.num_eval, self.eval_seed = dataset, num_train, num_eval, eval_seed
        self.prompt_template, self.config = prompt_template, dict(config or {})
        self.name = f"reasoning_gym/{dataset}"
        self._eval: list[Example] | None = None

    def example(self, entry: dict) -> Example:
        try:
            prompt = self.prompt_template.format(question=entry["question"], metadata=entry["metadata"])
        except (KeyError, IndexError, AttributeError) as e:
            raise InputError(f"{self.name}: `task.options.prompt_template` = {self.prompt_template!r} names a field "
                             "the entries lack "
                             f"({type(e).__name__}: {e}); use {{question}} and {{metadata[<key>]}} with keys of "
                             f"{sorted(entry['metadata'])}.") from e
        item = {"dataset": self.dataset, "config": self.config, "entry": entry}
        return Example(prompt=prompt, answer=str(entry["answer"]), meta={META_KEY: item})

    def eval_examples(self) -> list[Example]:
        if self._eval is None:
            self._eval = [self.example(e) for e in _entries(self.dataset, self.config, self.num_eval, self.eval_seed)]
        return list(self._eval)

    def train_examples(self, seed: int = 0) -> list[Example]:
        held_out = {e.meta[META_KEY]["entry"]["question"] for e in self.eval_examples()}
        rng = random.Random(f"{self.name}-train-{seed}")
        examples: list[Example] = []
        for _ in range(20):  # chunks from fresh seeds until the pool is full
            chunk = _entries(self.dataset, self.config, self.num_train, rng.randrange(2**31))
            examples += [self.example(e) for e in chunk if e["question"] not in held_out]
            if len(examples) >= self.num_train:
                return examples[: self.num_train]
        raise ValueError(f"{self.name}: fewer than {self.num_train} training questions outside the held-out split "
                         f"after 20 draws; lower num_train or widen the dataset's config")

    def describe(self) -> str:
        return f"{self.name} (reasoning-gym, {self.num_train} train / {self.num_eval} held-out)"


class ReasoningGymEnv(LMEnv):
    """A reasoning-gym problem answered over several turns: a wrong answer is told so, and the policy retries.

    ## Description
    Plays one entry of a reasoning-gym dataset (examples of ``ReasoningGymTask``: ``task.options`` names the
    dataset, ``{dataset: chain_sum}`` by default; ``reset(None, seed)`` draws an entry of the env's own
    ``dataset`` from the seed). The dataset's ``score_answer`` judges every attempt; the adapter only adds the
    retry loop.

    ## Observations
    The opening is one user message, the example's prompt (the entry's question by default), after
    ``system_prompt`` as a system message when one is given. After a wrong attempt, one user message: the
    answer as read, its score, and how many attempts are left.

    ## Actions
    Any text; its answer is the text inside its last ``<answer>…</answer>``, or the whole turn stripped (after any
    ``</think>``).

    ## Rewards
    0.0 on every turn but the last; the last turn gets ``score × retry_discount^k``, k the number of earlier
    attempts, the score being the dataset's ``score_answer`` of that turn's answer in [0, 1]. ``info["score"]``
    holds the undiscounted score of each attempt, ``info["correct"]`` whether it reached ``success_score`` (the
    success rates count solved problems, not partial scores).

    ## Episode End
    Terminated when an attempt scores at least ``success_score`` (default 1: correct) or after ``max_attempts``
    attempts. Never truncated by the adapter.

    ## Version
    v0: first version (tested with reasoning-gym 0.1.25).

    Args:
        dataset, config: the dataset ``reset(None, seed)`` draws from, and its config options.
        max_attempts: attempts per problem (1: single-turn).
        retry_discount: factor of the final reward per earlier attempt (1: a late success counts fully).
        success_score: the score that ends the episode as solved.
        system_prompt: an optional system message before the question.
    """

    def __init__(self, dataset: str = "chain_sum", config: dict | None = None, max_attempts: int = 3,
                 retry_discount: float = 0.5, success_score: float = 1.0, system_prompt: str | None = None) -> None:
        super().__init__()
        import_reasoning_gym()
        if max_attempts < 1 or not 0 <= retry_discount <= 1 or not 0 < success_score <= 1:
            raise InputError(f"reasoning_gym env: max_attempts={max_attempts} must be >= 1, retry_discount="
                             f"{retry_discount} in [0, 1] and success_score={success_score} in (0, 1]; fix env.options.")
        self.task = ReasoningGymTask(dataset, num_train=1, num_eval=1, config=config)
        self.max_attempts, self.retry_discount, self.success_score = max_attempts, retry_discount, success_score
        self.system_prompt = system_prompt
        self._item: dict | None = None
        self._attempts = 0

    def reset(self, example: Example | None = None, seed: int | None = None) -> tuple[list[Message], dict]:
        super().reset(example, seed)
        if example is None:
            entry = _entries(self.task.dataset, self.task.config, 1, int(self.np_random.integers(2**31)))[0]
            example = self.task.example(entry)
        if META_KEY not in example.meta:
            raise InputError(f"{self.env_id or 'reasoning_gym env'}: the example has no meta[{META_KEY!r}]; reset it "
                             "on examples of a reasoning_gym task (ReasoningGymTask).")
        self._item, self._attempts = example.meta[META_KEY], 0
        opening = [{"role": "system", "content": self.system_prompt}] if self.system_prompt else []
        return [*opening, {"role": "user", "content": example.prompt}], {"dataset": self._item["dataset"]}

    def step(self, action: str) -> StepResult:
        if self._item is None:
            raise RuntimeError(f"{self.env_id or 'reasoning_gym env'}: step() called before reset() or after the end")
        score = score_entry(action, self._item)
        self._attempts += 1
        info: dict[str, Any] = {"score": score, "attempt": self._attempts, "correct": score >= self.success_score}
        if score >= self.success_score or self._attempts >= self.max_attempts:
            self._item = None
            return StepResult([], score * self.retry_discount ** (self._attempts - 1), True, False, info)
        left = self.max_attempts - self._attempts
        feedback = (f"Your answer {extract_answer(action)!r} is not correct (score {score:.2f}). Try again: "
                    f"{left} attempt{'s' if left > 1 else ''} left.")
        return StepResult([{"role": "user", "content": feedback}], 0.0, False, False, info)

    def expert_action(self) -> str:
        if self._item is None:
            raise RuntimeError("expert_action() needs an episode in progress")
        return str(self._item["entry"]["answer"])


def _task(dataset: str = "chain_sum", **options: Any) -> ReasoningGymTask:
    return ReasoningGymTask(dataset, **options)


register_env("reasoning_gym/Feedback-v0", task=_task, requires="reasoning_gym")(ReasoningGymEnv)
