"""Configuration of a training run: one frozen dataclass per component, documented in one place.

Every field carries its documentation in ``field(metadata={"help": ...})``; ``docs/trainer.md``'s config
reference is rendered from these (``render_config_reference``) and a test checks that the two agree.

A run is described by :class:`TrainConfig`, built from a YAML file plus dotted overrides::

    cfg = load_config("configs/demo.yaml", overrides=["--objective.preset", "dapo", "--optim.lr", "1e-4"])

:meth:`TrainConfig.validate` (:func:`validate_config`) runs before any model is built and raises
:class:`ConfigError` whose message names the field, the offending value and how to fix it: ranges and choices
come from the fields' metadata, each section's ``validate`` checks what needs code (a registry name, a file,
a package), and the checks that relate sections follow.
"""

from __future__ import annotations

import difflib
import importlib
import os
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from lmpo.config import (
    ConfigError,
    check_fields,
    check_value,
    deep_merge,
    flat_aliases,
    from_dict,
    idle_fields,
    parse_overrides,
    read_yaml,
    render_reference,
    save_yaml,
    to_dict,
)
from lmpo.config import option as _f
from lmpo.envs import ENVS, EpisodeBudget, LMEnv
from lmpo.envs.base import is_registered, unknown_env_message
from lmpo.envs.plugins import import_env_modules
from lmpo.envs.tools.sandbox import set_default_require
from lmpo.generation.episodes import ON_ENV_ERROR
from lmpo.rlvcr.config import RLVCRConfig

__all__ = ["ConfigError", "TrainConfig", "config_from_dict", "config_to_dict", "load_config", "parse_overrides",
           "render_config_reference", "replace", "save_config", "validate_config"]



# ----------------------------------------------------------------------------------------------------
# Components
# ----------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class LoraConfig:
    """Optional LoRA adapters through PEFT; only the adapter weights are trained."""

    enabled: bool = _f(False, "Wrap the policy in PEFT LoRA adapters (needs `peft`).")
    r: int = _f(8, "LoRA rank.", ge=1)
    alpha: int = _f(16, "LoRA scaling numerator (`lora_alpha`); the update is scaled by alpha / r.", ge=1)
    dropout: float = _f(0.0, "Dropout on the LoRA branch (keep 0 for bit-exact resume).", ge=0, lt=1)
    target_modules: tuple[str, ...] = _f(
        ("q_proj", "k_proj", "v_proj", "o_proj"), "Module names (suffixes) that get adapters."
    )

    def validate(self) -> None:
        """Ranges, and the `peft` package when the adapters are on."""
        check_fields(self, "model.lora")
        if self.enabled:
            _require_package("peft", "`model.lora.enabled` = true needs the `peft` package; install lmpo[peft] or "
                             "set model.lora.enabled: false.")


@dataclass(frozen=True)
class ModelConfig:
    """The policy (and reference) model."""

    name: str = _f("tiny", "A built-in preset of `lmpo.models.MODEL_PRESETS` (built in code, offline) or a "
                   "Hugging Face model name / local path for `AutoModelForCausalLM`.")
    init_seed: int = _f(0, "Seed of the random initialisation of a built-in preset.", ge=0)
    dtype: str = _f("float32", "Parameter dtype.", choices=("float32", "bfloat16", "float16"))
    ref_path: str | None = _f(None, "Reference model for the KL term; default: a frozen copy of the initial "
                              "policy (after the supervised warm-up). Only loaded when the objective needs it.")
    lora: LoraConfig = _f(LoraConfig(), "LoRA adapters (section `model.lora`).")

    def validate(self) -> None:
        """Ranges, where the policy (and the reference) come from, the LoRA section."""
        check_fields(self, "model")
        _check_model_source("model.name", self.name)
        if self.ref_path:
            _check_model_source("model.ref_path", self.ref_path)
        self.lora.validate()


@dataclass(frozen=True)
class TaskConfig:
    """Where prompts and reference answers come from."""

    name: str = _f("addition", "A built-in task of `lmpo.tasks.TASKS`, a task of a family of "
                   "`lmpo.tasks.TASK_FAMILIES` (`reasoning_gym/<dataset>`), or `file` (local JSON/JSONL/Parquet, "
                   "see `path`) or `hf` (a Hugging Face `datasets` name, see `hf_name`).")
    path: str | None = _f(None, "Local data file for `name: file`.")
    hf_name: str | None = _f(None, "Dataset name for `name: hf`.")
    prompt_field: str = _f("prompt", "Column holding the prompt (file / hf tasks).")
    answer_field: str = _f("answer", "Column holding the reference answer (file / hf tasks).")
    options: dict = _f({}, "Keyword options of the task constructor (e.g. `{min_digits: 1, max_digits: 3}` for addition).")
    eval_examples: int = _f(200, "Number of held-out examples used by evaluation (examples, not batches).", ge=1)
    prompt_format: str = _f("auto", "`auto`: conversational prompts (lists of role/content messages, TRL's "
                            "conversational format) go through the tokenizer's chat template with "
                            "`add_generation_prompt`, string prompts are used as they are; `chat`: string prompts "
                            "too, as one user message; `text`: never (conversational data are an error).")
    chat_template: str | None = _f(None, "Jinja chat template (the template text or a file path) used instead of "
                                   "the tokenizer's own; needed for conversational data when the tokenizer has none.")

    def validate(self) -> None:
        """Ranges, the task's name, its data file or dataset, the prompt format and the chat template."""
        from lmpo.tasks import PROMPT_FORMATS, TASKS, task_family

        check_fields(self, "task")
        family = task_family(self.name)
        if family is None:
            check_value(self.name, {"choices": (*sorted(TASKS), "file", "hf")}, "task.name")
        elif not family.available:
            raise ConfigError(f"`task.name` = {self.name!r} needs the {family.requires} package, which is not "
                              f"installed: pip install 'lmpo[{family.requires}]'.")
        if self.name == "file":
            if not self.path:
                raise ConfigError("`task.path` is empty but `task.name` is 'file'; set task.path to a local "
                                  ".json / .jsonl / .parquet file.")
            if not os.path.exists(self.path):
                raise ConfigError(f"`task.path` = {self.path!r} does not exist; give the path of a local "
                                  ".json / .jsonl / .parquet file (relative paths are relative to the working "
                                  "directory).")
            if os.path.isdir(self.path):
                raise ConfigError(f"`task.path` = {self.path!r} is a directory; give the path of one .json / "
                                  ".jsonl / .parquet file inside it.")
        check_value(self.prompt_format, {"choices": tuple(PROMPT_FORMATS)}, "task.prompt_format")
        template = self.chat_template
        if template and "{{" not in template and "{%" not in template and not os.path.isfile(template):
            raise ConfigError(f"`task.chat_template` = {template!r} is neither a Jinja template nor an "
                              "existing file; give the template text or the path of a .jinja file.")
        if self.name == "hf" and not self.hf_name:
            raise ConfigError("`task.hf_name` is empty but `task.name` is 'hf'; set it to a `datasets` name.")


