"""TRL ``GRPOConfig`` names as aliases of lmpo's trainer config, and ``lmpo train --from-trl grpo_config.yaml``.

One registry, :data:`TRL_ALIASES`, says for each ``trl.GRPOConfig`` field that lmpo honours which lmpo config
key(s) it sets and how its value converts; :data:`TRL_IGNORED` lists fields that change nothing lmpo computes
(where TRL logs, Hub uploads, data-loader workers …) and :data:`TRL_REFUSED` fields lmpo cannot honour, each
with its reason. docs/trainer.md's mapping table is generated from them (:func:`render_alias_table`, tested).

Two uses:

- an lmpo config may use the mapped TRL names at its top level (``num_generations: 8`` instead of
  ``rollout: {completions_per_prompt: 8}``), :func:`resolve_aliases`;
- ``lmpo train --from-trl grpo_config.yaml`` reads a whole TRL config (:func:`translate_trl`): every key is
  mapped, ignored or refused, and the report lists which. The algorithm-defining keys the file leaves out take
  TRL's defaults (``loss_type: dapo``, ``beta: 0`` …, marked "TRL default"), so the run is the one TRL would
  make. A refused key whose value is TRL's default changes nothing and is ignored; any other refused key stops
  the command after the report; a key that is no ``GRPOConfig`` field is an error naming it.

Semantics follow ``trl/trainer/grpo_config.py`` and ``GRPOTrainer._compute_loss`` (TRL 1.16) on one process:
``loss_type`` selects the aggregation (``grpo``/``sapo`` = per-sequence token means, ``bnpo``/``dapo``/``cispo``/
``vespo`` = token mean, ``dr_grpo`` = token sum over B·``max_completion_length``, ``luspo`` = per-sequence token
sums) and, for ``cispo``/``sapo``/``vespo``, the trust region; TRL's ``epsilon_high`` with ``cispo`` is the cap
itself (5.0), lmpo's ``eps_high`` the cap minus 1. A generation batch of ``per_device_train_batch_size ×
steps_per_generation`` completions (``steps_per_generation`` defaults to ``gradient_accumulation_steps``) is
``num_generations`` completions per prompt, split into ``steps_per_generation / gradient_accumulation_steps``
optimizer steps.
"""

from __future__ import annotations

import difflib
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from lmpo.config import ConfigError
from lmpo.errors import InputError


@dataclass(frozen=True)
class Alias:
    """One TRL field lmpo honours: ``targets`` (dotted lmpo keys) it sets, through ``convert`` (value →
    {lmpo key: value}, default: the value unchanged on the single target)."""

    trl: str
    targets: tuple[str, ...]
    note: str = ""
    convert: Callable[[Any, Mapping[str, Any]], dict[str, Any]] | None = None
    #: take TRL's default when a --from-trl file leaves it out (it defines the algorithm)
    fill_default: bool = False

    def apply(self, value: Any, trl: Mapping[str, Any]) -> dict[str, Any]:
        if self.convert is None:  # None: TRL leaves the choice to its code (e.g. bf16 by hardware), lmpo too
            return {} if value is None else {self.targets[0]: value}
        return self.convert(value, trl)


# ---------------------------------------------------------------------------------------------- converters

#: TRL loss_type → objective overrides (aggregation; trust region where the loss type fixes one)
LOSS_TYPES: dict[str, dict[str, Any]] = {
    "grpo": {"aggregation": "seq_mean_token_mean"},
    "bnpo": {"aggregation": "token_mean"},
    "dr_grpo": {"aggregation": "seq_sum_norm"},
    "dapo": {"aggregation": "token_mean"},
    "cispo": {"aggregation": "token_mean", "trust_region": "cispo"},
    "sapo": {"aggregation": "seq_mean_token_mean", "trust_region": "sapo"},
    "vespo": {"aggregation": "token_mean", "trust_region": "vespo"},
    "luspo": {"aggregation": "seq_mean_token_sum"},
}


def _choice(name: str, table: Mapping[Any, Any]) -> Callable[[Any], Any]:
    def convert(value: Any) -> Any:
        key = value.lower() if isinstance(value, str) else value
        if key not in table:
            raise _Refuse(f"{name}={value!r} has no lmpo equivalent (lmpo knows {', '.join(map(repr, table))})")
        return table[key]
    return convert


class _Refuse(Exception):
    """A value of a mapped key that lmpo cannot honour (reported as refused, with this reason)."""


