"""KL to a reference policy: per-token estimators, added to the loss as ``kl_coef · aggregate(k_t)``.

With ``x = ref_logp − logp`` (clamped to ±``clamp`` for k3, whose exp would otherwise overflow):

- ``k1 = logp − ref_logp``            (unbiased, high variance; its gradient is ∇logp)
- ``abs = |logp − ref_logp|``
- ``k2 = ½(logp − ref_logp)²``        (low variance, biased)
- ``k3 = exp(x) − x − 1``              (unbiased for KL(π‖π_ref) under samples from π, always ≥ 0;
  Schulman 2020, "Approximating KL divergence"; the GRPO paper's choice)
- ``low_var_kl = clamp(k3, −10, 10)``  (verl's name for k3, clamped once more)

Every estimator takes two modifiers:

- ``kl_k2_grad``: the estimator's value with the gradient of k2, ``k2 − sg(k2) + sg(k)`` (verl's ``+`` suffix,
  e.g. ``kl_loss_type="k3+"``): k1 and k3 are unbiased in value but not in gradient, while k2's gradient is
  the gradient of KL(π‖π_ref) in expectation.
- ``kl_ratio_weighted``: ``ρ_t·k_t`` with the importance weight ρ_t = π/π_old of the level (with its gradient).
  Samples come from π_old, not π; weighting by ρ makes the KL gradient unbiased (DeepSeek-V3.2, arXiv
  2512.02556, §"unbiased KL estimate"; TRL ``use_bias_correction_kl``).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from .base import Part, Registry, param

KL_ESTIMATORS = Registry("kl_estimator", "Reference-KL estimator")
"""Registry of per-token KL estimators: name → part class."""


@dataclass(frozen=True)
class KLEstimator(Part):
    """Base of the KL estimators: ``estimate(logp, ref_logp, clamp)`` → (B, T), the gradient through logp;
    ``term(...)`` applies the two modifiers (see the module docstring)."""

    kl_k2_grad: bool = param(False, "the estimator's value with k2's gradient, k2 − sg(k2) + sg(k) (verl's '+' "
                                    "suffix, e.g. kl_loss_type='k3+')")
    kl_ratio_weighted: bool = param(False, "multiply k_t by the importance weight ρ_t (with its gradient): the "
                                           "unbiased KL gradient of DeepSeek-V3.2 (TRL use_bias_correction_kl)")

    def estimate(self, logp: torch.Tensor, ref_logp: torch.Tensor, clamp: float = 20.0) -> torch.Tensor:
        raise NotImplementedError

    def term(self, logp: torch.Tensor, ref_logp: torch.Tensor, clamp: float, rho: torch.Tensor) -> torch.Tensor:
        """The per-token KL term the loss adds: ``estimate`` with the modifiers. rho: (B, T) or (B, 1)."""
        k = self.estimate(logp, ref_logp, clamp)
        if self.kl_k2_grad:
            k2 = 0.5 * (logp - ref_logp).square()
            k = k2 - k2.detach() + k.detach()
        if self.kl_ratio_weighted:
            k = k * rho
        return k


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
class Abs(KLEstimator):
    """``|logp − ref_logp|``: verl's ``abs`` penalty."""

    name = "abs"
    formula = "|logp − ref_logp|"
    source = "verl kl_penalty(kl_penalty='abs') (trainer/ppo/core_algos.py)"

    def estimate(self, logp, ref_logp, clamp=20.0):
        return (logp - ref_logp).abs()


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


@KL_ESTIMATORS.register
@dataclass(frozen=True)
class LowVarKL(K3):
    """verl's ``low_var_kl``: k3 with x clamped to ±20 and the estimate clamped to [−10, 10] (no gradient where the
    second clamp binds)."""

    name = "low_var_kl"
    formula = "clamp(exp(x) − x − 1, −10, 10)"
    source = "verl kl_penalty(kl_penalty='low_var_kl') (trainer/ppo/core_algos.py)"

    def estimate(self, logp, ref_logp, clamp=20.0):
        return super().estimate(logp, ref_logp, clamp).clamp(-10.0, 10.0)


def kl_estimate(logp: torch.Tensor, ref_logp: torch.Tensor, estimator: str = "k3", clamp: float = 20.0) -> torch.Tensor:
    """Per-token KL estimate by registry name. logp, ref_logp: (B, T). Returns (B, T) (gradient through logp)."""
    return KL_ESTIMATORS[estimator]().estimate(logp, ref_logp, clamp)