@dataclass(frozen=True)
class RolloutConfig:
    """Sampling of completions (batched HF generate with KV cache, left padding, EOS stop)."""

    completions_per_prompt: int = _f(8, "G: completions sampled per prompt (a group). GRPO-style group "
                                     "advantages need G >= 2.", ge=1)
    max_new_tokens: int = _f(16, "Maximum completion length in tokens.", ge=1)
    temperature: float = _f(1.0, "Sampling temperature.", gt=0,
                            hint="Use a small value such as 0.1 for near-greedy.")
    top_p: float = _f(1.0, "Nucleus sampling mass (1 = off).", gt=0, le=1, hint="Use 1 to switch it off.")
    top_k: int = _f(0, "Top-k sampling (0 = off).", ge=0, hint="Use 0 to switch it off.")
    ignore_eos: bool = _f(False, "Keep generating after EOS to exactly max_new_tokens (benchmarks use "
                          "this to force equal lengths).")
    engine: str = _f("hf", "Generation engine, a name of `lmpo.generation.ENGINES`: `hf` (any Hugging Face causal "
                     "LM, static KV cache, each prompt pre-filled once) or `vllm` (vLLM colocated on the training "
                     "GPU, weights synced after every step; needs `lmpo[vllm]` and CUDA).")
    record_logprobs: bool = _f(False, "Record the sampler's log-probs of the sampled tokens (`log softmax(logits / "
                               "temperature)`) and log the sampler/trainer mismatch (`mismatch/*`) every step. "
                               "Switched on by itself when the objective needs them (a `correction` or "
                               "`rejection` other than `none`); vLLM records them whatever this is.")
    dynamic_sampling: bool = _f(False, "DAPO dynamic sampling: draw batches of `loop.prompts_per_step` prompts "
                                "until that many groups with non-zero variance (of `dynamic_sampling_metric`) are "
                                "in hand, and train on exactly those (metrics `rollout/draws`, "
                                "`rollout/groups_dropped`). With `env.id`: groups of episodes, by their returns "
                                "(or success).")
    dynamic_sampling_metric: str = _f("reward", "What must vary within a group to keep it: `reward` (the total "
                                      "reward, shaping included) or `accuracy` (the task's accuracy reward >= "
                                      "`rewards.success_threshold`, as DAPO's paper and verl's recipe).",
                                      choices=("reward", "accuracy"))
    dynamic_sampling_max_draws: int = _f(10, "Stop the run with an error once this many draws in one step did not "
                                         "fill the batch (verl `max_num_gen_batches`; 0 = no limit).", ge=0)
    cuda_graphs: bool = _f(True, "On a CUDA device, replay each decode step of the `hf` engine from a CUDA graph "
                           "(static KV cache, one graph per 256-position bucket of the attended length, captured "
                           "at first use); ignored on other devices and under `loop.compile`. A model whose "
                           "forward cannot be captured decodes eagerly, with a warning.")
    lean_decode: bool = _f(True, "On CPU, decode Llama-family models (`LlamaForCausalLM`, `Qwen2ForCausalLM`, float32: "
                           "the built-in presets and checkpoints of that architecture) with the `hf` engine's lean "
                           "decode step (`lmpo.generation.lean`: fused QKV and gate/up projections, preallocated "
                           "buffers, the same greedy tokens and the same seeded samples as the model's forward). "
                           "Other models decode through their forward, with a one-line warning. Ignored on other "
                           "devices and under `loop.compile`.")
    vllm_lora_sync: str = _f("merged", "How a LoRA policy's weights reach vLLM (`engine: vllm`) after each step: "
                             "`merged` (adapters merged into the base weights, all of which are copied) or "
                             "`adapter` (the adapter alone, served by vLLM on the base weights it loaded once; "
                             "not tested on a GPU yet).", choices=("merged", "adapter"))
    async_staleness: int = _f(0, "Generate in a separate worker process (`lmpo.generation.worker.AsyncRollout`) "
                              "overlapped with training: step t trains on completions sampled with the weights of "
                              "step t - 1 - k (k = this value), the worker's log-probs are the behaviour log-probs "
                              "of the objective's corrections (`record_logprobs` is on), and the schedule, not "
                              "the timing, decides everything (docs/async.md). Under `env.id` the worker plays "
                              "the episodes, the environment and its tools included. 0 = generate in the training "
                              "process, before each update (the synchronous loop).", ge=0)
    async_threads: int = _f(1, "Torch threads of the rollout worker (`async_staleness` >= 1); the training process "
                            "keeps `loop.num_threads`.", ge=1, needs="async_staleness")
    async_timeout_s: float = _f(600.0, "Seconds without any message from a busy rollout worker after which it is "
                                "reported hung and the run stops (`async_staleness` >= 1).", gt=0,
                                needs="async_staleness")
    async_start_timeout_s: float = _f(600.0, "Seconds a (re)started rollout worker may take to import torch and "
                                      "build its model before it is reported hung (`async_staleness` >= 1); raise "
                                      "it on a machine shared with other jobs.", gt=0, needs="async_staleness")
    vllm_gpu_memory_utilization: float = _f(0.3, "Fraction of the GPU's memory vLLM may take for its weights and KV "
                                            "cache (`engine: vllm`); the rest is left to training.", gt=0, lt=1,
                                            hint="e.g. 0.3 leaves most of the GPU to training.")

    def validate(self) -> None:
        """Ranges and the generation engine's name."""
        from lmpo.generation import ENGINES

        check_fields(self, "rollout")
        check_value(self.engine, {"choices": tuple(sorted(ENGINES))}, "rollout.engine")


@dataclass(frozen=True)
class RewardModelConfig:
    """A reward model: an entry `{model: PATH, ...}` of `rewards.functions`."""

    model: str = _f("", "Local directory or Hugging Face name of an `AutoModelForSequenceClassification`; the "
                    "reward is its first logit on prompt + completion (conversations rendered by its own chat "
                    "template).")
    name: str | None = _f(None, "Name in metrics (`reward/<name>/mean`); default: the model directory's name.")
    seqs_per_batch: int = _f(64, "Sequences per reward-model forward pass.", ge=1)
    chat_template: str | None = _f(None, "Jinja template (text or file path) for conversational data, instead of "
                                   "the reward tokenizer's own.")
    dtype: str = _f("float32", "Parameter dtype.", choices=("float32", "bfloat16", "float16"))

    @property
    def metric_name(self) -> str:
        return self.name or os.path.basename(os.path.normpath(self.model)) or self.model

    def validate(self, where: str = "rewards.functions[]") -> None:
        """Ranges, and a model directory (or hub id) that holds a sequence-classification model."""
        from lmpo.models.loading import looks_like_hub_id

        check_fields(self, where)
        if not self.model:
            raise ConfigError(f"`{where}.model` is empty; give the directory (or Hugging Face name) of an "
                              "AutoModelForSequenceClassification.")
        if not os.path.isdir(self.model) and not looks_like_hub_id(self.model):
            raise ConfigError(f"`{where}.model` = {self.model!r} is not a directory nor a Hugging Face 'org/name'; "
                              "give the directory of a sequence-classification model (config.json, weights, "
                              "tokenizer).")
        if os.path.isdir(self.model) and not os.path.isfile(os.path.join(self.model, "config.json")):
            raise ConfigError(f"`{where}.model` = {self.model!r} has no config.json; give a directory written by "
                              "`save_pretrained` of an AutoModelForSequenceClassification.")
        if "/" in self.metric_name:
            raise ConfigError(f"`{where}.name` = {self.metric_name!r} contains '/', which would nest metric keys; "
                              "give a name without one.")