def _loss_type(value, trl):
    overrides = dict(_choice("loss_type", LOSS_TYPES)(value))
    if value == "dr_grpo":  # TRL divides by B · max_completion_length
        overrides["norm_constant"] = float(trl.get("max_completion_length") or 512)
    return {f"objective.overrides.{k}": v for k, v in overrides.items()}


#: loss types without a clip: TRL does not read epsilon / epsilon_high there
_UNCLIPPED = ("sapo", "vespo")


def _epsilon(value, trl):
    return {} if trl.get("loss_type") in _UNCLIPPED else {"objective.overrides.eps_low": value}


def _epsilon_high(value, trl):
    if value is None or trl.get("loss_type") in _UNCLIPPED:  # TRL: epsilon_high = epsilon
        return {}
    # cispo: TRL clamps the IS weight at epsilon_high itself; lmpo's cispo cap is 1 + eps_high
    return {"objective.overrides.eps_high": value - 1.0 if trl.get("loss_type") == "cispo" else value}


def _entropy_quantile(value, trl):
    if value >= 1.0:
        return {}
    return {"objective.overrides.credit": "high_entropy", "objective.overrides.entropy_top_frac": value}


def _off_policy_mask(value, trl):
    if value is None:
        return {}
    return {"objective.overrides.rejection": "off_policy_seq", "objective.overrides.opsm_delta": value}


def _only_with(loss_type: str, key: str):
    """A parameter TRL reads only for one loss type (sapo's temperatures, vespo's Gamma weights)."""
    return lambda value, trl: {key: value} if trl.get("loss_type") == loss_type else {}


def _report_to(value, trl):
    names = [value] if isinstance(value, str) else list(value or [])
    names = [n.lower() for n in names]
    everything = "all" in names
    return {"logging.tensorboard": everything or "tensorboard" in names,
            "logging.wandb": everything or "wandb" in names}


def _batch(value, trl):
    """TRL's generation batch on one process → prompts per step, minibatches per step, sequences per microbatch."""
    per_device = int(trl.get("per_device_train_batch_size") or 8)
    accumulation = int(trl.get("gradient_accumulation_steps") or 1)
    group = int(trl.get("num_generations") or 8)
    steps_per_gen = trl.get("steps_per_generation")
    gen_batch = trl.get("generation_batch_size")
    if steps_per_gen is None:
        steps_per_gen = gen_batch // per_device if gen_batch else accumulation
    gen_batch = gen_batch or per_device * steps_per_gen
    if gen_batch % group:
        raise _Refuse(f"a generation batch of {gen_batch} completions is not a whole number of groups of "
                      f"num_generations={group}")
    if steps_per_gen % accumulation:
        raise _Refuse(f"steps_per_generation={steps_per_gen} is not a multiple of gradient_accumulation_steps="
                      f"{accumulation}, so a generation batch is no whole number of optimizer steps")
    return {"loop.prompts_per_step": gen_batch // group, "loop.minibatches_per_step": steps_per_gen // accumulation,
            "loop.seqs_per_microbatch": per_device}


def _ref_sync(value, trl):
    """TR-DPO: every ref_model_sync_steps optimizer steps, ref ← α·π + (1 − α)·ref (TRL's SyncRefModelCallback)."""
    if not trl.get("sync_ref_model"):
        return {}
    return {"objective.ref_sync_steps": int(trl.get("ref_model_sync_steps", 512)),
            "objective.ref_sync_alpha": float(trl.get("ref_model_mixup_alpha", 0.6))}


def _betas(value, trl):
    return {"optim.betas": [float(trl.get("adam_beta1", 0.9)), float(trl.get("adam_beta2", 0.999))]}


def _bool_to(key: str, true, false):
    return lambda value, trl: {key: true if value else false}


def _simple(key: str, fn: Callable[[Any], Any]):
    return lambda value, trl: {key: fn(value)}


_BATCH_KEYS = ("loop.prompts_per_step", "loop.minibatches_per_step", "loop.seqs_per_microbatch")
_BATCH_NOTE = ("generation batch = per_device_train_batch_size × steps_per_generation completions "
               "(steps_per_generation defaults to gradient_accumulation_steps); prompts_per_step = that / "
               "num_generations; minibatches_per_step = steps_per_generation / gradient_accumulation_steps")

