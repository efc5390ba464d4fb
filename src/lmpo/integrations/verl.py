"""Run lmpo objectives as verl policy losses. Tested with verl 0.9.1.

Importing this module registers every preset of ``lmpo.objectives.PRESETS`` with verl's
``register_policy_loss`` as ``lmpo_<name>`` (``lmpo_grpo``, ``lmpo_gspo``, …). In a verl run::

    actor_rollout_ref.model.external_lib=lmpo.integrations.verl      # imported in every Ray worker
    actor_rollout_ref.actor.policy_loss.loss_mode=lmpo_gspo

Field overrides (any ``Objective`` field except the aggregation ones) go in ``policy_loss.lmpo``. verl's
``PolicyLossConfig`` rejects unknown keys, so the policy-loss node is switched to this module's subclass
that adds the ``lmpo`` dict::

    actor_rollout_ref.actor.policy_loss._target_=lmpo.integrations.verl.LmpoPolicyLossConfig
    +actor_rollout_ref.actor.policy_loss.lmpo={eps_low:0.0003,eps_high:0.0004}

The loss function does no maths of its own; per call (one micro-batch) it

1. builds the objective (cached) from the preset, the ``policy_loss.lmpo`` overrides and verl's
   ``actor.loss_agg_mode``, which wins over the preset's own aggregation, because verl aggregates its
   entropy and KL terms with the same mode and defines the global-batch normalisation per mode:

   ==========================  ===========================  ==========================================
   verl ``loss_agg_mode``      lmpo ``aggregation``         normaliser passed (global_batch_info)
   ==========================  ===========================  ==========================================
   token-mean                  token_mean                   num_tokens = batch_num_tokens / dp_size
   token-sum                   token_sum                    none; the loss is multiplied by dp_size
   seq-mean-token-mean         seq_mean_token_mean          num_seqs = global_batch_size / dp_size
   seq-mean-token-sum          seq_mean_token_sum           num_seqs = global_batch_size / dp_size
   seq-mean-token-sum-norm     seq_mean_token_sum_norm      same, norm_constant = loss_scale_factor or T
   ==========================  ===========================  ==========================================

   (verl's DDP/FSDP averages gradients over ranks, so a rank-local ``Σ/(global count/dp_size)`` is the
   global mean; without global info the counts are the micro-batch's own: valid tokens, non-empty rows.
   A preset whose own aggregation is verl's mode under another name, e.g. dr_grpo's ``seq_sum_norm``, keeps it.)
2. applies verl's ``rollout_is_weights`` (``algorithm.rollout_correction``: verl's truncation, IcePop masks and
   batch normalisation, computed by verl from its rollout log-probs) as ``correction="given"``: they multiply
   the per-token policy terms as in verl's own losses, and the advantages stay as they are, so ``clip_cov`` /
   ``kl_cov`` select their tokens exactly as verl's do. verl's hook receives those weights, not the rollout
   log-probs, so lmpo's own corrections (``tis``, ``mis``, rejections) are refused here with that advice; verl's
   rejection sampling (``rollout_rs``) has already shrunk the response mask the hook receives.
3. calls the objective through its driver (``lmpo.objectives.ObjectiveDriver``, shared with lmpo's trainer
   and the TRL adapter) and returns ``(loss, metrics)``: the objective's statistics under the same keys the
   trainer and the TRL adapter log (``loss/policy``, ``clip/low_frac``, …), plus verl's own names for verl's
   dashboards: ``actor/pg_clipfrac`` (lmpo ``clip/region_frac``), ``actor/pg_clipfrac_lower``
   (``clip/dual_frac``, 0 without dual clip), ``actor/ppo_kl`` (lmpo's k3 estimate of KL(π_old‖π_θ); verl's
   own losses report k1). Statistics are converted to floats in one host sync.

Refused at call time with an error saying what to use instead (never silently degraded): entropy terms
(static or adaptive: verl's hook receives no entropies and no optimizer-step hook for a controller; use
``actor.entropy_coeff``), reference KL (use ``actor.use_kl_loss``), gradient-adaptive credit (needs
per-token gradient norms from logits or hidden states, which the hook does not receive), overrides of
``aggregation``/``norm_constant`` (use ``actor.loss_agg_mode``/``actor.loss_scale_factor``).
"""