@dataclass(frozen=True)
class RewardsConfig:
    """Reward functions, summed with weights."""

    functions: tuple[str | RewardModelConfig, ...] = _f(
        (), "Built-in names of `lmpo.rewards.REWARDS`, user functions `package.module:function`, or reward models "
        "`{model: PATH, ...}` (keys below); empty = the task's default rewards.")
    weights: tuple[float, ...] = _f((), "One weight per function (empty = all 1).")
    kwargs: dict = _f({}, "Keyword options per function name, e.g. `{length_penalty: {target_chars: 8}}`.")
    on_error: str = _f("auto", "A reward function that raises, or returns NaN, ±inf or a value beyond ±1e9 (None "
                       "is `does not apply`): `raise` (error naming the function and the sample), `skip` (reward 0 "
                       "for that sample, counted in `reward/errors`, or `reward/nonfinite` with a warning line), or "
                       "`auto`: `raise` when the rewards run one after the other, `skip` with a pool (`workers` > "
                       "0: a failing call, like one past `timeout_s`, is a counted error and the run goes on).",
                       choices=("auto", "raise", "skip"))
    success_threshold: float = _f(1.0, "A completion counts as correct (`reward/accuracy`, "
                                  "`eval/accuracy`) when the task's accuracy reward is >= this.")
    overlong_buffer_len: int = _f(0, "DAPO soft overlong punishment: the last this many tokens of the "
                                  "`rollout.max_new_tokens` budget (L_cache) are a buffer in which the reward "
                                  "falls linearly from 0 to -overlong_penalty_factor (logged as "
                                  "`reward/overlong/mean`); 0 = off. Training rewards only, not evaluation.",
                                  ge=0)
    overlong_penalty_factor: float = _f(1.0, "Size of the overlong penalty at the full budget (verl "
                                        "`overlong_buffer.penalty_factor`).", ge=0)
    workers: int = _f(0, "Run the reward functions in a pool of this many threads or processes, each call with "
                      "`timeout_s` (lmpo.rewards.parallel; `async def` functions are accepted); 0 = one after "
                      "the other in the training process.", ge=0)
    pool: str = _f("thread", "`thread` (I/O-bound rewards: services, judges, sandboxes) or `process` (CPU-bound "
                   "pure-Python rewards; functions must be importable).", choices=("thread", "process"), needs="workers")
    timeout_s: float = _f(0.0, "Seconds one reward call may take with `workers` > 0; a call past it gives NaN for "
                          "its completions and counts in `reward/errors` (0 = no limit).", ge=0, needs="workers")
    seqs_per_call: int = _f(0, "Completions per reward call with `workers` > 0, so that one function's batch "
                            "runs in parallel too (0 = the whole batch in one call per function).", ge=0, needs="workers")

    def validate(self) -> None:
        """Ranges, each function (built-in, importable or a reward model), names, weights and the pool fields."""
        from lmpo.rewards import REWARDS

        check_fields(self, "rewards")
        for i, spec in enumerate(self.functions):
            if isinstance(spec, RewardModelConfig):
                spec.validate(f"rewards.functions[{i}]")
            elif spec not in REWARDS:
                if ":" not in spec:
                    close = difflib.get_close_matches(spec, sorted(REWARDS), n=2, cutoff=0.5)
                    hint = f" Did you mean {' or '.join(repr(c) for c in close)}?" if close else ""
                    raise ConfigError(f"`rewards.functions[{i}]` = {spec!r} is not a built-in reward "
                                      f"({', '.join(sorted(REWARDS))}) nor an import path `package.module:function`."
                                      f"{hint}")
                _check_import_path(f"rewards.functions[{i}]", spec)
        names = [f.metric_name if isinstance(f, RewardModelConfig) else f for f in self.functions]
        for name in sorted({n for n in names if names.count(n) > 1}):
            raise ConfigError(f"`rewards.functions` lists {name!r} twice; merge their weights, or give the reward "
                              "models distinct `name`s.")
        if self.workers == 0:
            idle = idle_fields(self, "workers")
            if idle:
                raise ConfigError(f"`rewards.{idle[0]}` = {getattr(self, idle[0])!r} has no effect while "
                                  "`rewards.workers` = 0 (the rewards run one after the other, without a pool). Set "
                                  "rewards.workers to the pool size (e.g. 4), or leave it at its default.")
        if self.weights and len(self.weights) != len(self.functions):
            raise ConfigError(f"`rewards.weights` has {len(self.weights)} values for {len(self.functions)} "
                              "functions; give one weight per function or none.")


