"""Reward functions (TRL signature ``fn(prompts, completions, answer, **kwargs) -> list[float | None]``),
the ``REWARDS`` registry of built-ins, import-path loading of user functions, sequence-classification
reward models (``RewardModel``) and the weighted scorer.

>>> scorer = RewardScorer([("exact_match", 1.0), {"name": "length_penalty", "weight": 0.1,
...                        "kwargs": {"target_chars": 8}}])
>>> total, per_fn = scorer.score(prompts, completions, answers)
"""

from lmpo.rewards.builtin import (
    REWARDS,
    completion_text,
    countdown,
    exact_match,
    format_reward,
    length_penalty,
    math_answer,
    numeric_match,
    parse_number,
    prompt_text,
    register_reward,
)
from lmpo.rewards.scorer import RewardScorer, RewardSpec, get_reward_fn, load_reward_fn

__all__ = [
    "REWARDS",
    "RewardModel",
    "RewardScorer",
    "RewardSpec",
    "completion_text",
    "countdown",
    "exact_match",
    "format_reward",
    "get_reward_fn",
    "length_penalty",
    "load_reward_fn",
    "math_answer",
    "numeric_match",
    "parse_number",
    "prompt_text",
    "register_reward",
]


def __getattr__(name: str):
    # RewardModel imports transformers (~4 s of CPU): a process-pool reward worker, which imports this package to
    # call a pure-Python reward, does not pay for it (PEP 562 lazy attribute; `from lmpo.rewards import
    # RewardModel` works as before)
    if name == "RewardModel":
        from lmpo.rewards.model import RewardModel

        return RewardModel
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