from __future__ import annotations

import functools
import logging
import warnings
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

import torch

from lmpo.objectives import PRESETS, Objective, ObjectiveDriver
from lmpo.objectives.driver import Host, refuse

logger = logging.getLogger(__name__)

TESTED_VERL_VERSION = "0.9.1"
LOSS_MODE_PREFIX = "lmpo_"

try:
    import verl
    from verl.trainer.ppo.core_algos import POLICY_LOSS_REGISTRY, register_policy_loss
    from verl.workers.config import PolicyLossConfig
except ImportError as err:  # pragma: no cover - exercised only without verl
    raise ImportError(
        f"lmpo.integrations.verl needs verl (tested with {TESTED_VERL_VERSION}): pip install 'lmpo[verl]'. "
        f"Import failed with: {err}"
    ) from err



def check_verl_version(found: str | None) -> bool:
    """True for the tested version; otherwise a ``RuntimeWarning`` naming both versions."""
    if found == TESTED_VERL_VERSION:
        return True
    warnings.warn(
        f"lmpo.integrations.verl is tested with verl {TESTED_VERL_VERSION}, found verl {found or 'unknown'}; "
        f"the policy-loss signature or global_batch_info keys may differ. Run "
        f"tests/integrations/test_integ_verl.py against this version before trusting results "
        f"(pip install 'lmpo[verl]' installs {TESTED_VERL_VERSION}).",
        RuntimeWarning,
        stacklevel=3,
    )
    return False


check_verl_version(getattr(verl, "__version__", None))

AGGREGATION_FROM_VERL: Mapping[str, str] = {
    "token-mean": "token_mean",
    "token-sum": "token_sum",
    "seq-mean-token-mean": "seq_mean_token_mean",
    "seq-mean-token-sum": "seq_mean_token_sum",
    "seq-mean-token-sum-norm": "seq_mean_token_sum_norm",
}
"""verl ``actor.loss_agg_mode`` → lmpo ``Objective.aggregation`` (one to one, the same names)."""

AGGREGATION_TO_VERL: Mapping[str, str] = {
    "token_mean": "token-mean",
    "token_sum": "token-sum",
    "seq_mean_token_mean": "seq-mean-token-mean",
    "seq_mean_token_sum": "seq-mean-token-sum",
    "seq_mean_token_sum_norm": "seq-mean-token-sum-norm",
    "seq_sum_norm": "seq-mean-token-sum-norm",
}
"""The ``loss_agg_mode`` that reproduces a preset's own aggregation."""

_OVERRIDES_OWNED_BY_VERL = {
    "aggregation": "actor_rollout_ref.actor.loss_agg_mode",
    "norm_constant": "actor_rollout_ref.actor.loss_scale_factor",
}


@dataclass
class LmpoPolicyLossConfig(PolicyLossConfig):
    """verl's ``PolicyLossConfig`` plus ``lmpo``: ``Objective`` field overrides for ``lmpo_*`` loss modes.

    Select it with ``actor_rollout_ref.actor.policy_loss._target_=lmpo.integrations.verl.LmpoPolicyLossConfig``
    (verl instantiates config nodes from ``_target_`` and its own class rejects the extra key).
    """

    lmpo: dict[str, Any] = field(default_factory=dict)
    """Objective fields, e.g. ``{eps_high: 0.3, dual_clip: true}``; see ``lmpo.objectives.Objective``."""


def _config_get(node: Any, key: str) -> Any:
    if node is None:
        return None
    if isinstance(node, Mapping) or hasattr(node, "get"):
        return node.get(key, None)
    return getattr(node, key, None)


def _plain(value: Any) -> Any:
    """OmegaConf containers → Python dict/list (verl may hand over DictConfig nodes)."""
    try:
        from omegaconf import DictConfig, ListConfig, OmegaConf

        if isinstance(value, (DictConfig, ListConfig)):
            return OmegaConf.to_container(value, resolve=True)
    except ImportError:  # pragma: no cover
        pass
    return value