TRL_ALIASES: dict[str, Alias] = {a.trl: a for a in [
    Alias("num_generations", ("rollout.completions_per_prompt",), "G, completions per prompt", fill_default=True),
    Alias("max_completion_length", ("rollout.max_new_tokens",), "", fill_default=True),
    Alias("temperature", ("rollout.temperature",), "", fill_default=True),
    Alias("top_p", ("rollout.top_p",), "", fill_default=True),
    Alias("top_k", ("rollout.top_k",), "None or 0 = off", _simple("rollout.top_k", lambda v: int(v or 0)),
          fill_default=True),
    Alias("use_vllm", ("rollout.engine",), "true → `vllm` (colocated), false → `hf`",
          _bool_to("rollout.engine", "vllm", "hf")),
    Alias("beta", ("objective.overrides.kl_coef",), "β of the reference-KL term", fill_default=True),
    Alias("epsilon", ("objective.overrides.eps_low",), "not read by `loss_type: sapo / vespo`", _epsilon,
          fill_default=True),
    Alias("epsilon_high", ("objective.overrides.eps_high",),
          "None = epsilon; with `loss_type: cispo` TRL's value is the cap, lmpo's eps_high = value − 1",
          _epsilon_high, fill_default=True),
    Alias("loss_type", ("objective.overrides.aggregation", "objective.overrides.trust_region",
                        "objective.overrides.norm_constant"),
          "see the loss_type table", _loss_type, fill_default=True),
    Alias("importance_sampling_level", ("objective.overrides.level",), "`token` or `sequence` (GSPO)",
          _simple("objective.overrides.level", _choice("importance_sampling_level",
                                                       {"token": "token", "sequence": "sequence"})),
          fill_default=True),
    Alias("mask_truncated_completions", ("objective.mask_truncated_completions",), ""),
    Alias("delta", ("objective.overrides.dual_clip", "objective.overrides.dual_clip_c"),
          "INTELLECT-2's cap equals the dual clip with c = δ when δ > 1 + ε",
          lambda v, trl: {} if v is None else {"objective.overrides.dual_clip": True,
                                               "objective.overrides.dual_clip_c": float(v)}),
    Alias("scale_rewards", ("objective.overrides.advantage_scale",), "true/`group`, `batch`, false/`none`",
          _simple("objective.overrides.advantage_scale", _choice(
              "scale_rewards", {True: "group", False: "none", "group": "group", "batch": "batch", "none": "none"})),
          fill_default=True),
    Alias("top_entropy_quantile", ("objective.overrides.credit", "objective.overrides.entropy_top_frac"),
          "ρ < 1 → credit `high_entropy` with entropy_top_frac ρ (1 = off)", _entropy_quantile),
    Alias("off_policy_mask_threshold", ("objective.overrides.rejection", "objective.overrides.opsm_delta"),
          "δ → rejection `off_policy_seq` with opsm_delta δ (None = off)", _off_policy_mask),
    Alias("sapo_temperature_pos", ("objective.overrides.sapo_tau_pos",), "with `loss_type: sapo` only",
          _only_with("sapo", "objective.overrides.sapo_tau_pos")),
    Alias("sapo_temperature_neg", ("objective.overrides.sapo_tau_neg",), "with `loss_type: sapo` only",
          _only_with("sapo", "objective.overrides.sapo_tau_neg")),
    Alias("vespo_k_pos", ("objective.overrides.vespo_k_pos",), "with `loss_type: vespo` only",
          _only_with("vespo", "objective.overrides.vespo_k_pos")),
    Alias("vespo_lambda_pos", ("objective.overrides.vespo_lambda_pos",), "with `loss_type: vespo` only",
          _only_with("vespo", "objective.overrides.vespo_lambda_pos")),
    Alias("vespo_k_neg", ("objective.overrides.vespo_k_neg",), "with `loss_type: vespo` only",
          _only_with("vespo", "objective.overrides.vespo_k_neg")),
    Alias("vespo_lambda_neg", ("objective.overrides.vespo_lambda_neg",), "with `loss_type: vespo` only",
          _only_with("vespo", "objective.overrides.vespo_lambda_neg")),
    Alias("sync_ref_model", ("objective.ref_sync_steps", "objective.ref_sync_alpha"),
          "true → TR-DPO reference sync every ref_model_sync_steps optimizer steps with α = ref_model_mixup_alpha "
          "(needs a KL: beta > 0)", _ref_sync),
    Alias("ref_model_sync_steps", ("objective.ref_sync_steps", "objective.ref_sync_alpha"),
          "see sync_ref_model", _ref_sync),
    Alias("ref_model_mixup_alpha", ("objective.ref_sync_steps", "objective.ref_sync_alpha"),
          "see sync_ref_model", _ref_sync),
    Alias("num_iterations", ("loop.epochs_per_step",), "μ, passes over each generation batch", fill_default=True),
    Alias("per_device_train_batch_size", _BATCH_KEYS, _BATCH_NOTE, _batch, fill_default=True),
    Alias("gradient_accumulation_steps", _BATCH_KEYS, "see per_device_train_batch_size", _batch, fill_default=True),
    Alias("steps_per_generation", _BATCH_KEYS, "see per_device_train_batch_size", _batch),
    Alias("generation_batch_size", _BATCH_KEYS, "see per_device_train_batch_size", _batch),
    Alias("max_steps", ("loop.steps",), "RL steps (one generation batch each)"),
    Alias("seed", ("loop.seed",)),
    Alias("gradient_checkpointing", ("loop.gradient_checkpointing",)),
    Alias("bf16", ("loop.autocast",), "bfloat16 autocast of the forward passes"),
    Alias("learning_rate", ("optim.lr",), "", fill_default=True),
    Alias("lr_scheduler_type", ("optim.schedule",), "`constant`, `constant_with_warmup`, `linear`, `cosine`",
          _simple("optim.schedule", _choice("lr_scheduler_type", {
              "constant": "constant", "constant_with_warmup": "constant", "linear": "linear", "cosine": "cosine"})),
          fill_default=True),
    Alias("warmup_steps", ("optim.warmup_steps",), "", _simple("optim.warmup_steps", int)),
    Alias("weight_decay", ("optim.weight_decay",)),
    Alias("adam_beta1", ("optim.betas",), "with adam_beta2", _betas),
    Alias("adam_beta2", ("optim.betas",), "with adam_beta1", _betas),
    Alias("adam_epsilon", ("optim.eps",)),
    Alias("max_grad_norm", ("optim.max_grad_norm",)),
    Alias("reward_weights", ("rewards.weights",), "None = all 1", _simple("rewards.weights", lambda v: list(v or []))),
    Alias("output_dir", ("logging.run_dir",)),
    Alias("logging_steps", ("logging.print_every_steps",), "", _simple("logging.print_every_steps", int)),
    Alias("report_to", ("logging.tensorboard", "logging.wandb"), "`tensorboard`, `wandb`, `all`, `none`",
          _report_to),
    Alias("save_steps", ("checkpoint.every_steps",), "", _simple("checkpoint.every_steps", int)),
    Alias("save_total_limit", ("checkpoint.keep_last",), "None = keep all",
          _simple("checkpoint.keep_last", lambda v: int(v or 0))),
    Alias("eval_steps", ("eval.every_steps",), "None = only before and after training",
          _simple("eval.every_steps", lambda v: int(v or 0))),
]}

