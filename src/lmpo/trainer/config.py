"""Configuration of a training run: one frozen dataclass per component, documented in one place.

Every field carries its documentation in ``field(metadata={"help": ...})``; ``docs/trainer.md``'s config
reference is rendered from these (``render_config_reference``) and a test checks that the two agree.

A run is described by :class:`TrainConfig`, built from a YAML file plus dotted overrides::

    cfg = load_config("configs/demo.yaml", overrides=["--objective.preset", "dapo", "--optim.lr", "1e-4"])

:func:`validate_config` runs before any model is built and raises :class:`ConfigError` whose message names
the field, the offending value and how to fix it.
"""

from __future__ import annotations

import dataclasses
import difflib
import importlib
import os
import types
import typing
from dataclasses import dataclass, field
from typing import Any

import yaml

from lmpo.errors import InputError
from lmpo.overrides import parse_overrides as _parse_overrides
from lmpo.rlvcr.config import RLVCRConfig


class ConfigError(InputError):
    """A configuration value is invalid. The message names the field, the value and the fix."""


def _f(default: Any, help: str, **kw: Any) -> Any:
    """A dataclass field with its documentation; mutable defaults go through a factory."""
    if isinstance(default, (dict, list)):
        return field(default_factory=lambda d=default: type(d)(d), metadata={"help": help, **kw})
    return field(default=default, metadata={"help": help, **kw})


# ----------------------------------------------------------------------------------------------------
# Components
# ----------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class LoraConfig:
    """Optional LoRA adapters through PEFT; only the adapter weights are trained."""

    enabled: bool = _f(False, "Wrap the policy in PEFT LoRA adapters (needs `peft`).")
    r: int = _f(8, "LoRA rank.")
    alpha: int = _f(16, "LoRA scaling numerator (`lora_alpha`); the update is scaled by alpha / r.")
    dropout: float = _f(0.0, "Dropout on the LoRA branch (keep 0 for bit-exact resume).")
    target_modules: tuple[str, ...] = _f(
        ("q_proj", "k_proj", "v_proj", "o_proj"), "Module names (suffixes) that get adapters."
    )


@dataclass(frozen=True)
class ModelConfig:
    """The policy (and reference) model."""

    name: str = _f("tiny", "A built-in preset of `lmpo.models.MODEL_PRESETS` (built in code, offline) or a "
                   "Hugging Face model name / local path for `AutoModelForCausalLM`.")
    init_seed: int = _f(0, "Seed of the random initialisation of a built-in preset.")
    dtype: str = _f("float32", "Parameter dtype: float32 | bfloat16 | float16.")
    ref_path: str | None = _f(None, "Reference model for the KL term; default: a frozen copy of the initial "
                              "policy (after the supervised warm-up). Only loaded when the objective needs it.")
    lora: LoraConfig = _f(LoraConfig(), "LoRA adapters (section `model.lora`).")


@dataclass(frozen=True)
class TaskConfig:
    """Where prompts and reference answers come from."""

    name: str = _f("addition", "A built-in task of `lmpo.tasks.TASKS`, or `file` (local JSON/JSONL/Parquet, "
                   "see `path`) or `hf` (a Hugging Face `datasets` name, see `hf_name`).")
    path: str | None = _f(None, "Local data file for `name: file`.")
    hf_name: str | None = _f(None, "Dataset name for `name: hf`.")
    prompt_field: str = _f("prompt", "Column holding the prompt (file / hf tasks).")
    answer_field: str = _f("answer", "Column holding the reference answer (file / hf tasks).")
    options: dict = _f({}, "Keyword options of the task constructor (e.g. `{min_digits: 1, max_digits: 3}` for addition).")
    eval_examples: int = _f(200, "Number of held-out examples used by evaluation (examples, not batches).")


