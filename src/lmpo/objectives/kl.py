"""KL to a reference policy (SPEC §1.5): per-token estimators added to the loss as ``β·k_t``.

With ``x = ref_logp − logp`` (x clamped to ±``clamp`` for k3, whose exp would otherwise overflow):

- ``k1 = logp − ref_logp``            (unbiased, high variance; its gradient is ∇logp)
- ``k2 = ½(logp − ref_logp)²``        (low variance, biased)
- ``k3 = exp(x) − x − 1``              (unbiased for KL(π‖π_ref) under samples from π, always ≥ 0;
  Schulman 2020, "Approximating KL divergence"; the GRPO paper's choice)
"""

from __future__ import annotations

import torch

KL_ESTIMATORS = ("k1", "k2", "k3")


def kl_estimate(logp: torch.Tensor, ref_logp: torch.Tensor, estimator: str = "k3", clamp: float = 20.0) -> torch.Tensor:
    """Per-token KL estimate. logp, ref_logp: (B, T). Returns (B, T) (gradient flows through logp)."""
    if estimator == "k1":
        return logp - ref_logp
    if estimator == "k2":
        return 0.5 * (logp - ref_logp) ** 2
    if estimator == "k3":
        x = torch.clamp(ref_logp - logp, -clamp, clamp)
        return torch.exp(x) - x - 1.0
    raise ValueError(
        f"kl_estimator={estimator!r} is not a known choice; use one of {', '.join(map(repr, KL_ESTIMATORS))}."
    )