@dataclass(frozen=True)
class ObjectiveConfig:
    """The policy objective (`lmpo.objectives`) and the advantages fed to it.

    Four concerns, kept as flat keys (``objective.kl_reward_coef``: run directories store them so, ``--resume``
    compares them key by key, and the TRL alias table writes them): the objective (``preset``, ``overrides``),
    the advantages (``advantage_estimator``, ``advantage_options``, ``filter_zero_variance``), the loss mask
    (``mask_truncated_completions``), and the KL in the reward with the reference sync (``kl_in_reward``,
    ``kl_reward_*``, ``kl_ctrl_*``, ``ref_sync_*``). Each default is written once, in its field: the fields
    that act only through the KL in the reward say so with ``needs="kl_in_reward"``
    (:func:`lmpo.config.idle_fields` finds the ones moved from their defaults while it is off).
    """

    # -- the objective ---------------------------------------------------------------------------------
    preset: str = _f("grpo", "A preset of `lmpo.objectives.PRESETS`.")
    overrides: dict = _f({}, "Field-by-field overrides of the preset, any `lmpo.objectives.Objective` field "
                         "(e.g. `{eps_high: 0.3, kl_coef: 0.01, grad_norm_mode: logits}`); a part may be given as a "
                         "whole under its kind (`{trust_region: {name: cispo, eps_high: 4.0}}`). The objective's "
                         "settings are these two keys only. `check_finite` is off in training unless set here: the "
                         "trainer checks the loss and gradients once per optimizer step and skips a non-finite "
                         "step, where the objective's own check would stop the run at the first microbatch.")
    # -- the advantages --------------------------------------------------------------------------------
    advantage_estimator: str = _f("grpo", "An estimator of `lmpo.objectives.advantages.ADVANTAGE_ESTIMATORS` (table "
                                  "in docs/objectives.md). `remax` decodes one extra greedy completion per prompt "
                                  "for its baseline; `gdpo` normalises each reward function separately.")
    advantage_options: dict = _f({}, "Parameters of the advantage estimator (e.g. `{whiten: sequences}` for "
                                 "`reinforce_plus_plus`, `{valid: group_signal}` for `gpg`); an estimator with a "
                                 "`scale` takes the preset's `advantage_scale` unless it is set here.")
    filter_zero_variance: bool = _f(False, "Drop groups whose rewards are all equal before the update, leaving a "
                                    "smaller batch (`adv/zero_var_frac`); `rollout.dynamic_sampling` refills the "
                                    "batch instead, as DAPO does.")
    # -- the loss mask ---------------------------------------------------------------------------------
    mask_truncated_completions: bool = _f(False, "Completions that reach `rollout.max_new_tokens` without EOS "
                                          "get loss mask 0 (TRL `mask_truncated_completions`, DAPO overlong "
                                          "filtering); they keep their reward and their place in the group's "
                                          "advantages.")
    # -- KL in the reward (verl algorithm.use_kl_in_reward / kl_penalty / kl_ctrl) and reference sync (TR-DPO)
    kl_in_reward: bool = _f(False, "Subtract β·Σ_t KL_t to the reference model from each sequence's reward before "
                            "the advantages (verl `algorithm.use_kl_in_reward`; builds the reference model).")
    kl_reward_estimator: str = _f("k1", "Per-token KL estimate of the reward penalty (verl `algorithm.kl_penalty`: "
                                  "its `kl` is `k1`, `mse` is `k2`).",
                                  choices=("k1", "abs", "k2", "k3", "low_var_kl"), needs="kl_in_reward")
    kl_reward_coef: float = _f(0.001, "β of the KL in the reward; the starting value under the adaptive controller "
                               "(verl `algorithm.kl_ctrl.kl_coef`).", ge=0, needs="kl_in_reward")
    kl_ctrl_type: str = _f("fixed", "Controller of β: `fixed` or `adaptive` (Ziegler et al. 2019; verl "
                           "`algorithm.kl_ctrl.type`).", choices=("fixed", "adaptive"), needs="kl_in_reward")
    kl_ctrl_target: float = _f(0.1, "Target KL (token-mean per sequence, averaged over sequences) of the adaptive "
                               "controller (verl `algorithm.kl_ctrl.target_kl`).", ge=0, needs="kl_in_reward")
    kl_ctrl_horizon: int = _f(10000, "Horizon of the adaptive controller in sequences: one step's relative change "
                              "of β is at most 0.2·B / horizon (verl `algorithm.kl_ctrl.horizon`).", ge=0, needs="kl_in_reward")
    ref_sync_steps: int = _f(0, "Every this many optimizer steps mix the policy into the reference model, ref ← "
                             "α·π + (1 − α)·ref (TR-DPO; TRL `ref_model_sync_steps`); 0 = never.", ge=0)
    ref_sync_alpha: float = _f(0.6, "α of the reference sync (TRL `ref_model_mixup_alpha`); 1 copies the policy.",
                               ge=0, le=1)

    def validate(self) -> Any:
        """Ranges, the preset and its overrides, the advantage estimator and its options, the KL-in-reward fields
        among themselves. Returns the :class:`lmpo.objectives.Objective` it built (the checks across sections read
        its needs)."""
        from lmpo.objectives import PRESETS, Objective

        check_fields(self, "objective")
        check_value(self.preset, {"choices": tuple(sorted(PRESETS))}, "objective.preset")
        try:
            objective = Objective.preset(self.preset, **self.overrides)
        except (TypeError, ValueError) as e:
            raise ConfigError(f"`objective.overrides` = {self.overrides!r} is not valid for preset {self.preset!r}: "
                              f"{e}. Use field names and values of lmpo.objectives.Objective.") from e
        self._check_advantage_estimator(objective.advantage_scale)
        self._check_kl_in_reward()
        return objective

    def _check_advantage_estimator(self, scale: str) -> None:
        """The estimator name and each of its options (the error names the option)."""
        from lmpo.objectives.advantages import ADVANTAGE_ESTIMATORS, make_estimator

        name = self.advantage_estimator
        check_value(name, {"choices": tuple(sorted(ADVANTAGE_ESTIMATORS))}, "objective.advantage_estimator")
        fields = ADVANTAGE_ESTIMATORS[name].params()
        for key, value in self.advantage_options.items():
            where = f"objective.advantage_options.{key}"
            if key not in fields:
                close = difflib.get_close_matches(str(key), list(fields), n=1)
                hint = f" Did you mean {close[0]!r}?" if close else ""
                raise ConfigError(f"`{where}`: advantage estimator {name!r} has no option {key!r}; its options are "
                                  f"{', '.join(fields) or '(none)'} (table in docs/objectives.md).{hint}")
            try:
                make_estimator(name, **{key: value})
            except (TypeError, ValueError) as e:
                raise ConfigError(f"`{where}` = {value!r} is not valid for advantage estimator {name!r}: {e}") \
                    from None
        try:
            make_estimator(name, default_scale=scale, **self.advantage_options)
        except (TypeError, ValueError) as e:
            raise ConfigError(f"`objective.advantage_options` = {self.advantage_options!r} is not valid for "
                              f"advantage estimator {name!r}: {e}") from None

    def _check_kl_in_reward(self) -> None:
        """The KL-in-reward and β-controller fields: each needs the others it acts through."""
        if not self.kl_in_reward:
            changed = idle_fields(self, "kl_in_reward")
            if changed:
                more = f" (and {', '.join('objective.' + k for k in changed[1:])})" if changed[1:] else ""
                raise ConfigError(f"`objective.{changed[0]}` = {getattr(self, changed[0])!r}{more} has no effect "
                                  "while `objective.kl_in_reward` is false: it shapes the KL penalty in the reward. "
                                  "Set objective.kl_in_reward: true, or leave it at its default.")
        elif self.kl_ctrl_type == "adaptive":
            if not self.kl_ctrl_target > 0:
                raise ConfigError(f"`objective.kl_ctrl_target` = {self.kl_ctrl_target}: the adaptive KL controller "
                                  f"divides by the target KL; set it > 0 (verl's default {_default_of('kl_ctrl_target')})"
                                  " or use objective.kl_ctrl_type: fixed.")
            if not self.kl_ctrl_horizon > 0:
                raise ConfigError(f"`objective.kl_ctrl_horizon` = {self.kl_ctrl_horizon}: the adaptive KL "
                                  "controller divides by its horizon; set it > 0 (verl's default "
                                  f"{_default_of('kl_ctrl_horizon')}) or use objective.kl_ctrl_type: fixed.")
            if self.kl_reward_coef == 0:
                raise ConfigError("`objective.kl_reward_coef` = 0 with objective.kl_ctrl_type: adaptive: the "
                                  "controller multiplies β, so it would stay 0. Start it > 0 (verl's default "
                                  f"{_default_of('kl_reward_coef')}).")


def _default_of(name: str) -> Any:
    """The declared default of ``ObjectiveConfig.<name>`` (error messages quote it from its one source)."""
    return ObjectiveConfig.__dataclass_fields__[name].default


@dataclass(frozen=True)
class OptimConfig:
    """AdamW and the learning-rate schedule."""

    lr: float = _f(1e-5, "Peak learning rate.", gt=0)
    betas: tuple[float, float] = _f((0.9, 0.999), "AdamW betas.", ge=0, lt=1)
    eps: float = _f(1e-8, "AdamW epsilon.", gt=0)
    weight_decay: float = _f(0.0, "Decoupled weight decay.", ge=0)
    max_grad_norm: float = _f(1.0, "Clip the global gradient norm to this (0 = no clipping).", ge=0)
    warmup_steps: int = _f(0, "Linear warm-up length in optimizer steps.", ge=0)
    schedule: str = _f("constant", "After warm-up: constant | linear | cosine (decay to min_lr_ratio·lr over "
                       "the run's optimizer steps).", choices=("constant", "linear", "cosine"))
    min_lr_ratio: float = _f(0.0, "Final learning rate of linear / cosine as a fraction of lr.", ge=0, le=1)


@dataclass(frozen=True)
class LoopConfig:
    """The RL loop: how much data per step and how it is split."""

    steps: int = _f(100, "Number of RL steps (each: one rollout batch, then epochs × minibatches updates).", ge=0)
    prompts_per_step: int = _f(16, "Prompts sampled per step; sequences per step = prompts_per_step × G.", ge=1)
    epochs_per_step: int = _f(1, "Passes over each step's rollout batch (> 1 makes updates off-policy).", ge=1)
    minibatches_per_step: int = _f(1, "Optimizer steps per epoch; the rollout batch is split into this many "
                                   "minibatches (> 1 makes updates off-policy).", ge=1)
    seqs_per_microbatch: int = _f(64, "Sequences per forward/backward pass (gradient accumulation inside a "
                                  "minibatch, with exact global normalisation).", ge=1)
    share_prompt_prefix: bool = _f(True, "Training forward: run each prompt once per group and reuse its KV cache "
                                   "(with gradient) for its G completions; the same log-probs for less compute.")
    pack_sequences: bool = _f(False, "Padding-free log-prob forwards: the real tokens of a microbatch's sequences in "
                              "one row with per-sequence position ids (block-diagonal attention; varlen flash "
                              "attention with `flash_attention_2` on GPU), no compute or memory for padding "
                              "(lmpo.generation.packing). Replaces `share_prompt_prefix`; not with per-token "
                              "gradient norms.")
    gradient_checkpointing: bool = _f(False, "Recompute each layer's activations in the backward pass instead of "
                                      "keeping them (less memory, about one more forward of compute); turns "
                                      "`share_prompt_prefix` off for the training forward.")
    autocast: bool = _f(False, "Run the forward passes (generation and log-probs) under bfloat16 autocast; "
                        "parameters, gradients and optimizer state keep the model's dtype.")
    compile: bool = _f(False, "Run the policy's training and log-prob forward passes (and their backward) and "
                       "each generation decode step through `torch.compile`; the first calls of each new shape "
                       "compile (tens of seconds on CPU). Same results up to float rounding.")
    seed: int = _f(0, "Seed of data order, sampling and clip_cov selection.", ge=0)
    max_nonfinite_steps: int = _f(5, "Stop after this many consecutive steps with a non-finite loss or "
                                  "gradient (each is skipped and counted).", ge=1)
    device: str = _f("auto", "auto | cpu | cuda | mps.", choices=("auto", "cpu", "cuda", "mps"))
    num_threads: int = _f(0, "torch CPU threads (0 = torch's default).", ge=0, le=1024)

    def validate(self) -> None:
        """Ranges, and a device that this machine has."""
        check_fields(self, "loop")
        _check_device("loop.device", self.device)


