"""Run lmpo objectives inside TRL's ``GRPOTrainer`` (docs/scaling.md). Tested with TRL 1.16.

``LmpoGRPOTrainer`` is ``GRPOTrainer`` with one method replaced: the loss. Everything else (vLLM or
``generate`` rollouts, reward functions, accelerate / DeepSpeed / FSDP, PEFT, logging, checkpoints) is
TRL's own::

    from lmpo.integrations.trl import LmpoGRPOTrainer
    trainer = LmpoGRPOTrainer(model, reward_funcs, args=GRPOConfig(...), train_dataset=ds,
                              objective=Objective.preset("gspo"))

Per micro-batch the loss method runs TRL's log-prob/entropy forward (its fused LM head), then calls the
objective with

- ``old_logp``: TRL's ``old_per_token_logps``, or ``per_token_logps.detach()`` when TRL skipped it
  (on-policy: ``num_iterations == 1`` and ``steps_per_generation <= gradient_accumulation_steps``);
- ``advantages``: TRL's, unchanged;
- ``rollout_logp`` (objectives with a rollout correction or rejection): vLLM's ``sampling_per_token_logps``
  (tokens vLLM could not score, NaN there, get the old log-prob: ratio 1, as TRL treats them), or the old
  log-probs when TRL generates with the training model itself (the sampler is then the policy);
- ``ref_logp`` (TRL computes it when ``beta != 0``, so ``beta`` must equal ``objective.kl_coef``),
  ``entropy`` (always; TRL computes it anyway), ``token_grad_norm`` (``logits``/``lm_head`` modes, from
  one extra no-grad forward with full logits, through ``lmpo.objectives.grad_norms``);
- the normalisers that reproduce TRL's loss scaling for the objective's aggregation:

  ============================  ==================================  =====================================
  ``objective.aggregation``     TRL equivalent                      passed to the objective
  ============================  ==================================  =====================================
  token_mean                    ``loss_type="dapo"``                ``num_tokens = num_items_in_batch /
                                                                    num_processes · GA / steps_per_gen``
  seq_mean_token_mean           ``loss_type="grpo"``                ``num_seqs = B · GA``
  seq_mean_token_sum            (none)                              ``num_seqs = B · GA``
  seq_sum_norm                  ``loss_type="dr_grpo"``             ``num_seqs = B · GA``, ``norm_constant =
                                                                    max_completion_length`` if unset
  ============================  ==================================  =====================================

  (GA = ``current_gradient_accumulation_steps`` in training, 1 in evaluation, as TRL does.)

The objective runs through its driver (``lmpo.objectives.ObjectiveDriver``, the one lmpo's trainer and the verl
adapter use): statistics go to TRL's ``_metrics`` under the objective's own keys (``clip/low_frac``,
``ratio/mean``, ``entropy/mean`` …), merged over the accumulation window and the processes (one gather) and
converted to floats once per optimizer step. The adaptive entropy controller is updated once per optimizer step
with the token-weighted mean entropy of the window over all processes (``entropy/coef``), and saved with
checkpoints.

TRL settings that select a part the objective leaves at ``none`` become that part (``trl_parts``), so TRL's own
numbers are reproduced:

==========================================================  ==============================================
GRPOConfig                                                  objective part
==========================================================  ==============================================
``use_vllm`` + ``vllm_importance_sampling_correction``,      ``correction="tis"`` (``*_truncate``) or ``"mis"``
``vllm_importance_sampling_mode``, ``…_clip_min/max``        (``*_mask``), ``is_level`` token / sequence,
                                                            ``is_min`` / ``is_max`` = clip_min / clip_max
``off_policy_mask_threshold=δ``                              ``rejection="off_policy_seq"``, ``opsm_delta=δ``
``top_entropy_quantile=ρ < 1``                               ``credit="high_entropy"``, ``entropy_top_frac=ρ``
==========================================================  ==============================================

The weights multiply the policy terms, so ``clip_cov`` / ``kl_cov`` see the plain advantages and work under vLLM.

The objective replaces TRL's ``loss_type``, ``epsilon``, ``epsilon_high``, ``importance_sampling_level``
(ignored, with a warning when set). Refused at construction, with what to do instead: TRL's own entropy
bonus, ``delta``, ``use_bias_correction_kl`` different from ``objective.kl_ratio_weighted`` (with ``beta != 0``),
``beta != objective.kl_coef``, ``scale_rewards != objective.advantage_scale``, ``grad_norm_mode="exact"``,
and a TRL setting of the table above together with an objective that selects that kind of part itself.
"""