#: fields that change nothing lmpo computes: name → reason
TRL_IGNORED: dict[str, str] = {
    **dict.fromkeys(("logging_dir", "logging_first_step", "logging_strategy", "logging_nan_inf_filter",
                     "log_level", "log_level_replica", "log_on_each_node", "log_completions",
                     "num_completions_to_print", "run_name", "disable_tqdm",
                     "include_num_input_tokens_seen"),
                    "console and logging details (lmpo logs to RUN_DIR/metrics.jsonl and its console)"),
    **dict.fromkeys(("push_to_hub", "hub_model_id", "hub_strategy", "hub_token", "hub_private_repo",
                     "hub_always_push"), "Hub uploads (lmpo writes RUN_DIR/model/; upload it yourself)"),
    **dict.fromkeys(("save_strategy", "save_only_model",
                     "eval_strategy", "do_train", "do_eval", "per_device_eval_batch_size",
                     "num_generations_eval"),
                    "lmpo checkpoints (safetensors, manifests) and evaluates on its own schedule"),
    **dict.fromkeys(("dataloader_num_workers", "dataloader_pin_memory", "dataloader_drop_last",
                     "dataloader_persistent_workers", "dataloader_prefetch_factor", "remove_unused_columns",
                     "shuffle_dataset", "ddp_find_unused_parameters", "ddp_timeout", "ddp_backend",
                     "use_cpu", "local_rank", "accelerator_config", "debug", "pad_to_multiple_of"),
                    "data loading, padding and process-group details of the HF Trainer"),
}

