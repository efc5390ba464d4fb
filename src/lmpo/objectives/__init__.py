"""GRPO-family policy objectives as composable, pure tensor functions.

An ``Objective`` is one chosen part of each kind — importance level, trust region, token credit, entropy
control, covariance control, reference-KL estimator, aggregation — each a small frozen object from its
registry (``lmpo.objectives.parts``); ``PRESETS`` names common bundles; ``ADVANTAGE_ESTIMATORS`` computes the
advantages fed to it; ``ObjectiveDriver`` is what a training loop (lmpo's trainer, TRL, verl) calls.

    from lmpo.objectives import Objective
    loss, stats = Objective.preset("gspo")(logp, old_logp, advantages, mask)
"""

from .advantages import (
    ADVANTAGE_ESTIMATORS,
    ADVANTAGE_INPUTS,
    compute_advantages,
    grpo_advantages,
    make_estimator,
    rloo_advantages,
)
from .driver import Host, ObjectiveDriver
from .grad_norms import GRAD_NORM_MODES, exact_grad_norm, lm_head_grad_norm, logits_grad_norm
from .objective import Objective
from .parts import (
    AGGREGATIONS,
    COV_CONTROLS,
    CREDITS,
    ENTROPY_CONTROLS,
    KINDS,
    KL_ESTIMATORS,
    LEVELS,
    TRUST_REGIONS,
    AdaptiveEntropyController,
)
from .presets import PRESETS, Preset
from .reference import preset_table_markdown

__all__ = [
    "ADVANTAGE_ESTIMATORS",
    "ADVANTAGE_INPUTS",
    "AGGREGATIONS",
    "COV_CONTROLS",
    "CREDITS",
    "ENTROPY_CONTROLS",
    "GRAD_NORM_MODES",
    "KINDS",
    "KL_ESTIMATORS",
    "LEVELS",
    "PRESETS",
    "TRUST_REGIONS",
    "AdaptiveEntropyController",
    "Host",
    "Objective",
    "ObjectiveDriver",
    "Preset",
    "compute_advantages",
    "exact_grad_norm",
    "grpo_advantages",
    "lm_head_grad_norm",
    "logits_grad_norm",
    "make_estimator",
    "preset_table_markdown",
    "rloo_advantages",
]