from __future__ import annotations

import dataclasses
import json
import os
import warnings
from typing import Any

import torch

from lmpo.errors import UnsupportedError
from lmpo.objectives import Objective, ObjectiveDriver, lm_head_grad_norm, logits_grad_norm
from lmpo.objectives.driver import Host, host_problems, refuse

TESTED_TRL_VERSION = "1.16"

try:
    import trl
    from transformers.trainer_utils import PREFIX_CHECKPOINT_DIR
    from trl import GRPOConfig, GRPOTrainer
except ImportError as err:  # pragma: no cover - exercised only without TRL
    raise ImportError(
        f"lmpo.integrations.trl needs TRL (tested with {TESTED_TRL_VERSION}.x): pip install 'lmpo[trl]'. "
        f"Import failed with: {err}"
    ) from err



def check_trl_version(found: str | None) -> bool:
    """True for a tested version (1.16.x); otherwise a ``RuntimeWarning`` naming both versions."""
    if str(found or "").startswith(TESTED_TRL_VERSION + "."):
        return True
    warnings.warn(
        f"lmpo.integrations.trl is tested with TRL {TESTED_TRL_VERSION}.x, found TRL {found or 'unknown'}; "
        f"GRPOTrainer's loss inputs may differ. Run tests/integrations/test_integ_trl.py against this version "
        f"before trusting results (pip install 'lmpo[trl]' installs {TESTED_TRL_VERSION}.x).",
        RuntimeWarning,
        stacklevel=3,
    )
    return False


check_trl_version(getattr(trl, "__version__", None))

CONTROLLER_STATE_FILE = "lmpo_entropy_controller.json"
_IGNORED_LOSS_FIELDS = ("loss_type", "epsilon", "importance_sampling_level")


def _as_objective(objective: Objective | str) -> Objective:
    if isinstance(objective, str):
        return Objective.preset(objective)
    if not isinstance(objective, Objective):
        raise TypeError(
            f"objective must be an lmpo Objective or a preset name, got {type(objective).__name__}; "
            f"e.g. objective=Objective.preset('grpo')."
        )
    return objective


TRL_HOST = Host(
    "LmpoGRPOTrainer",
    frozenset({"entropy", "ref_logp", "rollout_logp", "step_hook", "token_grad_norm:lm_head",
               "token_grad_norm:logits"}),
    reports_entropy=True,  # TRL computes token entropies in its log-prob forward anyway
    advice={"token_grad_norm:exact": "grad_norm_mode='exact' needs one backward pass per token, which is not "
                                     "feasible inside TRL; use grad_norm_mode='lm_head' (exact over the output "
                                     "head) or 'logits'.",
            "rollout_is_weights": "TRL passes the sampler's log-probs; use correction='tis' or 'mis' (or TRL's "
                                  "vllm_importance_sampling_* settings, which become that correction)."},
)
"""What TRL's GRPOTrainer gives an objective through this adapter (``rollout_logp``: vLLM's sampler log-probs,
or the old log-probs when TRL generates with the policy itself)."""

_TRL_IS_MODES = {
    "token_truncate": ("tis", "token"),
    "sequence_truncate": ("tis", "sequence"),
    "token_mask": ("mis", "token"),
    "sequence_mask": ("mis", "sequence"),
}
"""TRL ``vllm_importance_sampling_mode`` → (lmpo correction, ``is_level``)."""


def trl_parts(args: GRPOConfig) -> dict[str, tuple[str, dict[str, Any]]]:
    """kind → (the GRPOConfig setting, Objective keywords) for the TRL settings that select an objective part."""
    parts: dict[str, tuple[str, dict[str, Any]]] = {}
    if args.use_vllm and args.vllm_importance_sampling_correction:
        mode = args.vllm_importance_sampling_mode
        if mode not in _TRL_IS_MODES:
            raise UnsupportedError(f"vllm_importance_sampling_mode={mode!r} is not one of TRL's modes "
                                   f"({', '.join(_TRL_IS_MODES)}); set one of them.")
        name, level = _TRL_IS_MODES[mode]
        parts["correction"] = (f"vllm_importance_sampling_mode={mode!r}", {
            "correction": name, "is_level": level, "is_min": args.vllm_importance_sampling_clip_min,
            "is_max": args.vllm_importance_sampling_clip_max})
    if args.off_policy_mask_threshold is not None:
        parts["rejection"] = (f"off_policy_mask_threshold={args.off_policy_mask_threshold}", {
            "rejection": "off_policy_seq", "opsm_delta": float(args.off_policy_mask_threshold)})
    if args.top_entropy_quantile < 1.0:
        parts["credit"] = (f"top_entropy_quantile={args.top_entropy_quantile}", {
            "credit": "high_entropy", "entropy_top_frac": float(args.top_entropy_quantile)})
    return parts