@dataclass(frozen=True)
class RolloutConfig:
    """Sampling of completions (batched HF generate with KV cache, left padding, EOS stop)."""

    completions_per_prompt: int = _f(8, "G: completions sampled per prompt (a group). GRPO-style group "
                                     "advantages need G >= 2.")
    max_new_tokens: int = _f(16, "Maximum completion length in tokens.")
    temperature: float = _f(1.0, "Sampling temperature (> 0).")
    top_p: float = _f(1.0, "Nucleus sampling mass (1 = off).")
    top_k: int = _f(0, "Top-k sampling (0 = off).")
    ignore_eos: bool = _f(False, "Keep generating after EOS to exactly max_new_tokens (benchmarks use "
                          "this to force equal lengths).")
    engine: str = _f("hf", "Generation engine, a name of `lmpo.generation.ENGINES`: `hf` (any Hugging Face causal "
                     "LM, static KV cache, each prompt pre-filled once) or `vllm` (vLLM colocated on the training "
                     "GPU, weights synced after every step; needs `lmpo[vllm]` and CUDA).")
    record_logprobs: bool = _f(False, "Record the sampler's log-probs of the sampled tokens (`log softmax(logits / "
                               "temperature)`, the rollout log-probs of mismatch corrections); vLLM records them "
                               "whatever this is.")
    vllm_gpu_memory_utilization: float = _f(0.3, "Fraction of the GPU's memory vLLM may take for its weights and KV "
                                            "cache (`engine: vllm`); the rest is left to training.")


@dataclass(frozen=True)
class RewardsConfig:
    """Reward functions, summed with weights."""

    functions: tuple[str, ...] = _f((), "Built-in names of `lmpo.rewards.REWARDS` or user functions "
                                    "`package.module:function`; empty = the task's default rewards.")
    weights: tuple[float, ...] = _f((), "One weight per function (empty = all 1).")
    kwargs: dict = _f({}, "Keyword options per function name, e.g. `{length_penalty: {target_chars: 8}}`.")
    on_error: str = _f("raise", "A reward function that raises: `raise` (error naming the function and the "
                       "sample) or `skip` (reward 0 for that sample, counted in `reward/errors`).")
    success_threshold: float = _f(1.0, "A completion counts as correct (`reward/accuracy`, "
                                  "`eval/accuracy`) when the task's accuracy reward is >= this.")


@dataclass(frozen=True)
class ObjectiveConfig:
    """The policy objective (`lmpo.objectives`) and the advantages fed to it."""

    preset: str = _f("grpo", "A preset of `lmpo.objectives.PRESETS`.")
    overrides: dict = _f({}, "Field-by-field overrides of the preset, any `lmpo.objectives.Objective` field "
                         "(e.g. `{eps_high: 0.3, kl_coef: 0.01, grad_norm_mode: logits}`).")
    advantage_estimator: str = _f("grpo", "An estimator of `lmpo.objectives.advantages.ADVANTAGE_ESTIMATORS`.")
    filter_zero_variance: bool = _f(False, "Drop groups whose rewards are all equal before the update (DAPO "
                                    "dynamic-sampling statistic: `adv/zero_var_frac`).")


@dataclass(frozen=True)
class OptimConfig:
    """AdamW and the learning-rate schedule."""

    lr: float = _f(1e-5, "Peak learning rate.")
    betas: tuple[float, float] = _f((0.9, 0.999), "AdamW betas.")
    eps: float = _f(1e-8, "AdamW epsilon.")
    weight_decay: float = _f(0.0, "Decoupled weight decay.")
    max_grad_norm: float = _f(1.0, "Clip the global gradient norm to this (0 = no clipping).")
    warmup_steps: int = _f(0, "Linear warm-up length in optimizer steps.")
    schedule: str = _f("constant", "After warm-up: constant | linear | cosine (decay to min_lr_ratio·lr over "
                       "the run's optimizer steps).")
    min_lr_ratio: float = _f(0.0, "Final learning rate of linear / cosine as a fraction of lr.")


