"""The parts an objective is composed of: one registry per kind (see ``base.py`` for what a part is).

| kind | registry | module |
|---|---|---|
| importance weight | ``LEVELS`` | ``levels.py`` |
| trust region | ``TRUST_REGIONS`` | ``trust_regions.py`` |
| token credit | ``CREDITS`` | ``credit.py`` |
| rollout correction | ``CORRECTIONS`` | ``correction.py`` |
| rejection | ``REJECTIONS`` | ``rejection.py`` |
| entropy control | ``ENTROPY_CONTROLS`` | ``entropy.py`` |
| covariance control | ``COV_CONTROLS`` | ``covariance.py`` |
| reference-KL estimator | ``KL_ESTIMATORS`` | ``kl.py`` |
| on-policy distillation | ``DISTILLATIONS`` | ``distill.py`` |
| aggregation | ``AGGREGATIONS`` | ``aggregation.py`` |

``KINDS`` lists them in the order an objective applies them, each with the keyword that selects it.
"""

from __future__ import annotations

from .aggregation import AGGREGATIONS
from .base import INPUTS, Context, Part, Registry, param
from .correction import CORRECTIONS
from .covariance import COV_CONTROLS
from .credit import CREDITS
from .distill import DISTILLATIONS
from .entropy import ENTROPY_CONTROLS, AdaptiveEntropyController
from .kl import KL_ESTIMATORS
from .levels import LEVELS
from .rejection import REJECTIONS
from .trust_regions import TRUST_REGIONS

KINDS: dict[str, Registry] = {
    "level": LEVELS,
    "trust_region": TRUST_REGIONS,
    "credit": CREDITS,
    "correction": CORRECTIONS,
    "rejection": REJECTIONS,
    "entropy_control": ENTROPY_CONTROLS,
    "cov_control": COV_CONTROLS,
    "kl_estimator": KL_ESTIMATORS,
    "distill": DISTILLATIONS,
    "aggregation": AGGREGATIONS,
}
"""Kind → registry, in the order an objective applies the parts (the keyword selecting each is its kind,
except ``entropy_control``, selected by ``adaptive_entropy``)."""

__all__ = [
    "AGGREGATIONS", "CORRECTIONS", "COV_CONTROLS", "CREDITS", "DISTILLATIONS", "ENTROPY_CONTROLS", "INPUTS", "KINDS",
    "KL_ESTIMATORS", "LEVELS", "REJECTIONS", "TRUST_REGIONS", "AdaptiveEntropyController", "Context", "Part", "Registry", "param",
]