def _overrides_from_config(config: Any) -> dict[str, Any]:
    overrides = _plain(_config_get(_config_get(config, "policy_loss"), "lmpo")) or {}
    if not isinstance(overrides, Mapping):
        raise TypeError(
            f"actor.policy_loss.lmpo must be a mapping of Objective fields, got {type(overrides).__name__} "
            f"({overrides!r}); e.g. +actor_rollout_ref.actor.policy_loss.lmpo={{eps_high:0.3}}."
        )
    for key, where in _OVERRIDES_OWNED_BY_VERL.items():
        if key in overrides:
            raise ValueError(
                f"actor.policy_loss.lmpo.{key}={overrides[key]!r}: under verl the aggregation follows verl's "
                f"config so that the entropy and KL terms agree with the policy term; set {where} instead."
            )
    return dict(overrides)


@functools.lru_cache(maxsize=256)
def _build_objective(preset: str, overrides: tuple[tuple[str, Any], ...], aggregation: str,
                     norm_constant: float | None, given_weights: bool) -> Objective:
    objective = Objective.preset(preset, **dict(overrides))
    objective = objective.replace(aggregation=aggregation, norm_constant=norm_constant, name=f"lmpo_{preset}")
    if given_weights and objective.correction == "none":
        objective = objective.replace(correction="given")
    return objective


@functools.cache
def _preset_aggregation(preset: str) -> str:
    return Objective.preset(preset).aggregation


@functools.lru_cache(maxsize=64)
def _warn_aggregation_once(preset: str, preset_aggregation: str, loss_agg_mode: str) -> None:
    warnings.warn(
        f"lmpo_{preset}: the preset's own aggregation is {preset_aggregation!r} "
        f"(verl loss_agg_mode={AGGREGATION_TO_VERL[preset_aggregation]!r}) but verl's "
        f"actor.loss_agg_mode={loss_agg_mode!r} is used; set actor_rollout_ref.actor.loss_agg_mode="
        f"{AGGREGATION_TO_VERL[preset_aggregation]} to reproduce the method as published.",
        UserWarning,
        stacklevel=3,
    )


def objective_for_verl(preset: str, loss_agg_mode: str, config: Any = None, loss_scale_factor: Any = None,
                       response_length: int | None = None, rollout_is_weights: bool = False) -> Objective:
    """The ``Objective`` an ``lmpo_<preset>`` loss runs with under verl's config (cached; refusals checked).

    Args:
        preset: a name in ``lmpo.objectives.PRESETS``.
        loss_agg_mode: verl's ``actor.loss_agg_mode``.
        config: verl's actor config (reads ``policy_loss.lmpo``); None for the preset's defaults.
        loss_scale_factor: verl's ``seq-mean-token-sum-norm`` constant; None uses ``response_length`` (T).
        rollout_is_weights: verl passes rollout-correction weights (they become ``correction="given"``).
    """
    if loss_agg_mode not in AGGREGATION_FROM_VERL:
        raise ValueError(
            f"loss_agg_mode={loss_agg_mode!r} is not one of verl's modes "
            f"({', '.join(AGGREGATION_FROM_VERL)}); set actor_rollout_ref.actor.loss_agg_mode."
        )
    overrides = _overrides_from_config(config)
    preset_aggregation = _preset_aggregation(preset)
    same = AGGREGATION_TO_VERL[preset_aggregation] == loss_agg_mode
    aggregation = preset_aggregation if same else AGGREGATION_FROM_VERL[loss_agg_mode]
    norm_constant = None
    if aggregation in ("seq_sum_norm", "seq_mean_token_sum_norm"):
        norm_constant = float(loss_scale_factor) if loss_scale_factor is not None else response_length
    objective = _build_objective(preset, tuple(sorted(overrides.items())), aggregation, norm_constant,
                                 bool(rollout_is_weights))
    _driver(objective)  # refuses what verl's hook cannot give, naming what to use instead
    if not same:
        _warn_aggregation_once(preset, preset_aggregation, loss_agg_mode)
    return objective