_TRL_OFF = {"correction": "vllm_importance_sampling_correction=False", "rejection": "off_policy_mask_threshold=None",
            "credit": "top_entropy_quantile=1.0"}


def objective_for_trl(objective: Objective, args: GRPOConfig) -> Objective:
    """The objective with the parts ``args`` selects (``trl_parts``) filled in where it has none."""
    keywords: dict[str, Any] = {}
    for kind, (_, words) in trl_parts(args).items():
        if objective.parts[kind].name == "none":
            keywords.update(words)
    return objective.replace(**keywords) if keywords else objective


def check_trl_args(objective: Objective, args: GRPOConfig) -> None:
    """Raise :class:`~lmpo.errors.UnsupportedError` (a ``ValueError``) for GRPOConfig settings the adapter cannot
    honour with this objective, and for needs the adapter cannot meet; every problem in one message."""
    problems = host_problems(objective, TRL_HOST)
    if float(args.beta) != float(objective.kl_coef):
        problems.append(
            f"beta={args.beta} but objective.kl_coef={objective.kl_coef}: TRL loads the reference model and "
            f"computes ref log-probs only when beta != 0, and the objective applies its own KL; set "
            f"GRPOConfig(beta={objective.kl_coef}) or Objective(kl_coef={args.beta})."
        )
    if args.entropy_coef != 0.0 or args.use_adaptive_entropy:
        problems.append(
            f"entropy_coef={args.entropy_coef}, use_adaptive_entropy={args.use_adaptive_entropy}: TRL's entropy "
            f"bonus is part of the loss this trainer replaces; use the objective's entropy_coef or "
            f"adaptive_entropy=True (Objective.preset('adaptive_entropy')) and leave TRL's at 0/False."
        )
    for kind, (setting, words) in trl_parts(args).items():
        chosen = objective.parts[kind].name
        if chosen != "none":
            problems.append(
                f"{setting} selects {kind}={words[kind]!r}, but the objective already has {kind}={chosen!r}; keep "
                f"one: turn the TRL setting off ({_TRL_OFF[kind]}) or build the objective with {kind}='none'."
            )
    if args.delta is not None:
        problems.append(
            f"delta={args.delta}: TRL's two-sided ratio cap is not an lmpo part; set delta=None (for a cap on "
            f"negative-advantage terms use Objective(dual_clip=True, dual_clip_c={args.delta}))."
        )
    if args.beta != 0.0 and bool(args.use_bias_correction_kl) != bool(objective.kl_ratio_weighted):
        problems.append(
            f"use_bias_correction_kl={args.use_bias_correction_kl} (TRL's default is True) but the objective has "
            f"kl_ratio_weighted={objective.kl_ratio_weighted}: set GRPOConfig(use_bias_correction_kl="
            f"{objective.kl_ratio_weighted}) or build the objective with kl_ratio_weighted="
            f"{bool(args.use_bias_correction_kl)}."
        )
    if args.scale_rewards != objective.advantage_scale:
        problems.append(
            f"scale_rewards={args.scale_rewards!r} but preset {objective.name!r} expects advantage_scale="
            f"{objective.advantage_scale!r}; set GRPOConfig(scale_rewards={objective.advantage_scale!r}) or "
            f"build the objective with advantage_scale={args.scale_rewards!r}."
        )
    refuse("LmpoGRPOTrainer", problems, "with these settings")


def _warn_ignored_fields(args: GRPOConfig) -> None:
    defaults = {f.name: f.default for f in dataclasses.fields(GRPOConfig) if f.name in _IGNORED_LOSS_FIELDS}
    changed = [f"{k}={getattr(args, k)!r}" for k, v in defaults.items() if getattr(args, k) != v]
    if args.epsilon_high not in (None, args.epsilon):
        changed.append(f"epsilon_high={args.epsilon_high!r}")
    if changed:
        warnings.warn(
            f"LmpoGRPOTrainer ignores {', '.join(changed)}: the lmpo objective defines the importance level, "
            f"trust region and aggregation (set them on the Objective).",
            UserWarning,
            stacklevel=3,
        )