@dataclass(frozen=True)
class DemonstrationSource:
    """A share of a multi-turn warm-up's demonstrations played by an expert built with other environment options."""

    fraction: float = _f(0.5, "Share of the warm-up examples whose demonstration comes from this source (spread "
                         "evenly over the examples).", gt=0, le=1)
    options: dict = _f({}, "Environment options laid over `env.options` for these demonstrations, e.g. "
                       "`{expert: memory}` for ToolArithmetic-v0's expert who answers without the calculator.")


@dataclass(frozen=True)
class SFTConfig:
    """Optional supervised warm-up before RL: the task's reference answers, or an environment's expert episodes.

    With ``env.id`` set the warm-up imitates the environment's expert (docs/multiturn.md, "Warm-up")."""

    steps: int = _f(0, "Supervised optimizer steps (0 = no warm-up). With `env.id`: steps on expert episodes "
                    "(`expert_action`), played with the chat template and `env.budget` of the RL episodes; a "
                    "budget that cuts a demonstration is an error naming it.", ge=0)
    lr: float = _f(1e-3, "Peak learning rate of the warm-up (AdamW).", gt=0)
    warmup_steps: int = _f(0, "Linear learning-rate warm-up over the first N warm-up steps.", ge=0)
    schedule: str = _f("constant", "Learning rate after `warmup_steps`: `constant`, or `linear` decay to 0 at "
                       "the last step.", choices=("constant", "linear"))
    seqs_per_step: int = _f(32, "Prompt+answer sequences (with `env.id`: demonstration episodes) per warm-up "
                            "step.", ge=1)
    demonstrations: tuple[DemonstrationSource, ...] = _f((), "With `env.id`: other experts' shares of the "
                                                         "demonstrations (fractions summing to at most 1); the "
                                                         "rest are played with `env.options` as they are.")
    max_examples: int = _f(0, "Draw warm-up examples from only the first N training examples (0 = all).", ge=0)
    stop_at_accuracy: float = _f(0.0, "Stop the warm-up early once greedy accuracy on `check_examples` TRAINING "
                                 "prompts reaches this (0 = always run `steps`); makes the RL start comparable "
                                 "across seeds. The held-out split is never looked at.", ge=0, le=1)
    check_every_steps: int = _f(50, "How often the early-stop accuracy is measured (warm-up steps).", ge=1)
    check_examples: int = _f(200, "Training prompts used for the early-stop accuracy.", ge=1)


@dataclass(frozen=True)
class EvalConfig:
    """Greedy evaluation on the held-out split."""

    every_steps: int = _f(0, "Evaluate every N RL steps (0 = only before and after training).", ge=0)
    at_start: bool = _f(True, "Evaluate before the first RL step (after the warm-up).")
    seqs_per_batch: int = _f(256, "Prompts per greedy generation batch.", ge=1)
    max_new_tokens: int | None = _f(None, "Completion length at evaluation (default: rollout.max_new_tokens).", ge=1)
    samples_per_prompt: int = _f(0, "Also sample this many completions per held-out prompt (rollout temperature "
                                 "and top-p, a fixed seed) and log `eval/pass@k` for k = 1, 2, 4, … and "
                                 "`eval/avg@n` with 95% intervals (lmpo.eval.passk); 0 = greedy accuracy only.",
                                 ge=0)


@dataclass(frozen=True)
class CheckpointConfig:
    """Checkpoints in RUN_DIR/checkpoints/step_XXXXXXXX (atomic: temp dir + rename)."""

    every_steps: int = _f(0, "Write a checkpoint every N RL steps (0 = only at the end).", ge=0)
    keep_last: int = _f(2, "Keep the newest N checkpoints (0 = keep all).", ge=0)
    at_end: bool = _f(True, "Write a checkpoint after the last step.")
    final_model: bool = _f(True, "Write the trained policy to RUN_DIR/model/ at the end of the run, as "
                           "`save_pretrained` does (config, weights or a LoRA adapter, tokenizer, generation "
                           "config): `AutoModelForCausalLM.from_pretrained`, `lmpo eval RUN`, `lmpo export RUN`.")


@dataclass(frozen=True)
class LoggingConfig:
    """Where the run writes and what it reports."""

    run_dir: str = _f("runs/run", "Run directory (config.yaml, metrics.jsonl, tensorboard/, checkpoints/, model/, plots/).")
    progress_bar: bool = _f(True, "tqdm progress bar when the console is a terminal; piped to a file (or when "
                            "false) the console gets plain one-line summaries instead (`print_every_steps`).")
    tensorboard: bool = _f(True, "Write TensorBoard event files to RUN_DIR/tensorboard.")
    wandb: bool = _f(False, "Log to Weights & Biases (needs `wandb` installed).")
    wandb_project: str = _f("lmpo", "W&B project name.")
    print_every_steps: int | None = _f(None, "One-line metric summary every N RL steps (null = none under a "
                                       "progress bar, else a round interval giving about 20 lines; 0 = never).",
                                       ge=0)
    plots: bool = _f(True, "Write the training curves to RUN_DIR/plots/*.png at the end of the run (`lmpo plot`).")
    completions_every_steps: int = _f(0, "Every N RL steps write sampled completions with their rewards, advantage "
                                      "and correctness to RUN_DIR/completions.jsonl and TensorBoard / W&B text "
                                      "(`lmpo show RUN [--step N]` prints them); 0 = never.", ge=0)
    completions_per_step: int = _f(8, "Completions logged per logged step (the first rows of the rollout: whole "
                                   "groups of a prompt first).", ge=1)

    def validate(self) -> None:
        """Ranges, and the `wandb` package when W&B logging is on."""
        check_fields(self, "logging")
        if self.wandb:
            _require_package("wandb", "`logging.wandb` = true needs the `wandb` package; install it or set "
                             "logging.wandb: false.")


# ---- the teacher of on-policy distillation (lmpo.trainer.step.teacher)


@dataclass(frozen=True)
class TeacherConfig:
    """The teacher of on-policy distillation (used when the objective selects a `distill` part)."""

    name: str = _f("", "A built-in preset, a local directory holding a saved Hugging Face causal LM, or a hub id; it "
                   "must share the policy's tokenizer. Empty = no teacher.")
    init_seed: int = _f(0, "Seed of the random initialisation when `name` is a built-in preset.", ge=0)
    dtype: str = _f("float32", "Parameter dtype of the teacher.", choices=("float32", "bfloat16", "float16"))


def validate_teacher(cfg: Any, objective: Any) -> None:
    """The ``teacher`` section against the objective: a distillation part needs a teacher and a teacher needs one."""
    name = cfg.teacher.name
    wants = "teacher_logits" in objective.needs
    if wants and not name:
        raise ConfigError(f"`objective.overrides` selects distill={objective.distill!r}, which needs a teacher, but "
                          "`teacher.name` is empty. Set teacher.name to a model sharing the policy's tokenizer, or "
                          "set objective.overrides.distill: none.")
    if name and not wants:
        raise ConfigError(f"`teacher.name` = {name!r} but the objective has no distillation part, so the teacher "
                          "would never be used. Select one (objective.overrides.distill: reverse_kl or gkd_jsd) or "
                          "leave teacher.name empty.")
    if wants and "token_grad_norm" in objective.needs:
        raise ConfigError(f"distill={objective.distill!r} with credit={objective.credit!r}: per-token gradient norms "
                          "and the distillation forward are not supported together. Use credit: none.")