VERL_HOST = Host(
    "verl's policy-loss hook",
    frozenset({"rollout_is_weights"}),  # the hook receives log-probs, advantages, the mask and verl's IS weights
    advice={
        "rollout_logp": "verl's policy-loss hook receives verl's rollout_is_weights, not the rollout log-probs: "
                        "set policy_loss.lmpo.correction=none / rejection=none and configure verl's "
                        "algorithm.rollout_correction (rollout_is, rollout_is_threshold, rollout_rs); the adapter "
                        "applies verl's weights (correction='given').",
        "rollout_is_weights": "verl passes rollout_is_weights only when algorithm.rollout_correction.rollout_is is "
                              "set; set it, or drop policy_loss.lmpo.correction=given.",
        "entropy": "the hook receives no entropies: for a bonus set policy_loss.lmpo.entropy_coef=0 / "
                   "adaptive_entropy=false and use verl's own actor_rollout_ref.actor.entropy_coeff=<c> "
                   "(calculate_entropy=True, aggregated with loss_agg_mode); for credit='high_entropy' run the "
                   "objective with lmpo's trainer or lmpo.integrations.trl.LmpoGRPOTrainer.",
        "step_hook": "use verl's static bonus (actor_rollout_ref.actor.entropy_coeff=<c>) with another preset, or "
                     "run this preset with lmpo's trainer or lmpo.integrations.trl.LmpoGRPOTrainer.",
        "ref_logp": "set policy_loss.lmpo.kl_coef=0 and use verl's actor_rollout_ref.actor.use_kl_loss=True "
                    "kl_loss_coef=<β> kl_loss_type=<k1|k2|k3> (aggregated with loss_agg_mode).",
        "token_grad_norm": "use lmpo.integrations.trl.LmpoGRPOTrainer or lmpo's trainer (both compute them), or "
                           "set policy_loss.lmpo.credit=none / temporal_decay.",
    },
)
"""What verl's policy-loss hook gives an objective."""


@functools.lru_cache(maxsize=256)
def _driver(objective: Objective) -> ObjectiveDriver:
    """One driver per objective (refusals checked once, when it is built)."""
    return ObjectiveDriver(objective, VERL_HOST)


def _normalisers(loss_agg_mode: str, mask: torch.Tensor, global_batch_info: Mapping[str, Any]) -> dict[str, Any]:
    """num_tokens / num_seqs for one micro-batch from verl's ``config.global_batch_info``."""
    dp_size = global_batch_info.get("dp_size", 1) or 1
    if loss_agg_mode == "token-sum":
        return {}
    if loss_agg_mode == "token-mean":
        batch_num_tokens = global_batch_info.get("batch_num_tokens")
        if batch_num_tokens is None:
            if dp_size > 1:
                raise ValueError(
                    "loss_agg_mode='token-mean' with dp_size > 1 needs global_batch_info['batch_num_tokens'] "
                    "(verl sets it in ppo_loss); without it the data-parallel mean would be wrong."
                )
            return {"num_tokens": None}
        return {"num_tokens": batch_num_tokens / dp_size}
    global_batch_size = global_batch_info.get("global_batch_size")
    if global_batch_size is None:
        if dp_size > 1:
            raise ValueError(
                f"loss_agg_mode={loss_agg_mode!r} with dp_size > 1 needs global_batch_info['global_batch_size'] "
                f"(verl sets it in ppo_loss)."
            )
        # verl's agg_loss counts only sequences with at least one valid token
        return {"num_seqs": (mask.sum(-1) > 0).sum().clamp(min=1)}
    return {"num_seqs": global_batch_size / dp_size}


def verl_metrics(merged: Mapping[str, float]) -> dict[str, float]:
    """The driver's statistics (floats, lmpo's keys) plus verl's own names for its dashboards."""
    metrics = {
        "actor/pg_clipfrac": merged.get("clip/region_frac", 0.0),
        "actor/pg_clipfrac_lower": merged.get("clip/dual_frac", 0.0),
        "actor/ppo_kl": merged.get("kl/behaviour_k3", 0.0),
    }
    metrics.update(merged)
    return metrics