class LmpoGRPOTrainer(GRPOTrainer):
    """``GRPOTrainer`` whose loss is an lmpo ``Objective`` (see the module docstring for the mapping).

    Args:
        model, reward_funcs, args, ...: as ``trl.GRPOTrainer``.
        objective: an ``Objective`` or a preset name (keyword only).
    """

    def __init__(self, model: Any, reward_funcs: Any = None, args: GRPOConfig | None = None, *positional: Any,
                 objective: Objective | str, **kwargs: Any) -> None:
        objective = _as_objective(objective)
        if args is not None:  # fail before TRL loads models
            check_trl_args(objective, args)
        super().__init__(model, reward_funcs, args, *positional, **kwargs)
        self.objective = objective

    # ------------------------------------------------------------------ objective and its state
    @property
    def objective(self) -> Objective:
        return self._lmpo_objective

    @objective.setter
    def objective(self, objective: Objective | str) -> None:
        """Set (or swap) the objective: checked against ``self.args``, TRL's part settings filled in
        (``objective_for_trl``); a fresh entropy controller."""
        objective = _as_objective(objective)
        check_trl_args(objective, self.args)
        _warn_ignored_fields(self.args)
        objective = objective_for_trl(objective, self.args)
        if objective.aggregation == "seq_sum_norm" and objective.norm_constant is None:
            # Dr. GRPO's constant, as TRL's loss_type="dr_grpo" uses
            objective = objective.replace(norm_constant=float(self.args.max_completion_length))
        self._lmpo_objective = objective
        self.lmpo_driver = ObjectiveDriver(objective, TRL_HOST)

    @property
    def entropy_controller(self):
        """The adaptive entropy controller (held by the objective driver), or None."""
        return self.lmpo_driver.controller

    # ------------------------------------------------------------------ the loss
    def _compute_loss(self, model: torch.nn.Module, inputs: dict[str, Any]) -> torch.Tensor:
        prompt_ids, prompt_mask = inputs["prompt_ids"], inputs["prompt_mask"]
        completion_ids, completion_mask = inputs["completion_ids"], inputs["completion_mask"]
        input_ids = torch.cat([prompt_ids, completion_ids], dim=1)  # (B, P+T)
        attention_mask = torch.cat([prompt_mask, completion_mask], dim=1)
        logits_to_keep = completion_ids.size(1)  # T
        # TRL's tool mode (and a rollout_func's env_mask) leaves tool replies inside the completion with tool_mask 0;
        # TRL's loss and its num_items_in_batch use this product, so the objective must too (docs/scaling.md)
        mask = completion_mask if "tool_mask" not in inputs else completion_mask * inputs["tool_mask"]
        extra = {k: inputs.get(k) for k in _MULTIMODAL_KEYS}

        per_token_logps, entropies, aux_loss = self._get_per_token_logps_and_entropies(
            model, input_ids, attention_mask, logits_to_keep, compute_entropy=True,
            compute_aux_loss=self.aux_loss_enabled, **extra,
        )  # (B, T) each
        objective = self.objective
        old = inputs.get("old_per_token_logps")
        old = per_token_logps.detach() if old is None else old
        advantages = inputs["advantages"]  # (B,) or (B, T)
        rollout = None
        if self.lmpo_driver.needs.rollout_logp:
            rollout = inputs.get("sampling_per_token_logps")  # (B, T) vLLM's; absent when TRL generates itself
            rollout = old if rollout is None else torch.where(torch.isnan(rollout), old, rollout)
        token_grad_norm = None
        if self.lmpo_driver.needs.token_grad_norm:
            token_grad_norm = self._token_grad_norm(model, input_ids, attention_mask, completion_ids, extra)

        mode = "train" if self.model.training else "eval"
        accumulation_steps = self.current_gradient_accumulation_steps if mode == "train" else 1
        if objective.aggregation == "token_mean":
            # TRL's loss_type="dapo": num_items_in_batch counts the whole generation batch on all processes
            num_tokens = inputs["num_items_in_batch"].clamp(min=1.0) / self.accelerator.num_processes
            if mode == "train":
                num_tokens = num_tokens * accumulation_steps / self.args.steps_per_generation
            normalisers = {"num_tokens": num_tokens}
        else:  # TRL's loss_type="grpo"/"dr_grpo": a mean over the micro-batch's rows, divided by GA
            normalisers = {"num_seqs": float(per_token_logps.shape[0] * accumulation_steps)}

        driver = self.lmpo_driver
        loss = driver.loss(
            per_token_logps, old, advantages, mask,
            ref_logp=inputs.get("ref_per_token_logps") if driver.needs.ref_logp else None,
            rollout_logp=rollout,
            entropy=entropies,
            token_grad_norm=token_grad_norm,
            **normalisers,
        )
        if self.aux_loss_enabled:  # MoE load balancing, scaled for accumulation as TRL does
            loss = loss + self.router_aux_loss_coef * aux_loss / accumulation_steps
            driver.add_stats({"loss/router_aux": aux_loss.detach()})
        if mode == "eval":  # no accumulation window in evaluation: log this batch now
            self._log_lmpo_stats(driver.end_step(gather=self.accelerator.gather, update_controller=False), "eval")
        return loss

    @torch.no_grad()
    def _token_grad_norm(self, model: torch.nn.Module, input_ids: torch.Tensor, attention_mask: torch.Tensor,
                         completion_ids: torch.Tensor, extra: dict[str, Any]) -> torch.Tensor:
        """(B, T) ‖∇θ log π(y_t)‖ for ``grad_norm_mode`` logits / lm_head from one no-grad forward.

        The weights are detached in the objective, so a separate forward at the same parameters is exact.
        Logits are divided by TRL's sampling temperature, as in TRL's log-probs.
        """
        present = sorted(k for k, v in extra.items() if v is not None)
        if present:
            raise NotImplementedError(
                f"credit='gradient_adaptive' is supported for text-only inputs; this batch has {present}. "
                f"Use credit='none' or 'temporal_decay' with multimodal models."
            )
        length = completion_ids.size(1)
        want_hidden = self.lmpo_driver.needs.token_grad_norm == "lm_head"
        out = model(input_ids=input_ids, attention_mask=attention_mask, use_cache=False,
                    output_hidden_states=want_hidden)
        logits = out.logits[:, -length - 1 : -1, :] / self.temperature  # (B, T, V) predicting completion tokens
        if not want_hidden:
            return logits_grad_norm(logits, completion_ids)
        hidden = out.hidden_states[-1][:, -length - 1 : -1, :]  # (B, T, H) after the final norm
        head = self.accelerator.unwrap_model(model).get_output_embeddings()
        return lm_head_grad_norm(hidden, logits, completion_ids, head_has_bias=getattr(head, "bias", None) is not None,
                                 logit_scale=1.0 / self.temperature)

    # ------------------------------------------------------------------ metrics and the controller
    def _log_lmpo_stats(self, merged: dict[str, float], mode: str) -> None:
        for key, value in merged.items():
            self._metrics[mode][key].append(value)

    def training_step(self, model: torch.nn.Module, inputs: dict[str, Any], num_items_in_batch: Any = None
                      ) -> torch.Tensor:
        output = super().training_step(model, inputs, num_items_in_batch)
        if self.accelerator.sync_gradients:  # last micro-batch of the accumulation window: one gather, floats
            self._log_lmpo_stats(self.lmpo_driver.end_step(gather=self.accelerator.gather), "train")
        return output

    # ------------------------------------------------------------------ checkpoints
    def _save_checkpoint(self, model: Any, trial: Any) -> None:
        super()._save_checkpoint(model, trial)
        if self.entropy_controller is not None and self.args.should_save:
            folder = os.path.join(self._get_output_dir(trial=trial),
                                  f"{PREFIX_CHECKPOINT_DIR}-{self.state.global_step}")
            with open(os.path.join(folder, CONTROLLER_STATE_FILE), "w") as f:
                json.dump(self.entropy_controller.state_dict(), f)

    def _load_optimizer_and_scheduler(self, checkpoint: str | None) -> None:
        super()._load_optimizer_and_scheduler(checkpoint)
        if self.entropy_controller is not None and checkpoint is not None:
            path = os.path.join(checkpoint, CONTROLLER_STATE_FILE)
            if os.path.exists(path):
                with open(path) as f:
                    self.entropy_controller.load_state_dict(json.load(f))


_MULTIMODAL_KEYS = (
    "pixel_values", "image_grid_thw", "num_images", "pixel_attention_mask", "spatial_shapes", "num_tiles",
    "image_sizes", "token_type_ids", "mm_token_type_ids", "image_position_ids",
)
"""Optional inputs TRL forwards to the model (multimodal models); passed through unchanged."""

__all__ = ["CONTROLLER_STATE_FILE", "TESTED_TRL_VERSION", "TRL_HOST", "LmpoGRPOTrainer", "check_trl_args",
           "check_trl_version", "objective_for_trl", "trl_parts"]
