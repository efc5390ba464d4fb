"""KL to a reference policy: per-token estimators, added to the loss as ``kl_coef · aggregate(k_t)``.

With ``x = ref_logp − logp`` (clamped to ±``clamp`` for k3, whose exp would otherwise overflow):

- ``k1 = logp − ref_logp``            (unbiased, high variance; its gradient is ∇logp)
- ``k2 = ½(logp − ref_logp)²``        (low variance, biased)
- ``k3 = exp(x) − x − 1``              (unbiased for KL(π‖π_ref) under samples from π, always ≥ 0;
  Schulman 2020, "Approximating KL divergence"; the GRPO paper's choice)
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from .base import Part, Registry

KL_ESTIMATORS = Registry("kl_estimator", "Reference-KL estimator")
"""Registry of per-token KL estimators: name → part class."""


@dataclass(frozen=True)
class KLEstimator(Part):
    """Base of the KL estimators: ``estimate(logp, ref_logp, clamp)`` → (B, T), the gradient through logp."""

    def estimate(self, logp: torch.Tensor, ref_logp: torch.Tensor, clamp: float = 20.0) -> torch.Tensor:
        raise NotImplementedError


@KL_ESTIMATORS.register
@dataclass(frozen=True)
class K1(KLEstimator):
    """``k1 = logp − ref_logp``: unbiased, high variance."""

    name = "k1"
    formula = "logp − ref_logp"
    source = "Schulman 2020, Approximating KL divergence"

    def estimate(self, logp, ref_logp, clamp=20.0):
        return logp - ref_logp


@KL_ESTIMATORS.register
@dataclass(frozen=True)
class K2(KLEstimator):
    """``k2 = ½(logp − ref_logp)²``: low variance, biased."""

    name = "k2"
    formula = "½(logp − ref_logp)²"
    source = "Schulman 2020, Approximating KL divergence"

    def estimate(self, logp, ref_logp, clamp=20.0):
        return 0.5 * (logp - ref_logp) ** 2


@KL_ESTIMATORS.register
@dataclass(frozen=True)
class K3(KLEstimator):
    """``k3 = exp(x) − x − 1``, ``x = clamp(ref_logp − logp)``: unbiased and ≥ 0 (GRPO's choice)."""

    name = "k3"
    formula = "exp(x) − x − 1,  x = ref_logp − logp"
    source = "Schulman 2020, Approximating KL divergence; Shao et al. 2024 (arXiv 2402.03300)"

    def estimate(self, logp, ref_logp, clamp=20.0):
        x = torch.clamp(ref_logp - logp, -clamp, clamp)
        return torch.exp(x) - x - 1.0


def kl_estimate(logp: torch.Tensor, ref_logp: torch.Tensor, estimator: str = "k3", clamp: float = 20.0) -> torch.Tensor:
    """Per-token KL estimate by registry name. logp, ref_logp: (B, T). Returns (B, T) (gradient through logp)."""
    return KL_ESTIMATORS[estimator]().estimate(logp, ref_logp, clamp)