def make_policy_loss(preset: str) -> Callable[..., tuple[torch.Tensor, dict[str, float]]]:
    """A verl policy-loss function for one lmpo preset (what ``lmpo_<preset>`` is registered as)."""
    if preset not in PRESETS:
        raise ValueError(f"unknown preset {preset!r}; valid presets: {', '.join(PRESETS)}.")

    def policy_loss(
        old_log_prob: torch.Tensor,
        log_prob: torch.Tensor,
        advantages: torch.Tensor,
        response_mask: torch.Tensor,
        loss_agg_mode: str = "token-mean",
        config: Any = None,
        rollout_is_weights: torch.Tensor | None = None,
    ) -> tuple[torch.Tensor, dict[str, float]]:
        """verl policy loss ``lmpo_<preset>``.

        Args:
            old_log_prob, log_prob: (B, T) behaviour / current log-probs (log_prob carries the gradient).
            advantages: (B, T); response_mask: (B, T) bool or 0/1. In multi-turn rollouts verl's agent loop
                sets it to 0 on the tool / observation tokens inside the response too; it is passed on unchanged,
                so those tokens are excluded like padding, as in verl's own losses.
            loss_agg_mode: verl's ``actor.loss_agg_mode`` (wins over the preset's aggregation).
            config: verl ``ActorConfig`` (reads ``global_batch_info``, ``loss_scale_factor``,
                ``policy_loss.lmpo``) or None.
            rollout_is_weights: (B, T) rollout-correction weights ≥ 0, or None.
        Returns:
            ``(loss, metrics)``: 0-dim loss for backward; dict of floats with verl's names.
        """
        global_batch_info = dict(_config_get(config, "global_batch_info") or {})
        loss_scale_factor = global_batch_info.get("loss_scale_factor", _config_get(config, "loss_scale_factor"))
        objective = objective_for_verl(preset, loss_agg_mode, config, loss_scale_factor, log_prob.shape[-1],
                                       rollout_is_weights is not None)
        driver = _driver(objective)
        weights = rollout_is_weights if driver.needs.rollout_is_weights else None
        if driver.needs.rollout_is_weights and weights is None:
            refuse(VERL_HOST.name, [f"correction='given' applies verl's rollout_is_weights, but verl passed none; "
                                    f"{VERL_HOST.advice['rollout_is_weights']}"], f"objective {objective.name!r}")
        loss = driver.loss(log_prob, old_log_prob, advantages, response_mask, rollout_is_weights=weights,
                           **_normalisers(loss_agg_mode, response_mask, global_batch_info))
        if loss_agg_mode == "token-sum":  # verl scales a rank's token sum by dp_size (DDP averages over ranks)
            loss = loss * (global_batch_info.get("dp_size", 1) or 1)
        return loss, verl_metrics(driver.end_step())  # verl merges the per-micro-batch metrics itself

    policy_loss.__name__ = policy_loss.__qualname__ = f"{LOSS_MODE_PREFIX}{preset}"
    return policy_loss


def register_lmpo_losses(presets: Mapping[str, Any] = PRESETS) -> list[str]:
    """Register ``lmpo_<name>`` for every preset with verl (idempotent); returns the registered names."""
    names = []
    for preset in presets:
        name = f"{LOSS_MODE_PREFIX}{preset}"
        existing = POLICY_LOSS_REGISTRY.get(name)
        if existing is not None and getattr(existing, "__module__", None) != __name__:
            raise RuntimeError(f"verl already has a policy loss named {name!r} from {existing.__module__}.")
        register_policy_loss(name)(make_policy_loss(preset))
        names.append(name)
    return names


REGISTERED_LOSS_MODES: tuple[str, ...] = tuple(register_lmpo_losses())
"""The verl ``loss_mode`` names this module registered at import."""

__all__ = [
    "AGGREGATION_FROM_VERL",
    "AGGREGATION_TO_VERL",
    "LOSS_MODE_PREFIX",
    "REGISTERED_LOSS_MODES",
    "TESTED_VERL_VERSION",
    "VERL_HOST",
    "LmpoPolicyLossConfig",
    "check_verl_version",
    "make_policy_loss",
    "objective_for_verl",
    "register_lmpo_losses",
    "verl_metrics",
]