@dataclass(frozen=True)
class LoopConfig:
    """The RL loop: how much data per step and how it is split."""

    steps: int = _f(100, "Number of RL steps (each: one rollout batch, then epochs × minibatches updates).")
    prompts_per_step: int = _f(16, "Prompts sampled per step; sequences per step = prompts_per_step × G.")
    epochs_per_step: int = _f(1, "Passes over each step's rollout batch (> 1 makes updates off-policy).")
    minibatches_per_step: int = _f(1, "Optimizer steps per epoch; the rollout batch is split into this many "
                                   "minibatches (> 1 makes updates off-policy).")
    seqs_per_microbatch: int = _f(64, "Sequences per forward/backward pass (gradient accumulation inside a "
                                  "minibatch, with exact global normalisation).")
    share_prompt_prefix: bool = _f(True, "Training forward: run each prompt once per group and reuse its KV cache "
                                   "(with gradient) for its G completions; the same log-probs for less compute.")
    gradient_checkpointing: bool = _f(False, "Recompute each layer's activations in the backward pass instead of "
                                      "keeping them (less memory, about one more forward of compute); turns "
                                      "`share_prompt_prefix` off for the training forward.")
    autocast: bool = _f(False, "Run the forward passes (generation and log-probs) under bfloat16 autocast; "
                        "parameters, gradients and optimizer state keep the model's dtype.")
    seed: int = _f(0, "Seed of data order, sampling and clip_cov selection.")
    max_nonfinite_steps: int = _f(5, "Stop after this many consecutive steps with a non-finite loss or "
                                  "gradient (each is skipped and counted).")
    device: str = _f("auto", "auto | cpu | cuda | mps.")
    num_threads: int = _f(0, "torch CPU threads (0 = torch's default).")


@dataclass(frozen=True)
class SFTConfig:
    """Optional supervised warm-up on the task's reference answers before RL."""

    steps: int = _f(0, "Supervised optimizer steps (0 = no warm-up).")
    lr: float = _f(1e-3, "Learning rate of the warm-up (constant, AdamW).")
    seqs_per_step: int = _f(32, "Prompt+answer sequences per warm-up step.")
    max_examples: int = _f(0, "Draw warm-up examples from only the first N training examples (0 = all).")
    stop_at_accuracy: float = _f(0.0, "Stop the warm-up early once greedy accuracy on `check_examples` TRAINING "
                                 "prompts reaches this (0 = always run `steps`); makes the RL start comparable "
                                 "across seeds. The held-out split is never looked at.")
    check_every_steps: int = _f(50, "How often the early-stop accuracy is measured (warm-up steps).")
    check_examples: int = _f(200, "Training prompts used for the early-stop accuracy.")


@dataclass(frozen=True)
class EvalConfig:
    """Greedy evaluation on the held-out split."""

    every_steps: int = _f(0, "Evaluate every N RL steps (0 = only before and after training).")
    at_start: bool = _f(True, "Evaluate before the first RL step (after the warm-up).")
    seqs_per_batch: int = _f(256, "Prompts per greedy generation batch.")
    max_new_tokens: int | None = _f(None, "Completion length at evaluation (default: rollout.max_new_tokens).")


@dataclass(frozen=True)
class CheckpointConfig:
    """Checkpoints in RUN_DIR/checkpoints/step_XXXXXXXX (atomic: temp dir + rename)."""

    every_steps: int = _f(0, "Write a checkpoint every N RL steps (0 = only at the end).")
    keep_last: int = _f(2, "Keep the newest N checkpoints (0 = keep all).")
    at_end: bool = _f(True, "Write a checkpoint after the last step.")


@dataclass(frozen=True)
class LoggingConfig:
    """Where the run writes and what it reports."""

    run_dir: str = _f("runs/run", "Run directory (config.yaml, metrics.jsonl, tensorboard/, checkpoints/).")
    progress_bar: bool = _f(True, "tqdm progress bar on the console.")
    tensorboard: bool = _f(True, "Write TensorBoard event files to RUN_DIR/tensorboard.")
    wandb: bool = _f(False, "Log to Weights & Biases (needs `wandb` installed).")
    wandb_project: str = _f("lmpo", "W&B project name.")
    print_every_steps: int = _f(0, "Also print a one-line metric summary every N steps (0 = never).")


