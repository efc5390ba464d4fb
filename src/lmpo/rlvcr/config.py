"""The ``rlvcr`` configuration section (docs/rlvcr.md): thinking levels, budgets and the advantage mix."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

SCALES = ("group", "batch", "none")


def _f(default: Any, help: str) -> Any:
    return field(default=default, metadata={"help": help})


@dataclass(frozen=True)
class RLVCRConfig:
    """RLVCR thinking-level expansion and mixed action/thinking advantages (docs/rlvcr.md)."""

    enabled: bool = _f(False, "Expand successful completions into one sample per thinking level and mix "
                       "action (GRPO over originals) and thinking (confidence − cost) advantages.")
    levels: int = _f(4, "L: thinking levels per expanded family (the original plus L−1 regenerated samples).")
    budgets: tuple[int, ...] = _f((4, 8, 16, 32), "Thinking-token budget of each level, strictly increasing, "
                                  "one per level. The original takes the smallest budget its thinking fits.")
    thinking_weight: float = _f(0.5, "w in final = (1−w)·A_action + w·A_thinking; 0 = plain GRPO, 1 = thinking "
                                "advantages only.")
    cost_weight: float = _f(0.1, "λ_cost in thinking reward = confidence − λ_cost · thinking_tokens / "
                            "max(budgets).")
    success_threshold: float = _f(0.0, "An original is expanded when its total reward is > this (the reference "
                                  "implementation's episode_reward > 0).")
    think_open: str = _f("<think>", "Tag that opens the thinking part of a completion.")
    think_close: str = _f("</think>", "Tag that closes the thinking part; the action (answer) follows it.")
    instruction: str = _f("[think {budget}]{prompt}", "Level instruction used to regenerate thinking: a "
                          "template over {prompt}, {level}, {levels} and {budget}.")
    train_with_instruction: bool = _f(False, "Train regenerated samples on the instructed prompt (true) or on "
                                      "the original prompt (false: the policy learns which thinking to produce "
                                      "unprompted).")
    temperature: float | None = _f(None, "Sampling temperature of the regeneration (default: "
                                   "rollout.temperature).")
    scale: str | None = _f(None, "Scaling of the action advantage: group | batch | none (default: the "
                           "objective's advantage_scale, so Dr. GRPO stays unscaled).")
    eps: float = _f(1e-4, "ε in (r − mean_g)/(std_g + ε) of the action advantage (the objectives' GRPO "
                   "default).")

    def __post_init__(self) -> None:
        validate_rlvcr_config(self)

    @property
    def max_budget(self) -> int:
        return self.budgets[-1]


def _error(message: str) -> ValueError:
    """The trainer's ``ConfigError`` so that ``lmpo train`` reports a bad section like any other; imported
    lazily because ``lmpo.trainer.config`` imports this module."""
    try:
        from lmpo.trainer.config import ConfigError
    except ImportError:  # pragma: no cover - only while lmpo.trainer.config is itself being imported
        return ValueError(message)
    return ConfigError(message)


def validate_rlvcr_config(cfg: RLVCRConfig) -> None:
    """Raise the trainer's ``ConfigError`` (a ``ValueError``) naming the field, the value and the fix."""
    if not isinstance(cfg.levels, int) or cfg.levels < 2:
        raise _error(f"`rlvcr.levels` = {cfg.levels!r} must be an integer >= 2 (the reference implementation uses 4).")
    budgets = tuple(cfg.budgets)
    if len(budgets) != cfg.levels:
        raise _error(f"`rlvcr.budgets` = {list(budgets)} has {len(budgets)} values for levels = {cfg.levels}; "
                         "give one thinking-token budget per level.")
    if any(not isinstance(b, int) or b < 1 for b in budgets):
        raise _error(f"`rlvcr.budgets` = {list(budgets)} must be positive integers (thinking tokens).")
    if any(b2 <= b1 for b1, b2 in zip(budgets, budgets[1:])):
        raise _error(f"`rlvcr.budgets` = {list(budgets)} must be strictly increasing (level 1 thinks least).")
    if not 0.0 <= cfg.thinking_weight <= 1.0:
        raise _error(f"`rlvcr.thinking_weight` = {cfg.thinking_weight!r} must be in [0, 1] "
                         "(0 = plain GRPO, 1 = thinking advantages only).")
    if cfg.cost_weight < 0:
        raise _error(f"`rlvcr.cost_weight` = {cfg.cost_weight!r} must be >= 0 (it penalises thinking length).")
    if not cfg.think_open or not cfg.think_close or cfg.think_open == cfg.think_close:
        raise _error(f"`rlvcr.think_open` = {cfg.think_open!r} and `rlvcr.think_close` = {cfg.think_close!r} "
                         "must be two different non-empty tags.")
    if "{prompt}" not in cfg.instruction:
        raise _error(f"`rlvcr.instruction` = {cfg.instruction!r} must contain {{prompt}} (and may use "
                         "{level}, {levels}, {budget}).")
    try:
        cfg.instruction.format(prompt="", level=1, levels=cfg.levels, budget=budgets[0])
    except (KeyError, IndexError, ValueError) as e:
        raise _error(f"`rlvcr.instruction` = {cfg.instruction!r} is not a valid template ({e!r}); only "
                         "{prompt}, {level}, {levels} and {budget} are filled in.") from e
    if cfg.temperature is not None and not cfg.temperature > 0:
        raise _error(f"`rlvcr.temperature` = {cfg.temperature!r} must be > 0 or null (use the rollout's).")
    if cfg.scale is not None and cfg.scale not in SCALES:
        raise _error(f"`rlvcr.scale` = {cfg.scale!r} must be one of {', '.join(SCALES)} or null (the "
                         "objective's advantage_scale).")
    if not cfg.eps > 0:
        raise _error(f"`rlvcr.eps` = {cfg.eps!r} must be > 0.")