# ---- multi-turn environments (lmpo.trainer.step.multiturn)


#: the default limit of one environment call: far above any real step, so that only a hang reaches it
DEFAULT_STEP_TIMEOUT_S = 60.0
#: advantage-estimator inputs the episode stage can supply (lengths: policy tokens per episode)
EPISODE_ADVANTAGE_INPUTS = frozenset({"lengths"})


@dataclass(frozen=True)
class SandboxConfig:
    """Where an environment's tools run model-written code (the `python` tool; docs/multiturn.md, "The Python sandbox")."""

    require: str | None = _f(None, "The weakest sandbox mode the run accepts: `jail` (namespaces, seccomp, a "
                             "read-only root; as root or where user namespaces are allowed), `network` (only "
                             "the network cut) or `none`; the run stops at its start when this machine gives less. "
                             "Unset: the strongest available, with a one-line warning when that is not a jail.",
                             choices=(None, "jail", "network", "none"))


@flat_aliases({"import": "imports"})
@dataclass(frozen=True)
class EnvConfig:
    """A multi-turn environment to train on instead of single-turn completions (docs/multiturn.md)."""

    id: str | None = _f(None, "Registered environment id of `lmpo.envs.ENVS` (e.g. `ToolArithmetic-v0`); unset = "
                        "single-turn training. Examples come from the environment's task, built with "
                        "`task.options`; `rollout.completions_per_prompt` episodes are played per example. Ids of "
                        "installed packages' `lmpo.envs` entry points are found without `import`.")
    imports: tuple[str, ...] = _f((), "Modules (dotted names on PYTHONPATH) or `.py` files (relative to the "
                                  "current directory) imported before `id` is looked up, so that their "
                                  "`@register_env` classes are registered: your own environments "
                                  "(docs/multiturn.md, \"Writing an environment\"). Written `env.import` in YAML "
                                  "and on the command line.")
    options: dict = _f({}, "Keyword options of the environment constructor (e.g. `{max_turns: 4}`).")
    budget: EpisodeBudget = _f(EpisodeBudget(), "Episode budgets the driver enforces (replace "
                               "`rollout.max_new_tokens` for multi-turn runs).")
    on_env_error: str = _f("raise", "An environment that raises or returns a malformed result: `raise` stops the "
                           "run naming the environment and the turn; `truncate` ends that episode as truncated "
                           "(`episodes/end_env_error`).", choices=ON_ENV_ERROR)
    step_timeout_s: float | None = _f(DEFAULT_STEP_TIMEOUT_S, "Wall-clock limit of one `reset`/`step` call "
                                      "(null: none): an environment that hangs stops the run with a message naming "
                                      "it and the turn (or ends that episode, under `on_env_error: truncate`).",
                                      gt=0)
    chat_template: str | None = _f(None, "Jinja chat template used instead of the tokenizer's own to render "
                                   "openings and observations.")
    sandbox: SandboxConfig = _f(SandboxConfig(), "The sandbox of tools that run model-written code.")
    turn_discount: float | None = _f(None, "Per-turn credit: with γ set, each turn's tokens get the advantage "
                                     "estimator applied to that turn's discounted return-to-go `G_k = Σ_{j≥k} "
                                     "γ^(j−k) r_j` over the group's episodes that reached turn k; unset: every "
                                     "token of an episode gets the advantage of its return.", ge=0, le=1)


def validate_env(cfg, objective) -> None:
    """The ``env`` section against the rest of the run. Raises ConfigError naming the field and the fix."""
    env = cfg.env
    if env.id is None:
        changed = [k for k, d in (("imports", ()), ("options", {}), ("budget", EpisodeBudget()),
                                  ("on_env_error", "raise"), ("step_timeout_s", DEFAULT_STEP_TIMEOUT_S),
                                  ("chat_template", None), ("turn_discount", None), ("sandbox", SandboxConfig()))
                   if getattr(env, k) != d]
        if changed:
            raise ConfigError(f"`env.{changed[0]}` is set but `env.id` is not: it only acts on multi-turn runs. Set "
                              "env.id to an environment (e.g. ToolArithmetic-v0) or remove it.")
        if cfg.sft.demonstrations:
            raise ConfigError("`sft.demonstrations` is set but `env.id` is not: it mixes the experts of a "
                              "multi-turn warm-up. Set env.id or remove sft.demonstrations.")
        return
    if env.sandbox.require is not None:  # before any environment builds its tools: a weaker machine stops here
        set_default_require(env.sandbox.require, key="env.sandbox.require")
    import_env_modules(env.imports)
    if not is_registered(env.id):
        raise ConfigError(unknown_env_message(env.id, "`env.id` names no registered environment:"))
    _check_warmup(cfg)
    if ENVS[env.id].task is None:
        raise ConfigError(f"`env.id` = {env.id!r} registers no task, so the trainer has no examples to reset it on; "
                          "register it with `task=` (lmpo.envs.register_env).")
    refused = [
        (cfg.task.name in ("file", "hf"), f"`task.name` = {cfg.task.name!r}",
         "the examples of a multi-turn run come from the environment's task; leave task.name at its default"),
        (cfg.rollout.engine != "hf", f"`rollout.engine` = {cfg.rollout.engine!r}",
         "episodes are sampled turn by turn with the Hugging Face sampler; use rollout.engine: hf"),
        (cfg.rollout.ignore_eos, "`rollout.ignore_eos` = true", "a turn ends at its stop token; set it false"),
        (cfg.rlvcr.enabled, "`rlvcr.enabled` = true", "RLVCR expands single-turn completions; disable it"),
        (cfg.rewards.functions != (), f"`rewards.functions` = {list(cfg.rewards.functions)!r}",
         "the environment's rewards are the episode's rewards; remove rewards.functions"),
        (cfg.rewards.overlong_buffer_len > 0, f"`rewards.overlong_buffer_len` = {cfg.rewards.overlong_buffer_len}",
         "overlong shaping measures single completions; use env.budget and objective.mask_truncated_completions"),
        (cfg.eval.samples_per_prompt > 0, f"`eval.samples_per_prompt` = {cfg.eval.samples_per_prompt}",
         "pass@k samples single completions; set it to 0 (evaluation plays greedy episodes)"),
        ("teacher" in objective.needs or bool(cfg.teacher.name), "a distillation teacher",
         "on-policy distillation over episodes is not supported; remove the distill part and teacher.name"),
        (env.turn_discount is not None and cfg.objective.kl_in_reward, "`objective.kl_in_reward` = true with "
         f"`env.turn_discount` = {env.turn_discount}", "the KL penalty shapes episode returns, not turn rewards; "
         "use the KL in the loss (objective.overrides.kl_coef) or unset env.turn_discount"),
    ]
    for bad, what, fix in refused:
        if bad:
            raise ConfigError(f"{what} is not supported with `env.id` = {env.id!r} (multi-turn training): {fix}.")


def _check_warmup(cfg) -> None:
    """``sft.steps`` > 0 on an environment needs its expert; the demonstration shares must fit in one."""
    sft, env = cfg.sft, cfg.env
    if sft.steps <= 0:
        return
    factory = ENVS[env.id].factory
    if isinstance(factory, type) and issubclass(factory, LMEnv) and factory.expert_action is LMEnv.expert_action:
        raise ConfigError(f"`sft.steps` = {sft.steps} with `env.id` = {env.id!r}: the warm-up imitates the "
                          f"environment's expert, and {factory.__name__} has none (no expert_action). Implement "
                          "expert_action (docs/multiturn.md, \"Experts and demonstrations\") or set sft.steps: 0.")
    total = sum(source.fraction for source in sft.demonstrations)
    if total > 1 + 1e-9:
        raise ConfigError(f"`sft.demonstrations` fractions sum to {total:g}: they are shares of one warm-up's "
                          "demonstrations (the rest come from env.options); make them sum to at most 1.")


