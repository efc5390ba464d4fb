"""KL to the reference policy in the reward (``r − β·KL``) and the controllers of its coefficient β.

The other place a reference KL can go is the loss (``Objective(kl_coef=…)``, ``parts/kl.py``); this one shapes
the reward before the advantages, as PPO for language models did (Ziegler et al. 2019, arXiv 1909.08593;
Stiennon et al. 2020), and as verl's ``algorithm.use_kl_in_reward`` and OpenRLHF's ``compute_reward`` do.

lmpo's advantage estimators are outcome estimators (one reward per sequence in, one advantage per sequence
out), so the per-token penalty enters as the sequence reward

    r'_i = r_i − β · Σ_t m_it · k(logp_it, ref_logp_it)

with ``k`` one of the estimators of ``parts.kl.KL_ESTIMATORS`` (verl's ``kl_penalty``: ``kl`` = ``k1``,
``abs``, ``mse`` = ``k2``, ``low_var_kl``). This is what verl computes for its outcome estimators (GRPO, RLOO,
REINFORCE++ baseline …): ``apply_kl_penalty`` writes ``token_level_rewards = token_level_scores − β·kld`` and
the estimator sums them over the response, ``scores = token_level_rewards.sum(-1)``.

β comes from a controller (verl ``algorithm.kl_ctrl``): ``FixedKLController`` keeps it, ``AdaptiveKLController``
moves it towards a target KL (Ziegler et al. 2019, §2.2): with ``e = clip(KL / KL_target − 1, −0.2, 0.2)``,
``β ← β·(1 + e·n / horizon)`` where n is the number of sequences the KL was measured on (verl passes the batch
size, following TRL's former PPO trainer). The KL fed to it is verl's ``current_kl``: the per-sequence mean of
k over valid tokens, averaged over sequences.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from .parts.kl import KL_ESTIMATORS

#: the controller types (verl ``algorithm.kl_ctrl.type``)
KL_CONTROLLERS = ("fixed", "adaptive")


def kl_penalised_rewards(rewards: torch.Tensor, logp: torch.Tensor, ref_logp: torch.Tensor, mask: torch.Tensor,
                         coef: float, estimator: str = "k1", clamp: float = 20.0
                         ) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """Sequence rewards with the reference-KL penalty: ``r'_i = r_i − β·Σ_t m_it·k_it``.

    Args:
        rewards: (B,) sequence rewards.
        logp: (B, T) log-probs of the sampled tokens under the policy that sampled them (verl's
            ``old_log_probs``); no gradient is needed or kept.
        ref_logp: (B, T) the same under the reference policy.
        mask: (B, T) 1 on completion tokens (bool or 0/1).
        coef: β ≥ 0.
        estimator: a name of ``KL_ESTIMATORS`` (``k1`` is verl's default ``kl_penalty="kl"``).
        clamp: bound of k3's log-ratio input (the objectives' ``log_ratio_clamp``).

    Returns:
        ``(rewards', stats)``: rewards' (B,) in the dtype of ``rewards``; stats (detached 0-dim tensors):
        ``kl/reward_kl`` = mean over sequences of the per-sequence token-mean k (verl's ``current_kl``, the
        controller's input; an empty sequence counts as 0, as in verl's ``masked_mean``), and
        ``kl/reward_penalty`` = mean over sequences of ``β·Σ_t m·k``.

    Source: verl ``apply_kl_penalty`` (trainer/ppo/ray_trainer.py) and ``kl_penalty`` (trainer/ppo/core_algos.py);
    OpenRLHF ``compute_reward`` / ``compute_approx_kl`` (openrlhf/models/utils.py), whose per-token rewards sum
    to the same sequence reward.
    """
    if estimator not in KL_ESTIMATORS:
        raise ValueError(f"unknown KL estimator {estimator!r}; one of {', '.join(KL_ESTIMATORS)}")
    m = mask.bool()
    with torch.no_grad():
        k = KL_ESTIMATORS[estimator]().estimate(logp.detach(), ref_logp.detach(), clamp)
        # where() rather than k·m: padding log-probs may be anything (even −inf), and must not leak in
        k = torch.where(m, k, torch.zeros((), dtype=k.dtype, device=k.device))
        kl_sum = k.sum(-1)  # (B,)
        tokens = m.sum(-1).clamp_min(1).to(k.dtype)
        penalty = coef * kl_sum
        shaped = (rewards.to(k.dtype) - penalty).to(rewards.dtype)
        stats = {"kl/reward_kl": (kl_sum / tokens).mean(), "kl/reward_penalty": penalty.mean()}
    return shaped, stats


@dataclass
class FixedKLController:
    """A constant β (verl ``FixedKLController``)."""

    value: float

    def update(self, current_kl: float, n_steps: int) -> None:
        """Nothing moves: the same β every step."""

    def state_dict(self) -> dict[str, Any]:
        return {"type": "fixed", "value": float(self.value)}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.value = float(state["value"])


@dataclass
class AdaptiveKLController:
    """β moved towards a target KL (Ziegler et al. 2019, arXiv 1909.08593 §2.2; verl ``AdaptiveKLController``).

    ``update(current_kl, n_steps)``: ``e = clip(current_kl / target − 1, −0.2, 0.2)``, ``β ← β·(1 + e·n_steps /
    horizon)``. A KL above the target raises β, below lowers it; the clip bounds the relative change of one
    update to ``0.2·n_steps / horizon``. ``updates`` counts the calls (for the checkpoint and the logs).
    """

    value: float
    target: float
    horizon: float
    updates: int = 0

    def __post_init__(self) -> None:
        if not self.target > 0:
            raise ValueError(f"AdaptiveKLController target must be > 0, got {self.target}")
        if not self.horizon > 0:
            raise ValueError(f"AdaptiveKLController horizon must be > 0, got {self.horizon}")

    def update(self, current_kl: float, n_steps: int) -> None:
        error = min(max(float(current_kl) / self.target - 1.0, -0.2), 0.2)
        self.value *= 1.0 + error * n_steps / self.horizon
        self.updates += 1

    def state_dict(self) -> dict[str, Any]:
        return {"type": "adaptive", "value": float(self.value), "target": float(self.target),
                "horizon": float(self.horizon), "updates": int(self.updates)}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore β and the update count (target and horizon come from the run's config)."""
        self.value = float(state["value"])
        self.updates = int(state.get("updates", 0))


def make_kl_controller(kind: str, coef: float, target: float = 0.1,
                       horizon: float = 10000) -> FixedKLController | AdaptiveKLController:
    """verl ``get_kl_controller``: ``fixed`` (β = coef) or ``adaptive`` (starting at coef)."""
    if kind == "fixed":
        return FixedKLController(coef)
    if kind == "adaptive":
        return AdaptiveKLController(coef, target, horizon)
    raise ValueError(f"unknown KL controller {kind!r}; one of {', '.join(KL_CONTROLLERS)}")


#: the statistics of the KL in the reward, with their meaning (the trainer's metric table)
KL_REWARD_STATS = {
    "kl/coef": "β of the KL in the reward used this step (objective.kl_in_reward; moves with the adaptive "
               "controller)",
    "kl/reward_kl": "mean over sequences of the token-mean KL estimate to the reference (the adaptive "
                    "controller's input, verl's actor/reward_kl_penalty)",
    "kl/reward_penalty": "mean over sequences of the penalty β·Σ_t KL_t subtracted from the sequence reward",
}

__all__ = ["KL_CONTROLLERS", "KL_REWARD_STATS", "AdaptiveKLController", "FixedKLController", "kl_penalised_rewards",
           "make_kl_controller"]