#: fields lmpo cannot honour (unless they hold TRL's default): name → reason
TRL_REFUSED: dict[str, str] = {
    "fp16": "lmpo autocasts to bfloat16 only (bf16 / loop.autocast)",
    "entropy_coef": "TRL's bonus is the plain token mean of the entropy whatever the loss type; lmpo's "
                    "objective.overrides.entropy_coef uses the objective's aggregation — set that instead",
    "use_adaptive_entropy": "use objective.overrides.entropy_control: adaptive (lmpo's controller)",
    "num_train_epochs": "lmpo counts RL steps: give max_steps",
    "multi_objective_aggregation": "lmpo sums the weighted rewards, then normalises (TRL's default)",
    "vllm_mode": "lmpo runs vLLM colocated only (rollout.engine: vllm)",
    "vllm_importance_sampling_correction": "lmpo's rollout corrections are objective parts: "
                                           "objective.overrides.correction (tis / mis)",
    "use_liger_kernel": "lmpo computes log-probs with its own chunked log-softmax",
    "model_init_kwargs": "give model.name and model.dtype in lmpo's config",
    "warmup_ratio": "give warmup_steps",
}


# ---------------------------------------------------------------------------------------------- translation


def _set(data: dict, dotted: str, value: Any) -> None:
    node = data
    *path, last = dotted.split(".")
    for part in path:
        node = node.setdefault(part, {})
        if not isinstance(node, dict):
            raise ConfigError(f"{dotted}: {part} is not a section in this config")
    node[last] = value


def _get(data: Mapping, dotted: str) -> Any:
    node: Any = data
    for part in dotted.split("."):
        if not isinstance(node, Mapping) or part not in node:
            return _MISSING
        node = node[part]
    return node


_MISSING = object()


def resolve_aliases(data: Mapping[str, Any] | None) -> dict:
    """An lmpo config dict with its top-level TRL aliases (:data:`TRL_ALIASES`) moved to their lmpo keys.

    A TRL name lmpo only ignores or refuses, and an alias that contradicts the lmpo key it sets, raise
    :class:`ConfigError`."""
    data = dict(data or {})
    trl = {k: data.pop(k) for k in list(data) if k in TRL_ALIASES}
    for key in list(data):
        if key in TRL_IGNORED or key in TRL_REFUSED:
            reason = TRL_IGNORED.get(key) or TRL_REFUSED[key]
            raise ConfigError(f"{key}: a TRL GRPOConfig field that an lmpo config does not accept ({reason}). "
                              "Remove it, or read a whole TRL config with `lmpo train --from-trl FILE`.")
    if not trl:
        return data
    out = {k: (dict(v) if isinstance(v, Mapping) else v) for k, v in data.items()}
    for section in ("objective",):
        if isinstance(out.get(section), dict) and isinstance(out[section].get("overrides"), Mapping):
            out[section]["overrides"] = dict(out[section]["overrides"])
    for name, value in trl.items():
        try:
            mapped = TRL_ALIASES[name].apply(value, trl)
        except _Refuse as e:
            raise ConfigError(f"{name}: {e}.") from None
        for key, v in mapped.items():
            have = _get(out, key)
            if have is not _MISSING and have != v:
                raise ConfigError(f"{name}: {value!r} (the TRL name of {key}) contradicts {key}: {have!r} in the "
                                  "same config; give one of them.")
            _set(out, key, v)
    return out


@dataclass
class TrlTranslation:
    """What :func:`translate_trl` made of a TRL config: the lmpo config dict and the three lists."""

    config: dict
    #: TRL key → (value, {lmpo key: value}, whether the value is TRL's default filled in)
    mapped: dict[str, tuple[Any, dict[str, Any], bool]]
    ignored: dict[str, str]
    refused: dict[str, str]

    def report(self) -> str:
        lines = [f"lmpo train --from-trl: {len(self.mapped)} mapped, {len(self.ignored)} ignored, "
                 f"{len(self.refused)} refused"]
        lines.append("mapped:")
        for name, (value, keys, filled) in self.mapped.items():
            target = ", ".join(f"{k}={v!r}" for k, v in keys.items()) or "(nothing to set)"
            lines.append(f"  {name}: {value!r}{' (TRL default)' if filled else ''} -> {target}")
        lines.append("ignored:")
        lines += [f"  {name}: {reason}" for name, reason in self.ignored.items()] or ["  (none)"]
        lines.append("refused:")
        lines += [f"  {name}: {reason}" for name, reason in self.refused.items()] or ["  (none)"]
        return "\n".join(lines)


