"""RLVCR (docs/rlvcr.md): thinking-level expansion and mixed action/thinking advantages.

- :func:`rlvcr_advantages` — the pure advantage function ``(1 − w)·A_action + w·A_thinking``;
- :mod:`lmpo.rlvcr.thinking` — levels, cost, confidence and thinking reward;
- :class:`RLVCRConfig` — the ``rlvcr`` config section.
"""

from lmpo.rlvcr.advantages import group_normalized_advantages, rlvcr_advantages
from lmpo.rlvcr.config import RLVCRConfig
from lmpo.rlvcr.thinking import (
    action_confidence,
    assign_levels,
    teacher_forced_confidence,
    thinking_cost,
    thinking_reward,
)

__all__ = [
    "RLVCRConfig",
    "action_confidence",
    "assign_levels",
    "group_normalized_advantages",
    "rlvcr_advantages",
    "teacher_forced_confidence",
    "thinking_cost",
    "thinking_reward",
]
