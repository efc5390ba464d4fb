"""GRPO-family policy objectives as composable, pure tensor functions (SPEC §1).

Parts (each a module with its name tuple): ``levels`` (importance weights), ``trust_region``,
``credit`` (token credit weights and gradient-norm helpers), ``entropy`` (static / adaptive entropy,
clip_cov, kl_cov), ``kl`` (reference KL), ``aggregation``, ``advantages``. ``Objective`` composes them;
``PRESETS`` names common bundles.

    from lmpo.objectives import Objective
    loss, stats = Objective.preset("gspo")(logp, old_logp, advantages, mask)
"""

from .advantages import ADVANTAGE_ESTIMATORS, compute_advantages, grpo_advantages, rloo_advantages
from .aggregation import AGGREGATIONS
from .credit import CREDIT_MODES, GRAD_NORM_MODES, exact_grad_norm, lm_head_grad_norm, logits_grad_norm
from .entropy import COV_CONTROLS, AdaptiveEntropyController
from .kl import KL_ESTIMATORS
from .levels import LEVELS
from .objective import Objective
from .presets import PRESETS, Preset, preset_table_markdown
from .trust_region import TRUST_REGIONS

__all__ = [
    "ADVANTAGE_ESTIMATORS",
    "AGGREGATIONS",
    "COV_CONTROLS",
    "CREDIT_MODES",
    "GRAD_NORM_MODES",
    "KL_ESTIMATORS",
    "LEVELS",
    "PRESETS",
    "TRUST_REGIONS",
    "AdaptiveEntropyController",
    "Objective",
    "Preset",
    "compute_advantages",
    "exact_grad_norm",
    "grpo_advantages",
    "lm_head_grad_norm",
    "logits_grad_norm",
    "preset_table_markdown",
    "rloo_advantages",
]
