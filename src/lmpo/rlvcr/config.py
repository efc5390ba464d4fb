"""The ``rlvcr`` configuration section: thinking levels, budgets and the advantage mix.

Built on :mod:`lmpo.config` only (never on the trainer), so that ``RLVCRConfig(levels=1)`` raises the same
:class:`lmpo.config.ConfigError` whatever was imported before.
"""

from __future__ import annotations

from dataclasses import dataclass

from lmpo.config import ConfigError, check_fields
from lmpo.config import option as _f
from lmpo.objectives.objective import ADVANTAGE_SCALES

EXPANSION_LOSS_MODES = ("all", "thinking", "sampled")
"""Values of ``rlvcr.expansion_loss``: which completion tokens of an expanded row train (docs/rlvcr.md)."""


@dataclass(frozen=True)
class RLVCRConfig:
    """RLVCR thinking-level expansion and mixed action/thinking advantages (docs/rlvcr.md)."""

    enabled: bool = _f(False, "Expand successful completions into one sample per thinking level and mix "
                       "action (GRPO over originals) and thinking (confidence − cost) advantages.")
    levels: int = _f(4, "L: thinking levels per expanded family (the original plus L−1 regenerated samples).",
                     ge=2, hint="The usual setting is 4.")
    budgets: tuple[int, ...] = _f((4, 8, 16, 32), "Thinking-token budget of each level, strictly increasing, "
                                  "one per level. The original takes the smallest budget its thinking fits.", ge=1)
    thinking_weight: float = _f(0.5, "w in final = (1−w)·A_action + w·A_thinking; 0 = plain GRPO, 1 = thinking "
                                "advantages only.", ge=0, le=1)
    cost_weight: float = _f(0.1, "λ_cost in thinking reward = confidence − λ_cost · thinking_tokens / "
                            "max(budgets).", ge=0)
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
                                   "rollout.temperature).", gt=0)
    scale: str | None = _f(None, "Scaling of the action advantage: group | batch | none (default: the "
                           "objective's advantage_scale, so Dr. GRPO stays unscaled).", choices=ADVANTAGE_SCALES)
    family_action: str = _f("copy", "How the members of a thinking group receive their original's action "
                            "advantage: copy (each gets all of it, the method as published) | split (each of the L gets "
                            "1/L of it, so a success's family weighs one sample in the gradient, like a failure) | "
                            "original (the original keeps it, the expansions get none: their advantage is the "
                            "thinking advantage alone); docs/rlvcr.md, 'Collapse at small scale'.",
                            choices=("copy", "split", "original"))
    expansion_loss: str = _f("all", "Which completion tokens of a regenerated (expanded) sample enter the loss: "
                             "all (the method as published) | thinking (its thinking only: the action after it was "
                             "copied from the original, not sampled after that thinking, so it gets no gradient; "
                             "docs/rlvcr.md, 'Collapse at small scale') | sampled (only the tokens its "
                             "regeneration sampled, from the first that differs from its original's: not the shared "
                             "prefix, a closing tag the budget forced, or the action).",
                             choices=EXPANSION_LOSS_MODES)
    eps: float = _f(1e-4, "ε in (r − mean_g)/(std_g + ε) of the action advantage (the objectives' GRPO "
                   "default).", gt=0)

    def __post_init__(self) -> None:
        validate_rlvcr_config(self)


def validate_rlvcr_config(cfg: RLVCRConfig) -> None:
    """Raise :class:`lmpo.config.ConfigError` (a ``ValueError``) naming the field, the value and the fix.

    Ranges and choices come from the fields' metadata; the rest relates several fields.
    """
    if not isinstance(cfg.levels, int) or isinstance(cfg.levels, bool):
        raise ConfigError(f"`rlvcr.levels` = {cfg.levels!r} must be an integer >= 2 (the usual setting is 4).")
    budgets = tuple(cfg.budgets)
    if any(not isinstance(b, int) or isinstance(b, bool) for b in budgets):
        raise ConfigError(f"`rlvcr.budgets` = {list(budgets)} must be positive integers (thinking tokens).")
    check_fields(cfg, "rlvcr")
    if len(budgets) != cfg.levels:
        raise ConfigError(f"`rlvcr.budgets` = {list(budgets)} has {len(budgets)} values for levels = {cfg.levels}; "
                          "give one thinking-token budget per level.")
    if any(b2 <= b1 for b1, b2 in zip(budgets, budgets[1:])):
        raise ConfigError(f"`rlvcr.budgets` = {list(budgets)} must be strictly increasing (level 1 thinks least).")
    if not cfg.think_open or not cfg.think_close or cfg.think_open == cfg.think_close:
        raise ConfigError(f"`rlvcr.think_open` = {cfg.think_open!r} and `rlvcr.think_close` = {cfg.think_close!r} "
                          "must be two different non-empty tags.")
    if "{prompt}" not in cfg.instruction:
        raise ConfigError(f"`rlvcr.instruction` = {cfg.instruction!r} must contain {{prompt}} (and may use "
                          "{level}, {levels}, {budget}).")
    try:
        cfg.instruction.format(prompt="", level=1, levels=cfg.levels, budget=budgets[0])
    except (KeyError, IndexError, ValueError) as e:
        raise ConfigError(f"`rlvcr.instruction` = {cfg.instruction!r} is not a valid template ({e!r}); only "
                          "{prompt}, {level}, {levels} and {budget} are filled in.") from e