def check_estimator(estimator, env_id: str, name: str, turn_discount: float | None = None) -> None:
    """The advantage estimator must need nothing the episode stage cannot give (ReMax's greedy baseline,
    per-function reward components; with per-turn credit, anything beyond the returns)."""
    missing = set(estimator.required_inputs()) - (EPISODE_ADVANTAGE_INPUTS if turn_discount is None else set())
    if missing and turn_discount is not None:
        raise ConfigError(f"`objective.advantage_estimator` = {name!r} needs {', '.join(sorted(missing))}, which "
                          f"per-turn credit (`env.turn_discount` = {turn_discount}) does not provide; use grpo, "
                          "rloo or gpg, or unset env.turn_discount.")
    if missing:
        raise ConfigError(f"`objective.advantage_estimator` = {name!r} needs {', '.join(sorted(missing))}, which "
                          f"multi-turn episodes (`env.id` = {env_id!r}) do not provide; use grpo, rloo, "
                          "reinforce_plus_plus or another estimator of episode returns.")


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
    teacher: TeacherConfig = _f(TeacherConfig(), "Teacher of on-policy distillation (objective `distill` parts).")
    env: EnvConfig = _f(EnvConfig(), "Multi-turn environment section (docs/multiturn.md): episodes instead of "
                        "single-turn completions.")

    def validate(self) -> Any:
        """Check every field that can be checked without building a model; raise ConfigError. Returns the
        :class:`lmpo.objectives.Objective` of ``objective.preset`` and ``objective.overrides``, built here once
        (``Trainer`` trains with it: ``build.build_objective``).

        Ranges, choices and finiteness of every section first (:func:`lmpo.config.check_fields`), then each
        section's own ``validate`` (registries, files, packages) and the checks that relate sections.
        """
        check_fields(self)
        objective = self.objective.validate()
        _check_across_sections(self, objective)
        validate_teacher(self, objective)
        validate_env(self, objective)
        _check_async(self)
        if self.teacher.name:
            _check_model_source("teacher.name", self.teacher.name)
        self.rollout.validate()
        if self.seqs_per_step % self.loop.minibatches_per_step:
            raise ConfigError(
                f"`loop.minibatches_per_step` = {self.loop.minibatches_per_step} does not divide the "
                f"{self.seqs_per_step} sequences per step (prompts_per_step × completions_per_prompt); choose a "
                "divisor.")
        self.loop.validate()
        self.model.validate()
        self.task.validate()
        self.rewards.validate()
        self.logging.validate()
        return objective

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
            # an episode is bounded by its budget, not by rollout.max_new_tokens (unused with an environment)
            **({"max_episode_tokens_per_step": self.seqs_per_step * self.env.budget.max_total_tokens}
               if self.env.id is not None else
               {"max_completion_tokens_per_step": self.seqs_per_step * self.rollout.max_new_tokens}),
            "off_policy": self.off_policy,
        }


# ----------------------------------------------------------------------------------------------------
# Building from dicts / YAML / command line
# ----------------------------------------------------------------------------------------------------


def config_from_dict(data: dict | None) -> TrainConfig:
    """Build a TrainConfig from a nested dict (unknown keys raise ConfigError with close matches); top-level
    TRL names (``num_generations``, ``beta`` …, ``lmpo.integrations.trl_names``) are accepted as aliases."""
    from lmpo.integrations.trl_names import resolve_aliases

    return from_dict(TrainConfig, resolve_aliases(data), "")


def config_to_dict(cfg: Any) -> dict:
    """Nested plain dict (tuples as lists) suitable for YAML."""
    return to_dict(cfg)


def load_config(path: str | os.PathLike | None = None, overrides: list[str] | dict | None = None, *,
                base: dict | None = None) -> TrainConfig:
    """``base`` dict ← YAML file (optional) ← overrides (``--a.b value`` list or nested dict) → TrainConfig.

    Top-level TRL names in the file (``num_generations: 8`` …) are resolved to their lmpo keys before the
    overrides apply (``lmpo.integrations.trl_names.resolve_aliases``)."""
    from lmpo.integrations.trl_names import resolve_aliases

    data: dict = dict(base or {})
    if path is not None:
        data = deep_merge(data, resolve_aliases(read_yaml(path)))
    if overrides:
        over = parse_overrides(list(overrides)) if not isinstance(overrides, Mapping) else overrides
        data = deep_merge(data, resolve_aliases(over))
    return from_dict(TrainConfig, data)


def replace(cfg: TrainConfig, **sections: dict) -> TrainConfig:
    """``replace(cfg, loop={"steps": 3})``: a copy with some fields of some sections changed."""
    return config_from_dict(deep_merge(config_to_dict(cfg), sections))


def save_config(cfg: TrainConfig, path: str | os.PathLike) -> None:
    save_yaml(cfg, path)


# ----------------------------------------------------------------------------------------------------
# Validation (before any model is built)
# ----------------------------------------------------------------------------------------------------

def validate_config(cfg: TrainConfig, path: str | os.PathLike | None = None) -> Any:
    """Check every field that can be checked without building a model (:meth:`TrainConfig.validate`) and return
    the objective it built. With the config file's ``path``, a missing `model.name` directory that the file's
    comments say how to write (a warm-up run) is reported with that command."""
    try:
        return cfg.validate()
    except ConfigError as e:
        name = cfg.model.name
        if path is None or not str(e).startswith("`model.name`") or os.path.exists(name):
            raise
        from lmpo.models.loading import warmup_command

        with open(path, encoding="utf-8") as f:
            command = warmup_command(f.read(), name)
        if command is None:
            raise
        raise ConfigError(f"{e} {os.fspath(path)}'s comments give the command that writes {name!r}; run it "
                          f"first: `{command}`") from None


def _check_across_sections(cfg: TrainConfig, objective: Any) -> None:
    """What relates sections: the group size an estimator needs, the KL in the reward and the reference sync
    against RLVCR and LoRA, dynamic sampling, overlong shaping, truncation masking and rollout log-probs."""
    from lmpo.objectives.advantages import ADVANTAGE_ESTIMATORS

    ob, ro, rw = cfg.objective, cfg.rollout, cfg.rewards
    G = ro.completions_per_prompt
    if ADVANTAGE_ESTIMATORS[ob.advantage_estimator].grouped and G < 2:
        raise ConfigError(
            f"`rollout.completions_per_prompt` = {G}: {ob.advantage_estimator!r} advantages are computed "
            "within each prompt's group of completions and are all 0 for a group of one. Set "
            "rollout.completions_per_prompt >= 2 (e.g. 8).")
    if ob.kl_in_reward and cfg.rlvcr.enabled:
        raise ConfigError("`objective.kl_in_reward` = true with `rlvcr.enabled` = true: RLVCR judges successes "
                          "on the rewards, which the KL penalty would shift; the two are not supported "
                          "together. Use the KL in the loss instead (objective.overrides.kl_coef) or disable "
                          "one of them.")
    if ob.ref_sync_steps > 0:
        if not (ob.kl_in_reward or "ref_logp" in objective.needs):
            raise ConfigError(f"`objective.ref_sync_steps` = {ob.ref_sync_steps} but the run has no reference "
                              "model to sync: nothing uses a KL to the reference. Set objective.kl_in_reward: true "
                              "or objective.overrides.kl_coef > 0, or set objective.ref_sync_steps: 0.")
        if cfg.model.lora.enabled:
            raise ConfigError(f"`objective.ref_sync_steps` = {ob.ref_sync_steps} with `model.lora.enabled` = true: "
                              "the reference is the merged base model and the LoRA policy has other parameters, so "
                              "the two cannot be mixed (TRL refuses this too). Set objective.ref_sync_steps: 0 or "
                              "train without LoRA.")
    if rw.overlong_buffer_len > ro.max_new_tokens:
        raise ConfigError(f"`rewards.overlong_buffer_len` = {rw.overlong_buffer_len} exceeds "
                          f"`rollout.max_new_tokens` = {ro.max_new_tokens}: the buffer is the last part of the "
                          "completion budget. Set it to at most max_new_tokens (DAPO: 4096 of 20480), or 0 "
                          "for no overlong shaping.")
    if ob.mask_truncated_completions and ro.ignore_eos:
        raise ConfigError("`objective.mask_truncated_completions` = true with `rollout.ignore_eos` = true would "
                          "mask every completion (none ends with EOS). Switch one of them off.")
    if cfg.rlvcr.enabled and "rollout_logp" in objective.needs:
        raise ConfigError(f"`objective.overrides` = {ob.overrides!r} needs the sampler's log-probs "
                          "(a correction or rejection), but `rlvcr.enabled` re-generates completions the sampler "
                          "never scored. Use correction: none and rejection: none with RLVCR.")