@dataclass(frozen=True)
class TrainConfig:
    """A complete training run."""

    model: ModelConfig = _f(ModelConfig(), "Model section.")
    task: TaskConfig = _f(TaskConfig(), "Task / data section.")
    rollout: RolloutConfig = _f(RolloutConfig(), "Rollout section.")
    rewards: RewardsConfig = _f(RewardsConfig(), "Rewards section.")
    objective: ObjectiveConfig = _f(ObjectiveConfig(), "Objective section.")
    optim: OptimConfig = _f(OptimConfig(), "Optimizer section.")
    loop: LoopConfig = _f(LoopConfig(), "Loop section.")
    sft: SFTConfig = _f(SFTConfig(), "Supervised warm-up section.")
    eval: EvalConfig = _f(EvalConfig(), "Evaluation section.")
    checkpoint: CheckpointConfig = _f(CheckpointConfig(), "Checkpoint section.")
    logging: LoggingConfig = _f(LoggingConfig(), "Logging section.")
    rlvcr: RLVCRConfig = _f(RLVCRConfig(), "RLVCR thinking-level expansion section (docs/rlvcr.md).")

    # ---- derived totals (units in the names) ------------------------------------------------------
    @property
    def seqs_per_step(self) -> int:
        return self.loop.prompts_per_step * self.rollout.completions_per_prompt

    @property
    def seqs_per_minibatch(self) -> int:
        return self.seqs_per_step // self.loop.minibatches_per_step

    @property
    def microbatches_per_minibatch(self) -> int:
        return -(-self.seqs_per_minibatch // self.loop.seqs_per_microbatch)

    @property
    def optimizer_steps_per_step(self) -> int:
        return self.loop.epochs_per_step * self.loop.minibatches_per_step

    @property
    def total_optimizer_steps(self) -> int:
        return self.loop.steps * self.optimizer_steps_per_step

    @property
    def off_policy(self) -> bool:
        return self.optimizer_steps_per_step > 1

    def derived_totals(self) -> dict[str, int | bool]:
        return {
            "seqs_per_step": self.seqs_per_step,
            "seqs_per_minibatch": self.seqs_per_minibatch,
            "microbatches_per_minibatch": self.microbatches_per_minibatch,
            "optimizer_steps_per_step": self.optimizer_steps_per_step,
            "total_optimizer_steps": self.total_optimizer_steps,
            "max_completion_tokens_per_step": self.seqs_per_step * self.rollout.max_new_tokens,
            "off_policy": self.off_policy,
        }


# ----------------------------------------------------------------------------------------------------
# Building from dicts / YAML / command line
# ----------------------------------------------------------------------------------------------------


def _is_dataclass_type(tp: Any) -> bool:
    return isinstance(tp, type) and dataclasses.is_dataclass(tp)


def _coerce(value: Any, tp: Any, where: str) -> Any:
    """Convert a YAML value to the annotated type, or raise ConfigError naming the field."""
    origin = typing.get_origin(tp)
    args = typing.get_args(tp)
    if origin in (typing.Union, types.UnionType):
        if value is None and type(None) in args:
            return None
        last: ConfigError | None = None
        for a in args:
            if a is type(None):
                continue
            try:
                return _coerce(value, a, where)
            except ConfigError as e:
                last = e
        assert last is not None
        raise last
    if _is_dataclass_type(tp):
        if isinstance(value, tp):
            return value
        if not isinstance(value, dict):
            raise ConfigError(f"`{where}` must be a mapping (a YAML section), got {value!r}.")
        return _from_dict(tp, value, where)
    if origin is tuple:
        if isinstance(value, (str, int, float)) and not isinstance(value, bool):
            value = [value]
        if not isinstance(value, (list, tuple)):
            raise ConfigError(f"`{where}` = {value!r} must be a list.")
        if len(args) == 2 and args[1] is Ellipsis:
            return tuple(_coerce(v, args[0], f"{where}[{i}]") for i, v in enumerate(value))
        if len(value) != len(args):
            raise ConfigError(f"`{where}` = {value!r} must be a list of {len(args)} values.")
        return tuple(_coerce(v, a, f"{where}[{i}]") for i, (v, a) in enumerate(zip(value, args)))
    if tp is dict or origin is dict:
        if value is None:
            return {}
        if not isinstance(value, dict):
            raise ConfigError(f"`{where}` = {value!r} must be a mapping.")
        return dict(value)
    if tp is bool:
        if isinstance(value, bool):
            return value
        if isinstance(value, str) and value.lower() in ("true", "false", "yes", "no", "1", "0"):
            return value.lower() in ("true", "yes", "1")
        raise ConfigError(f"`{where}` = {value!r} must be true or false.")
    if tp is int:
        if isinstance(value, bool):
            raise ConfigError(f"`{where}` = {value!r} must be an integer.")
        if isinstance(value, int):
            return value
        if isinstance(value, float) and value.is_integer():
            return int(value)
        if isinstance(value, str):
            try:
                return int(value)
            except ValueError:
                pass
        raise ConfigError(f"`{where}` = {value!r} must be an integer.")
    if tp is float:
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            return float(value)
        if isinstance(value, str):
            try:
                return float(value)
            except ValueError:
                pass
        raise ConfigError(f"`{where}` = {value!r} must be a number.")
    if tp is str:
        if isinstance(value, (str, int, float)) and not isinstance(value, bool):
            return str(value)
        raise ConfigError(f"`{where}` = {value!r} must be a string.")
    if tp is type(None):
        if value is None:
            return None
        raise ConfigError(f"`{where}` = {value!r} must be null.")
    return value


def _unknown_key_error(cls: type, key: str, where: str) -> ConfigError:
    names = [f.name for f in dataclasses.fields(cls)]
    close = difflib.get_close_matches(key, names, n=3, cutoff=0.5)
    hint = f" Did you mean {' or '.join(f'`{c}`' for c in close)}?" if close else ""
    path = f"{where}.{key}" if where else key
    return ConfigError(f"unknown config key `{path}`.{hint} Valid keys here: {', '.join(names)}.")


def _from_dict(cls: type, data: dict, where: str = "") -> Any:
    hints = typing.get_type_hints(cls)
    kwargs = {}
    valid = {f.name for f in dataclasses.fields(cls)}
    for key, value in data.items():
        if key not in valid:
            raise _unknown_key_error(cls, str(key), where)
        sub = f"{where}.{key}" if where else key
        kwargs[key] = _coerce(value, hints[key], sub)
    return cls(**kwargs)


def config_from_dict(data: dict | None) -> TrainConfig:
    """Build a TrainConfig from a nested dict (unknown keys raise ConfigError with close matches)."""
    return _from_dict(TrainConfig, data or {}, "")


def config_to_dict(cfg: Any) -> dict:
    """Nested plain dict (tuples as lists) suitable for YAML."""
    out = {}
    for f in dataclasses.fields(cfg):
        v = getattr(cfg, f.name)
        if dataclasses.is_dataclass(v):
            v = config_to_dict(v)
        elif isinstance(v, tuple):
            v = list(v)
        elif isinstance(v, dict):
            v = dict(v)
        out[f.name] = v
    return out


def parse_overrides(argv: list[str]) -> dict:
    """``["--objective.preset", "dapo", "--optim.lr=1e-4"]`` → nested dict (:func:`lmpo.overrides.parse_overrides`)."""
    return _parse_overrides(argv, error=ConfigError)


def _deep_merge(base: dict, over: dict) -> dict:
    out = dict(base)
    for k, v in over.items():
        if isinstance(v, dict) and isinstance(out.get(k), dict):
            out[k] = _deep_merge(out[k], v)
        else:
            out[k] = v
    return out


def load_config(path: str | os.PathLike | None = None, overrides: list[str] | dict | None = None) -> TrainConfig:
    """YAML file (optional) + overrides (``--a.b value`` list or nested dict) → TrainConfig."""
    data: dict = {}
    if path is not None:
        if not os.path.exists(path):
            raise ConfigError(f"config file {str(path)!r} does not exist; pass the path of a YAML file "
                              "(see configs/).")
        with open(path, encoding="utf-8") as fh:
            data = yaml.safe_load(fh) or {}
        if not isinstance(data, dict):
            raise ConfigError(f"config file {str(path)!r} must hold a YAML mapping of sections.")
    if overrides:
        over = parse_overrides(overrides) if isinstance(overrides, list) else overrides
        data = _deep_merge(data, over)
    return config_from_dict(data)


def replace(cfg: TrainConfig, **sections: dict) -> TrainConfig:
    """``replace(cfg, loop={"steps": 3})``: a copy with some fields of some sections changed."""
    return config_from_dict(_deep_merge(config_to_dict(cfg), sections))


def save_config(cfg: TrainConfig, path: str | os.PathLike) -> None:
    with open(path, "w", encoding="utf-8") as fh:
        yaml.safe_dump(config_to_dict(cfg), fh, sort_keys=False)


# ----------------------------------------------------------------------------------------------------
# Validation (before any model is built)
# ----------------------------------------------------------------------------------------------------

_GROUP_ESTIMATORS = ("grpo", "rloo", "rlvcr")


def _check_choice(where: str, value: Any, choices: typing.Iterable[str]) -> None:
    choices = list(choices)
    if value not in choices:
        close = difflib.get_close_matches(str(value), choices, n=2, cutoff=0.5)
        hint = f" Did you mean {' or '.join(repr(c) for c in close)}?" if close else ""
        raise ConfigError(f"`{where}` = {value!r} is not one of {', '.join(choices)}.{hint}")


def _check_positive(where: str, value: float, fix: str = "") -> None:
    if not value > 0:
        raise ConfigError(f"`{where}` = {value!r} must be > 0.{(' ' + fix) if fix else ''}")


def _check_import_path(where: str, spec: str) -> None:
    module_name, _, attr = spec.partition(":")
    if not module_name or not attr:
        raise ConfigError(f"`{where}` = {spec!r} is neither a built-in reward nor an import path; write "
                          "`package.module:function`.")
    try:
        module = importlib.import_module(module_name)
    except Exception as e:  # noqa: BLE001 - any import failure is reported the same way
        raise ConfigError(f"`{where}` = {spec!r}: module {module_name!r} does not import ({type(e).__name__}: "
                          f"{e}). Fix the module path or make the package importable (PYTHONPATH).") from e
    if not callable(getattr(module, attr, None)):
        raise ConfigError(f"`{where}` = {spec!r}: module {module_name!r} has no callable {attr!r}. Fix the "
                          "function name after the colon.")


def validate_config(cfg: TrainConfig) -> None:
    """Check every field that can be checked without building a model. Raises ConfigError."""
    from lmpo.objectives import PRESETS, Objective
    from lmpo.objectives.advantages import ADVANTAGE_ESTIMATORS

    ob = cfg.objective
    _check_choice("objective.preset", ob.preset, sorted(PRESETS))
    try:
        objective = Objective.preset(ob.preset, **ob.overrides)
    except (TypeError, ValueError) as e:
        raise ConfigError(f"`objective.overrides` = {ob.overrides!r} is not valid for preset {ob.preset!r}: {e}. "
                          "Use field names and values of lmpo.objectives.Objective.") from e
    _check_choice("objective.advantage_estimator", ob.advantage_estimator, sorted(ADVANTAGE_ESTIMATORS))
    G = cfg.rollout.completions_per_prompt
    if ob.advantage_estimator in _GROUP_ESTIMATORS and G < 2:
        raise ConfigError(
            f"`rollout.completions_per_prompt` = {G}: {ob.advantage_estimator!r} advantages are computed "
            "within each prompt's group of completions and are all 0 for a group of one. Set "
            "rollout.completions_per_prompt >= 2 (e.g. 8).")
    _ = objective

    ro = cfg.rollout
    _check_positive("rollout.max_new_tokens", ro.max_new_tokens)
    _check_positive("rollout.temperature", ro.temperature, "Use a small value such as 0.1 for near-greedy.")
    if not 0 < ro.top_p <= 1:
        raise ConfigError(f"`rollout.top_p` = {ro.top_p!r} must be in (0, 1]; use 1 to switch it off.")
    if ro.top_k < 0:
        raise ConfigError(f"`rollout.top_k` = {ro.top_k!r} must be >= 0; use 0 to switch it off.")
    from lmpo.generation import ENGINES

    _check_choice("rollout.engine", ro.engine, sorted(ENGINES))
    if not 0 < ro.vllm_gpu_memory_utilization < 1:
        raise ConfigError(f"`rollout.vllm_gpu_memory_utilization` = {ro.vllm_gpu_memory_utilization!r} must be in "
                          "(0, 1), e.g. 0.3 to leave most of the GPU to training.")

    lp = cfg.loop
    for name in ("prompts_per_step", "epochs_per_step", "minibatches_per_step", "seqs_per_microbatch",
                 "max_nonfinite_steps"):
        _check_positive(f"loop.{name}", getattr(lp, name))
    if lp.steps < 0:
        raise ConfigError(f"`loop.steps` = {lp.steps!r} must be >= 0.")
    if cfg.seqs_per_step % lp.minibatches_per_step:
        raise ConfigError(
            f"`loop.minibatches_per_step` = {lp.minibatches_per_step} does not divide the "
            f"{cfg.seqs_per_step} sequences per step (prompts_per_step × completions_per_prompt); choose a "
            "divisor.")
    _check_choice("loop.device", lp.device, ["auto", "cpu", "cuda", "mps"])

    op = cfg.optim
    _check_positive("optim.lr", op.lr)
    _check_choice("optim.schedule", op.schedule, ["constant", "linear", "cosine"])
    if op.warmup_steps < 0:
        raise ConfigError(f"`optim.warmup_steps` = {op.warmup_steps!r} must be >= 0.")
    if op.max_grad_norm < 0:
        raise ConfigError(f"`optim.max_grad_norm` = {op.max_grad_norm!r} must be >= 0 (0 = no clipping).")
    _check_choice("model.dtype", cfg.model.dtype, ["float32", "bfloat16", "float16"])

    # task / data
    from lmpo.tasks import TASKS

    tk = cfg.task
    _check_choice("task.name", tk.name, sorted(TASKS) + ["file", "hf"])
    if tk.name == "file":
        if not tk.path:
            raise ConfigError("`task.path` is empty but `task.name` is 'file'; set task.path to a local "
                              ".json / .jsonl / .parquet file.")
        if not os.path.exists(tk.path):
            raise ConfigError(f"`task.path` = {tk.path!r} does not exist; give the path of a local "
                              ".json / .jsonl / .parquet file (relative paths are relative to the working "
                              "directory).")
    if tk.name == "hf" and not tk.hf_name:
        raise ConfigError("`task.hf_name` is empty but `task.name` is 'hf'; set it to a `datasets` name.")
    _check_positive("task.eval_examples", tk.eval_examples)

    # rewards
    from lmpo.rewards import REWARDS

    rw = cfg.rewards
    for i, spec in enumerate(rw.functions):
        if spec not in REWARDS:
            if ":" not in spec:
                close = difflib.get_close_matches(spec, sorted(REWARDS), n=2, cutoff=0.5)
                hint = f" Did you mean {' or '.join(repr(c) for c in close)}?" if close else ""
                raise ConfigError(f"`rewards.functions[{i}]` = {spec!r} is not a built-in reward "
                                  f"({', '.join(sorted(REWARDS))}) nor an import path `package.module:function`."
                                  f"{hint}")
            _check_import_path(f"rewards.functions[{i}]", spec)
    if rw.weights and len(rw.weights) != len(rw.functions):
        raise ConfigError(f"`rewards.weights` has {len(rw.weights)} values for {len(rw.functions)} functions; "
                          "give one weight per function or none.")
    _check_choice("rewards.on_error", rw.on_error, ["raise", "skip"])

    if cfg.model.lora.enabled:
        try:
            import peft  # noqa: F401
        except ImportError as e:
            raise ConfigError("`model.lora.enabled` = true needs the `peft` package; install lmpo[peft] or "
                              "set model.lora.enabled: false.") from e
    if cfg.logging.wandb:
        try:
            import wandb  # noqa: F401
        except ImportError as e:
            raise ConfigError("`logging.wandb` = true needs the `wandb` package; install it or set "
                              "logging.wandb: false.") from e
    for name in ("every_steps", "keep_last"):
        if getattr(cfg.checkpoint, name) < 0:
            raise ConfigError(f"`checkpoint.{name}` = {getattr(cfg.checkpoint, name)!r} must be >= 0.")
    if cfg.sft.steps < 0:
        raise ConfigError(f"`sft.steps` = {cfg.sft.steps!r} must be >= 0.")
    if cfg.sft.steps:
        _check_positive("sft.seqs_per_step", cfg.sft.seqs_per_step)
        _check_positive("sft.lr", cfg.sft.lr)
        _check_positive("sft.check_every_steps", cfg.sft.check_every_steps)
        _check_positive("sft.check_examples", cfg.sft.check_examples)
        if not 0 <= cfg.sft.stop_at_accuracy <= 1:
            raise ConfigError(f"`sft.stop_at_accuracy` = {cfg.sft.stop_at_accuracy!r} must be in [0, 1] "
                              "(0 = no early stop).")


# ----------------------------------------------------------------------------------------------------
# Reference documentation rendered from the dataclasses
# ----------------------------------------------------------------------------------------------------


def _type_name(tp: Any) -> str:
    s = str(tp) if not isinstance(tp, type) else tp.__name__
    return s.replace("typing.", "").replace("NoneType", "None")


def _fmt_default(v: Any) -> str:
    if dataclasses.is_dataclass(v):
        return "(section)"
    if isinstance(v, tuple):
        v = list(v)
    return "`" + yaml.safe_dump(v, default_flow_style=True).strip().removesuffix("...").strip() + "`"


def render_config_reference() -> str:
    """Markdown tables of every section and field of TrainConfig (the config reference in docs/trainer.md)."""
    lines: list[str] = []

    def section(cls: type, prefix: str) -> None:
        hints = typing.get_type_hints(cls)
        lines.append(f"### `{prefix}` — {(cls.__doc__ or '').strip().splitlines()[0]}")
        lines.append("")
        lines.append("| key | type | default | meaning |")
        lines.append("|---|---|---|---|")
        subs = []
        for f in dataclasses.fields(cls):
            default = f.default if f.default is not dataclasses.MISSING else f.default_factory()  # type: ignore[misc]
            if dataclasses.is_dataclass(default):
                subs.append((type(default), f"{prefix}.{f.name}"))
                continue
            cells = [f"`{prefix}.{f.name}`", _type_name(hints[f.name]), _fmt_default(default),
                     f.metadata.get("help", "")]
            lines.append("| " + " | ".join(c.replace("|", "\\|") for c in cells) + " |")
        lines.append("")
        for sub_cls, sub_prefix in subs:
            section(sub_cls, sub_prefix)

    for f in dataclasses.fields(TrainConfig):
        section(type(f.default), f.name)
    return "\n".join(lines).rstrip() + "\n"


DOC_START = "<!-- config-reference:start -->\n"
DOC_END = "<!-- config-reference:end -->"


METRICS_START = "<!-- metrics:start -->\n"
METRICS_END = "<!-- metrics:end -->"


def render_metrics_reference() -> str:
    """Markdown table of every metric key the trainer logs (from ``lmpo.trainer.metrics.METRIC_DOCS``)."""
    from lmpo.trainer.metrics import METRIC_DOCS

    rows = ["| key | meaning |", "|---|---|"] + [f"| `{k}` | {v} |" for k, v in METRIC_DOCS.items()]
    return "\n".join(rows) + "\n"


def _replace_between(text: str, start_marker: str, end_marker: str, body: str) -> str:
    start, end = text.index(start_marker) + len(start_marker), text.index(end_marker)
    return text[:start] + body + text[end:]


def update_reference_doc(path: str | os.PathLike) -> bool:
    """Rewrite the generated parts of ``path`` (config reference, metric table); returns whether it changed."""
    with open(path, encoding="utf-8") as fh:
        text = fh.read()
    new = _replace_between(text, DOC_START, DOC_END, render_config_reference())
    new = _replace_between(new, METRICS_START, METRICS_END, render_metrics_reference())
    if new != text:
        with open(path, "w", encoding="utf-8") as fh:
            fh.write(new)
    return new != text


if __name__ == "__main__":  # python -m lmpo.trainer.config docs/trainer.md
    import sys

    for p in sys.argv[1:]:
        print(f"{p}: {'updated' if update_reference_doc(p) else 'up to date'}")