def trl_defaults() -> dict[str, Any]:
    """Every ``trl.GRPOConfig`` field with its default (needs TRL installed: ``pip install 'lmpo[trl]'``)."""
    import dataclasses

    try:
        from trl import GRPOConfig
    except ImportError as e:
        raise InputError(f"--from-trl reads TRL's GRPOConfig fields, and TRL is not installed ({e}); install it "
                         "with pip install 'lmpo[trl]'.") from None
    out = {}
    for f in dataclasses.fields(GRPOConfig):
        if f.default is not dataclasses.MISSING:
            out[f.name] = f.default
        elif f.default_factory is not dataclasses.MISSING:
            out[f.name] = f.default_factory()
        else:
            out[f.name] = None
    return out


def _plain(value: Any) -> Any:
    """Enum values (TRL's SchedulerType …) as their strings, for comparison with YAML values."""
    return getattr(value, "value", value)


def translate_trl(trl_config: Mapping[str, Any], defaults: Mapping[str, Any] | None = None) -> TrlTranslation:
    """A TRL ``GRPOConfig`` dict (a YAML file, or ``GRPOConfig.to_dict()``) → lmpo config dict and the report.

    ``defaults``: TRL's field defaults (:func:`trl_defaults` when not given). Raises :class:`InputError` for a
    key that is no GRPOConfig field."""
    defaults = dict(trl_defaults() if defaults is None else defaults)
    given = dict(trl_config)
    unknown = [k for k in given if k not in defaults and k not in TRL_ALIASES]
    if unknown:
        hints = []
        for k in unknown:
            close = difflib.get_close_matches(k, list(defaults), n=1)
            hints.append(f"{k!r}" + (f" (did you mean {close[0]!r}?)" if close else ""))
        raise InputError(f"--from-trl: {', '.join(hints)} {'is' if len(unknown) == 1 else 'are'} no field of TRL's "
                         "GRPOConfig; fix or remove it (see docs/trainer.md, 'TRL names').")
    effective = dict(given)
    filled = set()
    for name, alias in TRL_ALIASES.items():
        if alias.fill_default and name not in effective and name in defaults:
            effective[name] = _plain(defaults[name])
            filled.add(name)
    config: dict = {}
    mapped: dict[str, tuple[Any, dict[str, Any], bool]] = {}
    ignored: dict[str, str] = {}
    refused: dict[str, str] = {}
    for name, value in effective.items():
        value = _plain(value)
        if name in TRL_ALIASES:
            try:
                keys = TRL_ALIASES[name].apply(value, effective)
            except _Refuse as e:
                refused[name] = str(e)
                continue
            mapped[name] = (value, keys, name in filled)
            for key, v in keys.items():
                _set(config, key, v)
        elif name in TRL_IGNORED:
            ignored[name] = TRL_IGNORED[name]
        elif value == _plain(defaults.get(name, _MISSING)):
            ignored[name] = "TRL's default (changes nothing)"
        elif name in TRL_REFUSED:
            refused[name] = TRL_REFUSED[name]
        else:
            refused[name] = "no lmpo equivalent"
    return TrlTranslation(config, mapped, ignored, refused)


def render_alias_table() -> str:
    """docs/trainer.md's TRL table: every mapped, ignored and refused GRPOConfig field (from the registry)."""
    rows = ["| TRL `GRPOConfig` field | lmpo config key(s) | notes |", "|---|---|---|"]
    for a in TRL_ALIASES.values():
        note = a.note + ("; TRL's default when left out (`--from-trl`)" if a.fill_default else "")
        rows.append(f"| `{a.trl}` | {', '.join(f'`{t}`' for t in a.targets)} | {note.strip('; ')} |")
    rows += ["", "| TRL `loss_type` | lmpo `objective.overrides` |", "|---|---|"]
    for name, overrides in LOSS_TYPES.items():
        extra = ", `norm_constant`: max_completion_length" if name == "dr_grpo" else ""
        rows.append(f"| `{name}` | {', '.join(f'`{k}`: `{v}`' for k, v in overrides.items())}{extra} |")
    rows += ["", "| ignored (harmless) | why |", "|---|---|"]
    by_reason: dict[str, list[str]] = {}
    for name, reason in TRL_IGNORED.items():
        by_reason.setdefault(reason, []).append(name)
    rows += [f"| {', '.join(f'`{n}`' for n in names)} | {reason} |" for reason, names in by_reason.items()]
    rows += ["", "| refused (unless TRL's default) | why |", "|---|---|"]
    rows += [f"| `{name}` | {reason} |" for name, reason in TRL_REFUSED.items()]
    return "\n".join(rows) + "\n"