def code_references(data: Mapping) -> list[tuple[str, str]]:
    """``(key, spec)`` of every ``package.module:function`` a config dict (a whole config, or the overrides of a
    command line) names: its reward functions and a task's accuracy or default rewards. Validating or building
    such a config imports these modules (``lmpo.rewards.get_reward_fn``); a run's stored config is read as data,
    so ``lmpo train --resume RUN`` and ``lmpo eval RUN`` refuse the ones only the run directory names."""
    from lmpo.rewards import REWARDS

    def imports(spec: Any) -> bool:
        return isinstance(spec, str) and spec not in REWARDS and ":" in spec

    rewards = data.get("rewards") if isinstance(data.get("rewards"), Mapping) else {}
    task = data.get("task") if isinstance(data.get("task"), Mapping) else {}
    options = task.get("options") if isinstance(task.get("options"), Mapping) else {}
    found = [(f"rewards.functions[{i}]", f) for i, f in enumerate(rewards.get("functions") or ()) if imports(f)]
    if imports(options.get("accuracy_reward")):
        found.append(("task.options.accuracy_reward", options["accuracy_reward"]))
    for i, pair in enumerate(options.get("default_rewards") or ()):
        spec = pair[0] if isinstance(pair, (list, tuple)) and pair else pair
        if imports(spec):
            found.append((f"task.options.default_rewards[{i}]", spec))
    return found


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


def _check_model_source(where: str, name: str) -> None:
    """A model that is not a built-in preset: a local directory must hold a Hugging Face model."""
    from lmpo.models import MODEL_PRESETS

    if name in MODEL_PRESETS:
        return
    presets = ", ".join(sorted(MODEL_PRESETS))
    if os.path.isdir(name):
        if not os.path.isfile(os.path.join(name, "config.json")):
            what = "is empty" if not os.listdir(name) else "has no config.json"
            raise ConfigError(f"`{where}` = {name!r} is a directory but {what}, so it is not a saved Hugging Face "
                              "model. Point it at the directory that holds config.json and the weights, or use a "
                              f"built-in preset ({presets}).")
        return
    if os.path.exists(name):
        raise ConfigError(f"`{where}` = {name!r} is a file; give the model's directory (with config.json and the "
                          f"weights), a Hugging Face hub id, or a built-in preset ({presets}).")
    from lmpo.models.loading import looks_like_hub_id, looks_like_local_path

    if looks_like_hub_id(name):
        return  # a Hugging Face hub id: whether it can be fetched is only known when it is loaded
    if name.count("/") == 1 and looks_like_local_path(name):
        raise ConfigError(f"`{where}` = {name!r}: no such directory exists (working directory: {os.getcwd()}). A "
                          "name that starts with `.`, `/`, `~` or `runs/`, or whose parent directory exists, is a "
                          "local path, never looked up on the Hugging Face Hub. Fix the path, or write the model "
                          "there first.")
    raise ConfigError(f"`{where}` = {name!r} is not a built-in preset ({presets}), no such directory exists "
                      f"(working directory: {os.getcwd()}) and it is not a hub id `org/name`. Fix the path, or "
                      "use a hub id such as `Qwen/Qwen2.5-0.5B-Instruct`.")


def _require_package(module: str, message: str) -> None:
    """An optional package a field switches on; ``message`` names the field and the fix."""
    try:
        importlib.import_module(module)
    except ImportError as e:
        raise ConfigError(message) from e


def _check_device(where: str, device: str) -> None:
    import torch

    if device == "cuda" and not torch.cuda.is_available():
        raise ConfigError(f"`{where}` = 'cuda' but no CUDA device is available to torch {torch.__version__}; "
                          "use `cpu` (or `auto`, which picks CUDA when there is one).")
    if device == "mps" and not (getattr(torch.backends, "mps", None) is not None
                                and torch.backends.mps.is_available()):
        raise ConfigError(f"`{where}` = 'mps' but the Apple MPS backend is not available here; use `cpu` or "
                          "`auto`.")


def _check_async(cfg: TrainConfig) -> None:
    """``rollout.async_staleness`` >= 1: only the combinations whose schedule a worker can follow."""
    ro = cfg.rollout
    k = ro.async_staleness
    if k == 0:
        idle = idle_fields(ro, "async_staleness")
        if idle:
            raise ConfigError(f"`rollout.{idle[0]}` = {getattr(ro, idle[0])!r} has no effect while "
                              "`rollout.async_staleness` = 0 (generation runs in the training process). Set "
                              "rollout.async_staleness: 1 (or more) to use the rollout worker, or leave it at its "
                              "default.")
        return
    why = None
    if ro.engine != "hf":
        why = (f"`rollout.engine` = {ro.engine!r}: the rollout worker runs the `hf` engine only (vLLM in the worker "
               "is not implemented). Use rollout.engine: hf, or rollout.async_staleness: 0")
    elif ro.dynamic_sampling:
        why = ("`rollout.dynamic_sampling` = true: how many draws a step takes depends on the rewards of the draws "
               "before, so prompts cannot be submitted k steps ahead. Switch rollout.dynamic_sampling off (or use "
               "objective.filter_zero_variance), or use rollout.async_staleness: 0")
    elif cfg.rlvcr.enabled:
        why = ("`rlvcr.enabled` = true: RLVCR re-generates completions with the current weights inside the step, "
               "which a stale schedule would mix with the worker's. Use rollout.async_staleness: 0 with RLVCR")
    elif cfg.objective.advantage_estimator == "remax":
        why = ("`objective.advantage_estimator` = 'remax': its greedy baseline would be decoded with newer weights "
               "than the sampled completions. Use another estimator, or rollout.async_staleness: 0")
    elif cfg.model.lora.enabled:
        why = ("`model.lora.enabled` = true: the worker builds the base model and cannot take the adapter's "
               "weights. Use rollout.async_staleness: 0 with LoRA")
    if why is not None:
        raise ConfigError(f"`rollout.async_staleness` = {k} cannot be used with {why}.")


# ----------------------------------------------------------------------------------------------------
# Reference documentation rendered from the dataclasses
# ----------------------------------------------------------------------------------------------------


def render_config_reference() -> str:
    """Markdown tables of every section and field of TrainConfig (the config reference in docs/trainer.md)."""
    return render_reference(TrainConfig)


def render_metrics_reference() -> str:
    """Markdown table of every metric key the trainer logs (from ``lmpo.trainer.run.metrics.METRIC_DOCS``)."""
    from lmpo.trainer.run.metrics import METRIC_DOCS

    rows = ["| key | meaning |", "|---|---|"] + [f"| `{k}` | {v} |" for k, v in METRIC_DOCS.items()]
    return "\n".join(rows) + "\n"
