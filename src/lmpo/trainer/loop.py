"""The training loop. Read ``Trainer.train`` top to bottom; ``_rl_step`` is one RL step::

    prompts (P = prompts_per_step)  →  rollout: G completions each (B = P·G sequences)
    →  rewards (B,)  [ReMax: + the reward of one greedy completion per prompt]  →  advantages (B,)
       [optional zero-variance group filter]
    →  behaviour log-probs (only when off-policy)  →  reference log-probs (only for a KL in the loss or the reward)
    →  for epoch in epochs_per_step, minibatch in minibatches_per_step: one optimizer step
           for microbatch: logp (B_μ,T) [+ entropy, token_grad_norm when needed] → objective → backward
           clip grad-norm → (skip if non-finite) → AdamW step → schedule → entropy controller
    →  rollout_engine.sync_weights (an engine with its own copy of the weights refreshes it)
    →  metrics → evaluation / checkpoint when due

The objective is called through its driver (``lmpo.objectives.ObjectiveDriver``, shared with the TRL and verl
adapters): it says what the objective needs (entropy, reference log-probs, per-token gradient norms), which
this loop computes only when asked; it passes the adaptive entropy coefficient and merges the statistics
(one host sync per optimizer step, which also decides whether the step is finite).

Determinism: data order is a seeded permutation per data epoch (position saved in checkpoints), each step's
sampling uses a generator seeded from ``(loop.seed, step)``, minibatch shuffles and clip_cov's selection
likewise; on CPU a resumed run reproduces the uninterrupted one bit for bit.
"""

from __future__ import annotations

import contextlib
import copy
import math
import os
import random
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import torch
import yaml

from lmpo.checkpoints import replace_file
from lmpo.config import read_yaml
from lmpo.errors import InputError, Interrupted, RunError
from lmpo.generation import PolicyLogprobs, policy_logprobs
from lmpo.objectives import Objective, ObjectiveDriver
from lmpo.objectives.driver import merge_stats
from lmpo.rewards.overlong import overlong_penalty
from lmpo.runs import check_resume_config, prepare_run_dir, stop_on_sigint
from lmpo.trainer import checkpoint as ckpt
from lmpo.trainer.config import TrainConfig, config_to_dict, validate_config
from lmpo.trainer.evaluate import evaluate, reward_arguments
from lmpo.trainer.export import FINAL_MODEL_DIR
from lmpo.trainer.metrics import MetricsLogger, to_host
from lmpo.trainer.mismatch import mismatch_metrics
from lmpo.trainer.optim import Schedule, build_optimizer
from lmpo.trainer.sampling import ScoredRollout, dynamic_sample, mask_truncated
from lmpo.trainer.sft import supervised_warmup

#: what a trainer run directory holds (``--overwrite`` deletes these and nothing else)
RUN_ENTRIES = ("config.yaml", "metrics.jsonl", "checkpoints", FINAL_MODEL_DIR, "tensorboard", "wandb",
               "completions.jsonl")

#: config keys ``--resume`` may change without ``--allow-config-change``
RESUMABLE_KEYS = ("loop.steps", "logging.*", "eval.*", "checkpoint.*")


class CompiledCalls:
    """A module whose calls (``module(...)``) run through ``torch.compile``; every other attribute is the
    module's own (``train()``, ``config``, ``get_decoder()``...), so code that takes a model can take this.

    Only the log-prob forwards go through it: generation and checkpoints use the module itself.
    """

    def __init__(self, module: torch.nn.Module) -> None:
        self.module = module
        self._compiled = torch.compile(module)

    def __call__(self, *args, **kwargs):
        return self._compiled(*args, **kwargs)

    def __getattr__(self, name: str):
        return getattr(self.module, name)


class NonFiniteError(RunError):
    """Too many consecutive optimizer steps had a non-finite loss or gradient."""


@dataclass
class TrainResult:
    """What ``Trainer.train`` returns."""

    run_dir: Path
    steps_done: int
    eval_before: dict[str, float] | None = None
    eval_after: dict[str, float] | None = None
    history: list[dict[str, float]] = field(default_factory=list)  # train metrics of the steps run here
    nonfinite_skipped: int = 0
    sft_losses: list[float] = field(default_factory=list)
    seconds: float = 0.0
    plots: list[Path] = field(default_factory=list)  # RUN_DIR/plots/*.png (logging.plots)


def _seed_for(*parts: int) -> int:
    """A 63-bit seed from integers (splitmix-style), so nearby steps get unrelated streams."""
    h = 0x9E3779B97F4A7C15
    for p in parts:
        h ^= (int(p) + 0x9E3779B97F4A7C15 + (h << 6) + (h >> 2)) & 0xFFFFFFFFFFFFFFFF
        h = (h * 0xBF58476D1CE4E5B9) & 0xFFFFFFFFFFFFFFFF
    return h & 0x7FFFFFFFFFFFFFFF


def _resolve_device(name: str) -> torch.device:
    if name == "auto":
        if torch.cuda.is_available():
            return torch.device("cuda")
        if getattr(torch.backends, "mps", None) is not None and torch.backends.mps.is_available():
            return torch.device("mps")
        return torch.device("cpu")
    return torch.device(name)


def build_task(tk):
    """The task of a run's ``task`` config section (also used by ``lmpo eval RUN``)."""
    from lmpo.tasks import load_file_task, load_hf_task, make_task

    if tk.name == "file":
        return load_file_task(tk.path, prompt_field=tk.prompt_field, answer_field=tk.answer_field, **tk.options)
    if tk.name == "hf":
        return load_hf_task(tk.hf_name, prompt_field=tk.prompt_field, answer_field=tk.answer_field, **tk.options)
    return make_task(tk.name, **tk.options)


class Trainer:
    """Single-machine GRPO-family trainer.

    >>> result = Trainer(load_config("configs/addition_grpo.yaml")).train()

    Args:
        config: the run (validated here, before any model is built).
        model, tokenizer: use these instead of building ``config.model.name``.
        task: use this task instead of building ``config.task``.
        rollout_engine: a ``lmpo.generation.RolloutEngine`` (default: the ``rollout.engine`` of the config,
            ``lmpo.generation.HFRollout`` unless set).
        log: callable for one-line console messages (default ``print``).
    """

    def __init__(self, config: TrainConfig, *, model=None, tokenizer=None, task=None, rollout_engine=None,
                 log: Callable[[str], None] | None = None):
        validate_config(config)
        self.cfg = config
        self.log = log or (lambda msg: print(msg, flush=True))
        if config.loop.num_threads > 0:
            torch.set_num_threads(config.loop.num_threads)
        self.device = _resolve_device(config.loop.device)
        self.run_dir = Path(config.logging.run_dir)
        #: test hook: ``loss_hook(rl_step, loss) -> loss`` applied to every microbatch loss (NaN injection)
        self.loss_hook: Callable[[int, torch.Tensor], torch.Tensor] | None = None

        # the trainer checks loss and gradient finiteness once per optimizer step itself (and skips the step),
        # so the objective's own per-call check (one host sync per microbatch) is off unless asked for
        self.objective = Objective.preset(config.objective.preset,
                                          **{"check_finite": False, **config.objective.overrides})
        self.driver = ObjectiveDriver(self.objective)
        from lmpo.objectives.advantages import make_estimator

        #: the advantage estimator; what it needs beyond (rewards, group ids) is computed by _advantage_inputs
        self.estimator = make_estimator(config.objective.advantage_estimator,
                                        default_scale=self.objective.advantage_scale,
                                        **config.objective.advantage_options)

        try:
            self.task = task if task is not None else self._build_task()
        except (OSError, ValueError, KeyError, TypeError, ImportError) as e:
            raise self._task_error(e) from None
        train_examples = self.task.train_examples(seed=config.loop.seed)
        eval_examples = self.task.eval_examples()[: config.task.eval_examples]

        if model is None:
            model, tok = self._load_model(config.model.name, "model.name", seed=config.model.init_seed)
            tokenizer = tokenizer or tok
        elif tokenizer is None:
            raise ValueError("Trainer(model=...) needs tokenizer=... as well")
        self.model = model.to(self.device)
        self.tokenizer = tokenizer
        # conversational prompts become text through the policy's chat template (lmpo.tasks.chat)
        self.train_examples = self._render_prompts(train_examples)
        self.eval_examples = self._render_prompts(eval_examples)
        self.scorer, self.accuracy_fn = self._build_rewards()
        if config.loop.gradient_checkpointing:
            # non-reentrant: works with inputs that do not require grad and with LoRA's frozen base weights
            self.model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
        if config.model.lora.enabled:
            self.model = self._wrap_lora(self.model)
        self.rollout_engine = rollout_engine
        self.ref_model = None
        self._generate_s = 0.0  # seconds spent in rollout_engine.generate during the current RL step
        self.kl_ctrl = self._build_kl_controller()
        self.teacher = None  # on-policy distillation (an objective `distill` part): lmpo.trainer.teacher
        if self.driver.needs.teacher:
            from lmpo.trainer.teacher import Teacher

            self.teacher = Teacher.load(config.teacher, self.model, self.tokenizer, policy_name=config.model.name,
                                        device=self.device, top_k=self.driver.needs.teacher_top_k)
        #: ``loop.compile``: the policy's log-prob forwards (with their backward) and the HF engine's decode step
        self.compile_train = self.compile_decode = config.loop.compile
        self._compiled_policy: CompiledCalls | None = None

    @property
    def controller(self):
        """The adaptive entropy controller (held by the objective driver), or None."""
        return self.driver.controller

    # ---------------------------------------------------------------- construction helpers
    def _build_task(self):
        return build_task(self.cfg.task)

    def _render_prompts(self, examples):
        from lmpo.tasks import render_prompts

        tk = self.cfg.task
        return render_prompts(examples, self.tokenizer, tk.prompt_format, tk.chat_template,
                              model_name=f"model {self.cfg.model.name!r}", source=f"task {self.task.name!r}")

    def _build_rewards(self):
        from lmpo.rewards import RewardModel, RewardScorer, RewardSpec, get_reward_fn
        from lmpo.trainer.config import RewardModelConfig

        rw = self.cfg.rewards
        conversational = any(e.messages is not None for e in self.train_examples + self.eval_examples)
        if rw.functions:
            weights = rw.weights or (1.0,) * len(rw.functions)
            specs = []
            for f, w in zip(rw.functions, weights):
                if isinstance(f, RewardModelConfig):
                    rm = RewardModel(f.model, seqs_per_batch=f.seqs_per_batch, chat_template=f.chat_template,
                                     dtype=f.dtype, device=self.device)
                    if conversational:
                        rm.check_conversational(f"task {self.task.name!r}")
                    specs.append(RewardSpec(f.metric_name, w, fn=rm))
                else:
                    specs.append(RewardSpec(f, w, dict(rw.kwargs.get(f, {}))))
        else:
            specs = [{"name": n, "weight": w} for n, w in self.task.default_rewards]
        if rw.workers > 0:  # a pool with a timeout per call (lmpo.rewards.parallel)
            from lmpo.rewards.parallel import ParallelRewardScorer

            scorer = ParallelRewardScorer(specs, on_error=rw.on_error, workers=rw.workers, pool=rw.pool,
                                          timeout_s=rw.timeout_s, seqs_per_call=rw.seqs_per_call)
        else:
            scorer = RewardScorer(specs, on_error=rw.on_error)
        accuracy_fn = get_reward_fn(getattr(self.task, "accuracy_reward", "exact_match"))
        return scorer, accuracy_fn

    def _wrap_lora(self, model):
        from peft import LoraConfig as PeftLoraConfig
        from peft import get_peft_model

        lc = self.cfg.model.lora
        peft_cfg = PeftLoraConfig(r=lc.r, lora_alpha=lc.alpha, lora_dropout=lc.dropout,
                                  target_modules=list(lc.target_modules), task_type="CAUSAL_LM")
        return get_peft_model(model, peft_cfg)

    def _make_rollout_engine(self):
        from lmpo.generation import ENGINES

        ro = self.cfg.rollout
        options = {"gpu_memory_utilization": ro.vllm_gpu_memory_utilization, "seed": self.cfg.loop.seed} if (
            ro.engine == "vllm") else {}
        if ro.engine == "hf" and self.compile_decode:
            options["compile_decode"] = True
        return ENGINES[ro.engine](self.model, self.tokenizer, max_new_tokens=ro.max_new_tokens,
                                  temperature=ro.temperature, top_p=ro.top_p, top_k=ro.top_k, ignore_eos=ro.ignore_eos,
                                  record_logprobs=ro.record_logprobs or self.driver.needs.rollout_logp, **options)

    def _policy_for_logprobs(self, model):
        """``model``, or for the policy under ``loop.compile`` a view of it whose calls run compiled."""
        if not self.compile_train or model is not self.model:
            return model
        if self._compiled_policy is None or self._compiled_policy.module is not model:
            self._compiled_policy = CompiledCalls(model)
        return self._compiled_policy

    def _autocast(self):
        """The forward passes' autocast context (``loop.autocast``); parameters and optimizer stay as they are."""
        if not self.cfg.loop.autocast:
            return contextlib.nullcontext()
        return torch.autocast(device_type=self.device.type, dtype=torch.bfloat16)

    # ---------------------------------------------------------------- the run
    def train(self, resume: str | os.PathLike | bool | None = None, *, overwrite: bool = False,
              allow_config_change: bool = False) -> TrainResult:
        """Run (or resume) the whole schedule: warm-up, RL steps, evaluations, checkpoints.

        Args:
            resume: None (a new run), ``"auto"`` (the newest complete checkpoint of ``logging.run_dir``) or a
                checkpoint / run directory. A run directory that already holds a run is refused without it.
            overwrite: delete the run already in ``logging.run_dir`` and start again.
            allow_config_change: resume although the config differs from the stored one in keys other than
                ``RESUMABLE_KEYS`` (steps, logging, evaluation, checkpoints).

        A Ctrl-C (SIGINT) finishes the current RL step, writes a checkpoint and raises
        :class:`lmpo.errors.Interrupted`; a second Ctrl-C stops at once.
        """
        cfg = self.cfg
        t_start = time.perf_counter()
        resume_path = self._prepare_run_dir(resume, overwrite, allow_config_change)
        result = TrainResult(run_dir=self.run_dir, steps_done=0)

        totals = cfg.derived_totals()
        self.log("lmpo train: " + ", ".join(f"{k}={v}" for k, v in totals.items()) + f", device={self.device}")

        # 1. supervised warm-up (skipped on resume: the checkpoint already holds the warmed-up weights)
        if resume_path is None and cfg.sft.steps > 0:
            check_set = self.train_examples[: cfg.sft.check_examples]

            def train_accuracy() -> float:
                return self._evaluate(check_set)["eval/accuracy"]

            result.sft_losses = supervised_warmup(self.model, self.tokenizer, self.task, self.train_examples,
                                                  cfg.sft, seed=cfg.loop.seed, device=self.device, log=self.log,
                                                  accuracy_check=train_accuracy)

        # 2. reference model: a frozen copy of the initial policy (or a given path), only when needed
        if self.needs_ref_model:
            self.ref_model = self._build_ref_model()
            if cfg.objective.ref_sync_steps > 0:
                from lmpo.trainer.ref_sync import check_sync_compatible

                check_sync_compatible(self.ref_model, self.model)

        # 3. optimizer, schedule, adaptive entropy controller, data order
        self.optimizer = build_optimizer(self.model.parameters(), cfg.optim)
        self.schedule = Schedule(self.optimizer, cfg.optim, cfg.total_optimizer_steps)
        self.data_epoch, self.data_pos = 0, 0
        self._perm = self._permutation(0)
        self.nonfinite_total, self.nonfinite_in_row = 0, 0
        self.final_eval_done = False
        start_step, metrics_rows = 0, None
        if resume_path is not None:
            start_step, metrics_rows = self._load(resume_path)
            self.log(f"resumed from {resume_path} at step {start_step}")
        if self.rollout_engine is None:
            self.rollout_engine = self._make_rollout_engine()

        lg = cfg.logging
        self.metrics = MetricsLogger(self.run_dir, cfg.loop.steps, start_step=start_step, keep_rows=metrics_rows,
                                     progress_bar=lg.progress_bar, tensorboard=lg.tensorboard, wandb=lg.wandb,
                                     wandb_project=lg.wandb_project, config=config_to_dict(cfg),
                                     print_every_steps=lg.print_every_steps)
        self.completion_log = None  # logging.completions_every_steps (lmpo.trainer.completions, `lmpo show`)
        if lg.completions_every_steps > 0:
            from lmpo.trainer.completions import CompletionLog

            self.completion_log = CompletionLog(self.run_dir, lg.completions_every_steps, lg.completions_per_step,
                                                start_step=start_step, metrics=self.metrics)
        try:
            with stop_on_sigint(self.log) as self._stop:
                if resume_path is None and cfg.eval.at_start:
                    result.eval_before = self._evaluate()
                    self.metrics.log(0, result.eval_before, kind="eval")
                self._stop_if_asked(start_step)
                step = start_step
                for step in range(start_step + 1, cfg.loop.steps + 1):
                    stats = self._rl_step(step)
                    self.metrics.log(step, stats)
                    result.history.append(stats)
                    if cfg.eval.every_steps and step % cfg.eval.every_steps == 0 and step != cfg.loop.steps:
                        self.metrics.log(step, self._evaluate(), kind="eval")
                    if cfg.checkpoint.every_steps and step % cfg.checkpoint.every_steps == 0:
                        self.save(step)
                    self._stop_if_asked(step)
                result.steps_done = step
                if not self.final_eval_done:
                    result.eval_after = self._evaluate()
                    self.metrics.log(cfg.loop.steps, result.eval_after, kind="eval")
                    self.final_eval_done = True
                    if cfg.checkpoint.at_end:
                        self.save(cfg.loop.steps)
                if cfg.checkpoint.final_model:
                    self.save_final_model(step)
        finally:
            self.metrics.close()
            if self.completion_log is not None:
                self.completion_log.close()
        if cfg.logging.plots:
            from lmpo.trainer.plot import plot_runs

            result.plots = plot_runs([self.run_dir])
        result.nonfinite_skipped = self.nonfinite_total
        result.seconds = time.perf_counter() - t_start
        return result

    # ---------------------------------------------------------------- run directory, interrupts
    def _prepare_run_dir(self, resume, overwrite: bool, allow_config_change: bool) -> Path | None:
        """One run per directory, the config check of ``--resume``, then the resolved config saved."""
        cfg, run_dir = self.cfg, self.run_dir
        resume_path = None
        if resume in (None, False):
            prepare_run_dir(run_dir, RUN_ENTRIES, resume=False, overwrite=overwrite, dir_option="logging.run_dir")
        else:
            target = run_dir if resume in (True, "auto", "latest") else Path(resume)
            own = run_dir.resolve() in (target.resolve(), *target.resolve().parents)
            # a checkpoint of another run starts this directory from it (a new run); otherwise it continues
            prepare_run_dir(run_dir, RUN_ENTRIES, resume=own, overwrite=overwrite, dir_option="logging.run_dir")
            stored = run_dir / "config.yaml"
            if own and stored.is_file():
                check_resume_config(read_yaml(stored, "stored config"), config_to_dict(cfg), RESUMABLE_KEYS,
                                    allow_change=allow_config_change, stored_path=stored, schema=TrainConfig)
            resume_path = ckpt.resolve_resume(target, run_dir, log=self.log)
        replace_file(run_dir / "config.yaml",
                     yaml.safe_dump(config_to_dict(cfg), sort_keys=False, allow_unicode=True).encode("utf-8"))
        return resume_path

    def _stop_if_asked(self, step: int) -> None:
        if self._stop.requested:
            path = self.save(step)
            raise Interrupted(f"stopped by Ctrl-C after RL step {step} of {self.cfg.loop.steps}; checkpoint "
                              f"written to {path}.", checkpoint=path)

    def _task_error(self, e: Exception) -> InputError:
        """A task that cannot be built, as one message naming the config keys to fix."""
        tk = self.cfg.task
        what = {"file": f"`task.path` = {tk.path!r}", "hf": f"`task.hf_name` = {tk.hf_name!r}"}.get(
            tk.name, f"`task.name` = {tk.name!r} with `task.options` = {tk.options!r}")
        detail = " ".join(str(e.args[0] if isinstance(e, KeyError) and e.args else e).split())
        return InputError(f"{what}: the task cannot be built ({type(e).__name__}: {detail}). Fix the data or the "
                          "task.* settings (prompt_field, answer_field, options).")

    def _load_model(self, name: str, where: str, seed: int = 0):
        """A built-in preset, a local model directory or a hub id; a failure names the config key."""
        from lmpo.models import load_model_and_tokenizer

        try:
            return load_model_and_tokenizer(name, dtype=self.cfg.model.dtype, device=self.device, seed=seed)
        except (OSError, ValueError) as e:
            first = " ".join(str(e).split())[:300]
            raise InputError(f"`{where}` = {name!r} could not be loaded ({type(e).__name__}: {first}). Give a "
                             "built-in preset, a local directory holding a saved Hugging Face model (config.json "
                             "and weights), or a hub id this machine can download (or has cached).") from None

    # ---------------------------------------------------------------- one RL step
    def _rl_step(self, step: int) -> dict[str, float]:
        cfg, obj = self.cfg, self.objective
        t0 = time.perf_counter()

        # sample prompts, generate G completions each, score rewards (prompt-major: sequence b belongs to prompt
        # b // G); with dynamic sampling, as many draws as it takes to fill the batch with informative groups
        self._generate_s = 0.0
        scored, sampling_stats = self._sample_and_score(step)
        ro, rewards, per_fn, correct = scored.rollout, scored.rewards, scored.per_fn, scored.correct
        group = ro.group_ids.to(self.device)
        t_gen = t0 + self._generate_s
        # KL in the reward (objective.kl_in_reward): the advantages see r − β·Σ KL, the reward metrics r
        adv_rewards, kl_stats, kl_ref_logp = self._kl_in_reward(ro, rewards) if self.kl_ctrl is not None else (
            rewards, {}, None)

        # advantages (B,) and the zero-variance statistic
        from lmpo.objectives.advantages import zero_variance_mask

        adv, adv_stats = self.estimator(adv_rewards, group, **self._advantage_inputs(scored.examples, ro, per_fn))
        zero_var = zero_variance_mask(adv_rewards, group)  # (B,): the completion's group carries no signal
        if getattr(self, "completion_log", None) is not None and self.completion_log.due(step):
            from lmpo.trainer.completions import completion_records

            self.completion_log.log(step, completion_records(step, scored.examples, ro, rewards, per_fn, correct, adv,
                                                             self.cfg.logging.completions_per_step))
        keep = ~zero_var if cfg.objective.filter_zero_variance else torch.ones_like(group, dtype=torch.bool)
        t_score = time.perf_counter()

        comp_mask = ro.completion_mask.to(self.device).bool()
        lengths = comp_mask.sum(-1).float()
        stats: dict[str, torch.Tensor | float] = {
            "reward/mean": rewards.mean(), "reward/std": rewards.std() if rewards.numel() > 1 else rewards.new_zeros(()),
            "reward/accuracy": correct.mean(), "reward/errors": scored.reward_errors,
            "adv/mean": adv[keep].mean() if keep.any() else adv.new_zeros(()),
            "adv/std": adv[keep].std() if keep.sum() > 1 else adv.new_zeros(()),
            "adv/abs_mean": adv[keep].abs().mean() if keep.any() else adv.new_zeros(()),
            "adv/zero_var_frac": zero_var.float().mean(), "adv/kept_frac": keep.float().mean(),
            "completion/length_mean": lengths.mean(), "completion/length_max": lengths.max(),
            "completion/truncated_frac": self._truncated_frac(ro, comp_mask),
        }
        for name, vals in per_fn.items():
            finite = vals[torch.isfinite(vals)]
            stats[f"reward/{name}/mean"] = finite.mean() if finite.numel() else torch.tensor(float("nan"))
            stats[f"reward/{name}/std"] = finite.std() if finite.numel() > 1 else torch.tensor(0.0)
        for k, v in (adv_stats or {}).items():
            stats.setdefault(k if "/" in k else f"adv/{k}", v)
        stats.update(sampling_stats)
        stats.update(kl_stats)

        if cfg.rlvcr.enabled:  # RLVCR (docs/rlvcr.md, lmpo.rlvcr): expand successes per thinking level, mix advantages
            from lmpo.rlvcr.expansion import rlvcr_stage

            rl = rlvcr_stage(self.model, self.tokenizer, ro, rewards, cfg.rlvcr, keep=keep, scale=obj.advantage_scale,
                             temperature=cfg.rollout.temperature, top_p=cfg.rollout.top_p, top_k=cfg.rollout.top_k,
                             generator=torch.Generator(self.device).manual_seed(_seed_for(cfg.loop.seed, step, 5)))
            ro, adv, keep, comp_mask = rl.rollout, rl.advantages, rl.keep, rl.rollout.completion_mask.to(self.device).bool()
            stats.update(rl.metrics)

        # the sequences trained on
        idx = torch.nonzero(keep).squeeze(-1)
        batch = {
            "input_ids": ro.input_ids.to(self.device)[idx],
            "attention_mask": ro.attention_mask.to(self.device)[idx],
            "completion_ids": ro.completion_ids.to(self.device)[idx],
            "mask": comp_mask[idx],
            "adv": adv[idx],
        }
        if kl_ref_logp is not None and self.driver.needs.ref_logp:  # already computed for the KL in the reward
            batch["ref_logp"] = kl_ref_logp[idx]
        trainable = idx.numel() > 0
        if cfg.objective.mask_truncated_completions:
            batch["mask"], stats["completion/truncated_masked_frac"] = mask_truncated(batch["mask"],
                                                                                 ro.truncated.to(self.device)[idx])
            trainable = trainable and bool(batch["mask"].any())
        if ro.logprobs is not None:  # the sampler's log-probs: mismatch statistics, and corrections when needed
            batch["rollout_logp"] = ro.logprobs.to(self.device)[idx]
        elif self.driver.needs.rollout_logp:
            raise RunError(f"objective {obj.name!r} needs the sampler's log-probs (correction={obj.correction!r}, "
                           f"rejection={obj.rejection!r}), but the generation engine "
                           f"{type(self.rollout_engine).__name__} returned none; give an engine that records them "
                           "(HFRollout(..., record_logprobs=True), or rollout.record_logprobs: true).")
        train_stats = self._update(step, batch) if trainable else {}
        stats.update(train_stats)
        self.rollout_engine.sync_weights(self.model)  # after this step's optimizer steps, before the next rollout
        t_end = time.perf_counter()

        tokens = float(lengths.sum()) + float(batch["mask"].sum())
        stats.update({"time/generate_s": t_gen - t0, "time/score_s": t_score - t_gen, "time/train_s": t_end - t_score,
                      "perf/step_s": t_end - t0, "perf/tokens_per_s": tokens / max(t_end - t0, 1e-9),
                      "optim/nonfinite_skipped": float(self.nonfinite_total)})
        return to_host(stats)

    def _advantage_inputs(self, examples, ro, per_fn: dict[str, torch.Tensor], engine=None) -> dict[str, torch.Tensor]:
        """What the advantage estimator needs beyond (rewards, group ids), computed only when it asks: completion
        lengths, each reward function's values (undefined → 0, as in the total) with their weights, or the reward
        of each prompt's greedy completion (ReMax: one extra greedy generation per prompt, from ``engine``, by
        default the run's rollout engine)."""
        needs = self.estimator.required_inputs()
        inputs: dict[str, torch.Tensor] = {}
        if "lengths" in needs:
            inputs["lengths"] = ro.completion_lengths.to(self.device)
        if "reward_components" in needs:
            names = self.scorer.names
            inputs["reward_components"] = torch.stack(
                [torch.nan_to_num(per_fn[n], nan=0.0) for n in names], dim=1).to(self.device)  # (B, K)
            inputs["reward_weights"] = torch.tensor([self.scorer.weights[n] for n in names], device=self.device)
        if "baseline_rewards" in needs:
            with torch.no_grad(), self._autocast():
                greedy = (engine or self.rollout_engine).generate([e.prompt for e in examples], 1, greedy=True)
            prompts, completions, answers, columns = reward_arguments(examples, greedy.completions)
            greedy_rewards, _ = self.scorer.score(prompts, completions, answers, **columns)  # (P,)
            inputs["baseline_rewards"] = greedy_rewards.to(self.device)[ro.group_ids.to(self.device)]  # (B,)
        return inputs

    def _sample_and_score(self, step: int) -> tuple[ScoredRollout, dict[str, float]]:
        """This step's scored rollout: one draw, or DAPO dynamic sampling's draws (``rollout.dynamic_sampling``)."""
        ro = self.cfg.rollout
        if not ro.dynamic_sampling:
            return self._draw(step, 0), {}
        return dynamic_sample(lambda k: self._draw(step, k), self.cfg.loop.prompts_per_step,
                              ro.completions_per_prompt, metric=ro.dynamic_sampling_metric,
                              max_draws=ro.dynamic_sampling_max_draws, pad_token_id=self.tokenizer.pad_token_id)

    def _draw(self, step: int, k: int) -> ScoredRollout:
        """Draw ``k`` of RL step ``step``: the next ``prompts_per_step`` prompts, G completions each, scored (plus
        DAPO's overlong penalty when ``rewards.overlong_buffer_len`` > 0)."""
        cfg = self.cfg
        examples = self._next_examples(cfg.loop.prompts_per_step)
        seed = _seed_for(cfg.loop.seed, step, 1) if k == 0 else _seed_for(cfg.loop.seed, step, 1, k)
        t = time.perf_counter()
        # (no inference_mode: the sampled ids become inputs of the training graph)
        with self._autocast():
            ro = self.rollout_engine.generate([e.prompt for e in examples], cfg.rollout.completions_per_prompt,
                                              seed=seed)
        self._generate_s += time.perf_counter() - t
        group = ro.group_ids.to(self.device)
        prompts, completions, answers, columns = reward_arguments([examples[i] for i in group.tolist()],
                                                                  ro.completions)
        rewards, per_fn = self.scorer.score(prompts, completions, answers, **columns)
        acc_values = self.accuracy_fn(prompts=prompts, completions=completions, answer=answers, **columns)
        correct = torch.tensor([v is not None and float(v) >= cfg.rewards.success_threshold for v in acc_values],
                               dtype=torch.float32)
        rewards = rewards.to(self.device)
        rw = cfg.rewards
        if rw.overlong_buffer_len > 0:
            penalty = overlong_penalty(ro.completion_lengths.to(self.device), cfg.rollout.max_new_tokens,
                                       rw.overlong_buffer_len, rw.overlong_penalty_factor)
            rewards = rewards + penalty.to(rewards.dtype)
            per_fn = {**per_fn, "overlong": penalty}
        return ScoredRollout(examples, ro, rewards, per_fn, correct,
                             reward_errors=float(self.scorer.last_stats.get("reward/skipped", 0.0)))

    def _truncated_frac(self, ro, comp_mask: torch.Tensor) -> torch.Tensor:
        eos = self.tokenizer.eos_token_id
        ids = ro.completion_ids.to(comp_mask.device)
        has_eos = ((ids == eos) & comp_mask).any(-1)
        return (~has_eos).float().mean()

    # ---------------------------------------------------------------- the update
    def _update(self, step: int, batch: dict[str, torch.Tensor]) -> dict[str, float]:
        """``epochs_per_step × minibatches_per_step`` optimizer steps on one rollout batch; merged statistics."""
        cfg = self.cfg
        B = batch["input_ids"].shape[0]
        self.model.train()
        # behaviour log-probs: only when the same rollout is used for more than one optimizer step
        batch["old_logp"] = self._logprobs(self.model, batch, with_grad=False).logp if cfg.off_policy else None
        if "ref_logp" not in batch:
            batch["ref_logp"] = (self._logprobs(self.ref_model, batch, with_grad=False).logp
                                 if self.driver.needs.ref_logp else None)
        if "rollout_logp" in batch and batch["old_logp"] is None:
            # on-policy: the single optimizer step's forwards give the training log-probs before the update
            batch["train_logp"] = torch.zeros_like(batch["rollout_logp"])

        per_step: list[dict[str, float]] = []
        lr = self.schedule.current_lr()
        for epoch, m, rows in self._minibatches(step, B):
            cov_gen = torch.Generator(device=self.device).manual_seed(_seed_for(cfg.loop.seed, step, 3, epoch, m))
            stats = self._optimizer_step(step, batch, rows, cov_gen)
            if stats is not None:
                lr = stats.pop("optim/lr")
                per_step.append(stats)
        out = merge_stats(per_step) if per_step else {"loss/total": float("nan"), "optim/grad_norm": float("nan")}
        out["optim/lr"] = float(lr)  # of the last optimizer step
        if "rollout_logp" in batch:
            train_logp = batch["old_logp"] if batch["old_logp"] is not None else batch["train_logp"]
            out.update(mismatch_metrics(train_logp, batch["rollout_logp"], batch["mask"]))
        return out

    def _minibatches(self, step: int, B: int):
        """``(epoch, index, rows)`` of every optimizer step of an RL step: each epoch a seeded shuffle of the B
        sequences (in order when there is one minibatch), cut into ``minibatches_per_step`` equal parts."""
        M = self.cfg.loop.minibatches_per_step
        size = -(-B // M)
        shuffle_gen = torch.Generator().manual_seed(_seed_for(self.cfg.loop.seed, step, 2))
        for epoch in range(self.cfg.loop.epochs_per_step):
            order = torch.randperm(B, generator=shuffle_gen) if M > 1 else torch.arange(B)
            order = order.to(self.device)
            for m in range(M):
                if order[m * size:(m + 1) * size].numel():
                    yield epoch, m, order[m * size:(m + 1) * size]

    def _optimizer_step(self, step: int, batch: dict[str, torch.Tensor], rows: torch.Tensor,
                        cov_gen: torch.Generator) -> dict[str, float] | None:
        """One optimizer step over the minibatch ``rows`` (microbatches accumulate with exact global
        normalisers); its statistics, or None when the loss or gradient was non-finite and the step skipped."""
        cfg = self.cfg
        num_tokens = batch["mask"][rows].sum()
        num_seqs = int(rows.numel())
        self.optimizer.zero_grad(set_to_none=True)
        loss_sum = torch.zeros((), device=self.device)
        for start in range(0, num_seqs, cfg.loop.seqs_per_microbatch):
            mu = rows[start:start + cfg.loop.seqs_per_microbatch]
            needs = self.driver.needs
            distill = {}  # the policy's full logits and the teacher's, for a distillation part
            if self.teacher is not None:
                with self._autocast():
                    fwd, distill = self.teacher.forward(self.model, batch["input_ids"][mu], batch["attention_mask"][mu],
                                                        batch["completion_ids"][mu], with_entropy=needs.entropy,
                                                        temperature=cfg.rollout.temperature)
            else:
                fwd = self._logprobs(self.model, batch, mu, with_grad=True, with_entropy=needs.entropy,
                                     grad_norm_mode=needs.token_grad_norm)
            old = batch["old_logp"][mu] if batch["old_logp"] is not None else fwd.logp.detach()
            ref = batch["ref_logp"][mu] if batch["ref_logp"] is not None else None
            if "train_logp" in batch:
                batch["train_logp"][mu] = fwd.logp.detach()
            rollout = batch["rollout_logp"][mu] if self.driver.needs.rollout_logp else None
            loss = self.driver.loss(fwd.logp, old, batch["adv"][mu], batch["mask"][mu], weight=mu.numel() / num_seqs,
                                    ref_logp=ref, entropy=fwd.entropy, token_grad_norm=fwd.token_grad_norm,
                                    rollout_logp=rollout, num_tokens=num_tokens, num_seqs=num_seqs,
                                    generator=cov_gen, **distill)
            if self.loss_hook is not None:
                loss = self.loss_hook(step, loss)
            loss.backward()
            loss_sum = loss_sum + loss.detach()
        params = [p for p in self.model.parameters() if p.requires_grad]
        max_norm = cfg.optim.max_grad_norm if cfg.optim.max_grad_norm > 0 else math.inf
        grad_norm = torch.nn.utils.clip_grad_norm_(params, max_norm)
        # the one host sync of the step: the objective's statistics, the loss and the gradient norm
        stats = self.driver.end_step(extra={"loss/total": loss_sum, "optim/grad_norm": grad_norm},
                                     update_controller=False)
        if not (math.isfinite(stats["loss/total"]) and math.isfinite(stats["optim/grad_norm"])):
            self._skip_nonfinite(step, stats)
            return None
        self.nonfinite_in_row = 0
        stats["optim/lr"] = self.schedule.apply()
        self.optimizer.step()
        self.schedule.advance()
        self._sync_ref_if_due()
        self.driver.commit_step(stats)
        return stats

    def _skip_nonfinite(self, step: int, stats: dict[str, float]) -> None:
        self.optimizer.zero_grad(set_to_none=True)
        self.nonfinite_total += 1
        self.nonfinite_in_row += 1
        self.metrics.write(f"step {step}: non-finite loss or gradient (loss={stats['loss/total']}, grad "
                           f"norm={stats['optim/grad_norm']}); optimizer step skipped "
                           f"({self.nonfinite_in_row} in a row)")
        if self.nonfinite_in_row >= self.cfg.loop.max_nonfinite_steps:
            raise NonFiniteError(
                f"{self.nonfinite_in_row} consecutive optimizer steps had a non-finite loss or gradient "
                f"(limit loop.max_nonfinite_steps={self.cfg.loop.max_nonfinite_steps}); stopping at RL step "
                f"{step}. Checkpoints already written in {ckpt.checkpoint_dir(self.run_dir)} are intact. "
                "Lower optim.lr, check the reward scale, or use a float32 model.")

    def _logprobs(self, model, batch: dict[str, torch.Tensor], rows: torch.Tensor | None = None, *, with_grad: bool,
                  with_entropy: bool = False, grad_norm_mode: str | None = None) -> PolicyLogprobs:
        """``lmpo.generation.policy_logprobs`` of ``batch`` (its ``rows``, or all of it), under this run's
        temperature, prompt sharing, microbatch size and autocast; without gradient in microbatches."""
        cfg = self.cfg
        share = cfg.loop.share_prompt_prefix and not cfg.rlvcr.enabled  # RLVCR rows are not whole groups
        ids, attn, tokens = batch["input_ids"], batch["attention_mask"], batch["completion_ids"]
        if rows is not None:
            ids, attn, tokens = ids[rows], attn[rows], tokens[rows]
        model = self._policy_for_logprobs(model)
        if cfg.loop.pack_sequences and grad_norm_mode is None:  # padding-free (lmpo.generation.packing)
            from lmpo.generation.packing import packed_policy_logprobs

            with self._autocast():
                return packed_policy_logprobs(model, ids, attn, tokens, temperature=cfg.rollout.temperature,
                                              with_entropy=with_entropy, with_grad=with_grad,
                                              seqs_per_microbatch=cfg.loop.seqs_per_microbatch)
        with self._autocast():
            return policy_logprobs(model, ids, attn, tokens, temperature=cfg.rollout.temperature,
                                   with_entropy=with_entropy, grad_norm_mode=grad_norm_mode,
                                   group_size=cfg.rollout.completions_per_prompt if share else None,
                                   with_grad=with_grad, seqs_per_microbatch=cfg.loop.seqs_per_microbatch)

    # ---------------------------------------------------------------- data, reference, evaluation
    def _permutation(self, data_epoch: int) -> list[int]:
        gen = torch.Generator().manual_seed(_seed_for(self.cfg.loop.seed, data_epoch, 4))
        return torch.randperm(len(self.train_examples), generator=gen).tolist()

    def _next_examples(self, n: int) -> list:
        out = []
        while len(out) < n:
            if self.data_pos >= len(self._perm):
                self.data_epoch += 1
                self.data_pos = 0
                self._perm = self._permutation(self.data_epoch)
            out.append(self.train_examples[self._perm[self.data_pos]])
            self.data_pos += 1
        return out

    def _build_ref_model(self):
        if self.cfg.model.ref_path:
            from lmpo.models import load_model_and_tokenizer

            ref, _ = load_model_and_tokenizer(self.cfg.model.ref_path, dtype=self.cfg.model.dtype, device=self.device)
        else:
            ref = copy.deepcopy(self.model)
            if self.cfg.model.lora.enabled and hasattr(ref, "merge_and_unload"):
                ref = ref.merge_and_unload()
        ref.eval()
        for p in ref.parameters():
            p.requires_grad_(False)
        return ref

    @property
    def needs_ref_model(self) -> bool:
        """Whether the run has a reference model: the objective's KL term needs its log-probs
        (``driver.needs.ref_logp``), or the KL in the reward does (``objective.kl_in_reward``)."""
        return self.driver.needs.ref_logp or self.cfg.objective.kl_in_reward

    def _build_kl_controller(self):
        """The β controller of the KL in the reward (``objective.kl_ctrl_*``), or None when it is off."""
        ob = self.cfg.objective
        if not ob.kl_in_reward:
            return None
        from lmpo.objectives.kl_reward import make_kl_controller

        return make_kl_controller(ob.kl_ctrl_type, ob.kl_reward_coef, ob.kl_ctrl_target, ob.kl_ctrl_horizon)

    def _kl_in_reward(self, ro, rewards: torch.Tensor):
        """``r − β·Σ_t KL_t`` for every sequence of the rollout (verl ``apply_kl_penalty``), then the controller
        update with the step's KL over its B sequences. Returns (rewards', stats, reference log-probs (B, T))."""
        from lmpo.objectives.kl_reward import kl_penalised_rewards

        ob = self.cfg.objective
        full = {"input_ids": ro.input_ids.to(self.device), "attention_mask": ro.attention_mask.to(self.device),
                "completion_ids": ro.completion_ids.to(self.device)}
        self.model.train()  # the mode the update's behaviour log-probs are taken in
        logp = self._logprobs(self.model, full, with_grad=False).logp
        ref_logp = self._logprobs(self.ref_model, full, with_grad=False).logp
        beta = float(self.kl_ctrl.value)
        shaped, stats = kl_penalised_rewards(rewards, logp, ref_logp, ro.completion_mask.to(self.device),
                                             beta, ob.kl_reward_estimator, self.objective.log_ratio_clamp)
        stats["kl/coef"] = beta  # a float: logged exactly, no float32 round trip
        # one host sync for the controller's input, as verl's .item()
        self.kl_ctrl.update(float(stats["kl/reward_kl"]), int(rewards.numel()))
        return shaped, stats, ref_logp

    def _sync_ref_if_due(self) -> None:
        """TR-DPO reference sync after every ``objective.ref_sync_steps``-th optimizer step (``lmpo.trainer.ref_sync``)."""
        ob = self.cfg.objective
        if ob.ref_sync_steps > 0 and self.schedule.step_index % ob.ref_sync_steps == 0:
            from lmpo.trainer.ref_sync import sync_reference

            sync_reference(self.ref_model, self.model, ob.ref_sync_alpha)

    def _evaluate(self, examples=None) -> dict[str, float]:
        ev = self.cfg.eval
        held_out = examples is None
        examples = self.eval_examples if examples is None else examples
        out = evaluate(self.model, self.tokenizer, examples, accuracy_fn=self.accuracy_fn,
                       scorer=self.scorer, max_new_tokens=ev.max_new_tokens or self.cfg.rollout.max_new_tokens,
                       seqs_per_batch=ev.seqs_per_batch, device=self.device,
                       success_threshold=self.cfg.rewards.success_threshold)
        if held_out and ev.samples_per_prompt > 0:  # pass@k / avg@n of sampled completions (lmpo.trainer.passk)
            from lmpo.trainer.passk import sampled_metrics

            ro = self.cfg.rollout
            out.update(sampled_metrics(self.model, self.tokenizer, examples, self.accuracy_fn,
                                       samples_per_prompt=ev.samples_per_prompt,
                                       max_new_tokens=ev.max_new_tokens or ro.max_new_tokens,
                                       temperature=ro.temperature, top_p=ro.top_p, seed=self.cfg.loop.seed,
                                       prompts_per_batch=max(1, ev.seqs_per_batch // ev.samples_per_prompt),
                                       success_threshold=self.cfg.rewards.success_threshold))
        return out

    # ---------------------------------------------------------------- checkpoints
    def state_dict(self, step: int) -> dict:
        return {
            "step": step,
            "optimizer": self.optimizer.state_dict(),
            "schedule": self.schedule.state_dict(),
            "controller": self.driver.state_dict()["controller"],
            # β of the KL in the reward; absent otherwise, so default checkpoints hold what they always did
            **({"kl_controller": self.kl_ctrl.state_dict()} if self.kl_ctrl is not None else {}),
            "data": {"epoch": self.data_epoch, "pos": self.data_pos},
            "nonfinite": {"total": self.nonfinite_total, "in_row": self.nonfinite_in_row},
            "rng": {"torch": torch.get_rng_state(), "python": list(random.getstate()[1]),
                    "python_version": random.getstate()[0], "python_gauss": random.getstate()[2],
                    "cuda": torch.cuda.get_rng_state_all() if torch.cuda.is_available() else []},
            # the metrics rows written up to this checkpoint: a resumed run cuts metrics.jsonl back to them
            "metrics_rows": self.metrics.rows if getattr(self, "metrics", None) is not None else 0,
            "final_eval_done": self.final_eval_done,
        }

    def save(self, step: int) -> Path:
        if getattr(self, "metrics", None) is not None:
            self.metrics.sync()  # the rows this checkpoint counts are on disk before it is
        return ckpt.save_checkpoint(self.run_dir, step, self.model, self.state_dict(step), ref_model=self.ref_model,
                                    keep_last=self.cfg.checkpoint.keep_last, tokenizer=self.tokenizer,
                                    base_model_name=self.cfg.model.name)

    def save_final_model(self, step: int) -> Path:
        """RUN_DIR/model/: the policy as ``save_pretrained`` writes it (a LoRA run: its adapter), with the
        tokenizer; published atomically with a manifest like a checkpoint (:mod:`lmpo.checkpoints`)."""
        from lmpo.checkpoints import publish_directory
        from lmpo.models.saving import write_hf_files

        return publish_directory(self.run_dir / FINAL_MODEL_DIR, step, lambda tmp: write_hf_files(
            tmp, self.model, self.tokenizer, base_model_name=self.cfg.model.name))

    def _load(self, path: Path) -> tuple[int, int]:
        """Restore the run from checkpoint ``path``; returns (RL step, metrics rows to keep)."""
        state = ckpt.load_checkpoint(path, self.model, ref_model=self.ref_model)
        try:
            self.optimizer.load_state_dict(state["optimizer"])
            self.schedule.load_state_dict(state["schedule"])
            self.schedule.total_steps = self.cfg.total_optimizer_steps  # a run may be extended (more loop.steps)
            self.driver.load_state_dict({"controller": state.get("controller")})
            if self.kl_ctrl is not None and state.get("kl_controller") is not None:
                self.kl_ctrl.load_state_dict(state["kl_controller"])
            self.data_epoch, self.data_pos = int(state["data"]["epoch"]), int(state["data"]["pos"])
            self._perm = self._permutation(self.data_epoch)
            self.nonfinite_total = int(state["nonfinite"]["total"])
            self.nonfinite_in_row = int(state["nonfinite"]["in_row"])
            rng = state["rng"]
            torch.set_rng_state(rng["torch"])
            random.setstate((rng["python_version"], tuple(rng["python"]), rng["python_gauss"]))
            if rng["cuda"] and torch.cuda.is_available():
                torch.cuda.set_rng_state_all(rng["cuda"])
            self.final_eval_done = bool(state.get("final_eval_done", False))
            return int(state["step"]), int(state.get("metrics_rows", 0))
        except (KeyError, TypeError, ValueError, RuntimeError) as e:
            raise ckpt.CheckpointError(f"checkpoint {path}: its state does not fit this run ({type(e).__name__}: "
                                       f"{' '.join(str(e).split())[:200]}); it was written by another kind of run "
                                       "(objective, optimizer, model). Resume with the run's own config.") from None
