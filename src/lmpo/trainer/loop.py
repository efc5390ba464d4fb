"""The training loop. Read ``Trainer.train`` top to bottom; ``rl_step`` is one RL step::

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

import math
import os
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import torch

from lmpo.checkpoints import publish_directory
from lmpo.errors import InputError, Interrupted, RunError
from lmpo.generation import RolloutBatch, avoid_cudnn_attention
from lmpo.models.saving import write_hf_files
from lmpo.objectives.driver import merge_stats
from lmpo.plots import plot_runs
from lmpo.rlvcr.expansion import rlvcr_stage
from lmpo.runs import RunLock, stop_on_sigint
from lmpo.tasks import render_prompts
from lmpo.trainer import build, episodes, stages
from lmpo.trainer import checkpoint as ckpt
from lmpo.trainer.completions import CompletionLog, completion_records
from lmpo.trainer.config import TrainConfig, config_to_dict, validate_config
from lmpo.trainer.evaluate import evaluate
from lmpo.trainer.export import FINAL_MODEL_DIR
from lmpo.trainer.metrics import MetricsLogger, to_host
from lmpo.trainer.mismatch import mismatch_metrics
from lmpo.trainer.optim import Schedule, build_optimizer
from lmpo.trainer.passk import sampled_metrics
from lmpo.trainer.pipeline import AsyncPipeline
from lmpo.trainer.ref_sync import sync_reference
from lmpo.trainer.rundir import prepare_train_dir
from lmpo.trainer.sampling import PromptOrder, ScoredRollout, dynamic_sample, mask_truncated, seed_for
from lmpo.trainer.sft import supervised_warmup
from lmpo.trainer.teacher import Teacher


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


class Trainer:
    """Single-machine GRPO-family trainer.

    >>> result = Trainer(load_config("configs/addition_grpo.yaml")).train()

    Args:
        config: the run (validated here, before any model is built).
        model, tokenizer: use these instead of building ``config.model.name``.
        task: use this task instead of building ``config.task``.
        rollout_engine: a ``lmpo.generation.RolloutEngine`` (default: ``build.build_rollout_engine``).
        model_factory: with ``rollout.async_staleness`` >= 1 and ``model=``, a picklable ``() -> (model,
            tokenizer)`` that builds the same architecture and dtype, run in the rollout worker (default with
            ``model.name``: ``build.policy_factory``).
        log: callable for one-line console messages (default ``print``).
    """

    def __init__(self, config: TrainConfig, *, model=None, tokenizer=None, task=None, rollout_engine=None,
                 model_factory=None, log: Callable[[str], None] | None = None):
        validate_config(config)
        k = config.rollout.async_staleness
        if k and rollout_engine is not None:
            raise InputError(f"`rollout.async_staleness` = {k} builds its own rollout worker, but Trainer(rollout_"
                             "engine=...) was given one. Pass no rollout_engine, or use rollout.async_staleness: 0.")
        if k and model is not None and model_factory is None:
            raise InputError(f"`rollout.async_staleness` = {k} with Trainer(model=...): the rollout worker must "
                             "build its own copy of the model, and a model object cannot be sent to it. Pass "
                             "model_factory= (a picklable callable returning (model, tokenizer) of the same "
                             "architecture and dtype), or use rollout.async_staleness: 0.")
        self.model_factory = model_factory or (build.policy_factory(config.model) if k else None)
        self._pipeline: AsyncPipeline | None = None  # rollout.async_staleness >= 1, during train()
        self._async_held: list | None = None  # a checkpoint's weight versions for the pipeline (checkpoint.py)
        self.cfg = config
        self.log = log or (lambda msg: print(msg, flush=True))
        if config.loop.num_threads > 0:
            torch.set_num_threads(config.loop.num_threads)
        self.device = build.resolve_device(config.loop.device)
        if self.device.type == "cuda":
            avoid_cudnn_attention()  # its backward gives NaN on left-padded rows under bf16 (see its docstring)
        self.run_dir = Path(config.logging.run_dir)
        #: test hook: ``loss_hook(rl_step, loss) -> loss`` applied to every microbatch loss (NaN injection)
        self.loss_hook: Callable[[int, torch.Tensor], torch.Tensor] | None = None
        #: the estimator's extra inputs come from ``stages.advantage_inputs``
        self.objective, self.driver, self.estimator = build.build_objective(config.objective)
        self.episode_runner = None  # env.id: multi-turn episodes (lmpo.trainer.episodes), built at the first step
        if config.env.id is not None:
            episodes.check_estimator(self.estimator, config.env.id, config.objective.advantage_estimator,
                                     config.env.turn_discount)
        try:
            self.task = task if task is not None else build.build_task(config.task, config.env)
        except build.TASK_ERRORS as e:
            raise build.task_error(config.task, e, config.env) from None
        train_examples = self.task.train_examples(seed=config.loop.seed)
        eval_examples = self.task.eval_examples()[: config.task.eval_examples]
        if model is None:
            model, tok = build.load_policy(config.model, self.device)
            tokenizer = tokenizer or tok
        elif tokenizer is None:
            raise ValueError("Trainer(model=...) needs tokenizer=... as well")
        self.model = model.to(self.device)
        self.tokenizer = tokenizer
        # conversational prompts become text through the policy's chat template (lmpo.tasks.chat)
        tk, names = config.task, {"model_name": f"model {config.model.name!r}", "source": f"task {self.task.name!r}"}
        if config.env.id is None:
            self.train_examples = render_prompts(train_examples, tokenizer, tk.prompt_format, tk.chat_template, **names)
            self.eval_examples = render_prompts(eval_examples, tokenizer, tk.prompt_format, tk.chat_template, **names)
        else:  # the episode runner renders each environment's opening itself
            self.train_examples, self.eval_examples = list(train_examples), list(eval_examples)
            episodes.check_chat_template(tokenizer, config.env, config.model.name)
        self.scorer, self.accuracy_fn = build.build_rewards(config.rewards, self.task,
                                                            self.train_examples + self.eval_examples, self.device)
        if config.loop.gradient_checkpointing:
            # non-reentrant: works with inputs that do not require grad and with LoRA's frozen base weights
            self.model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
        if config.model.lora.enabled:
            self.model = build.wrap_lora(self.model, config.model.lora)
        self.rollout_engine = rollout_engine
        self.ref_model = None
        self.kl_ctrl = build.build_kl_controller(config.objective)
        self.teacher = None  # on-policy distillation (an objective `distill` part): lmpo.trainer.teacher
        if self.driver.needs.teacher:
            self.teacher = Teacher.load(config.teacher, self.model, self.tokenizer, policy_name=config.model.name,
                                        device=self.device, top_k=self.driver.needs.teacher_top_k)
        self.completion_log: CompletionLog | None = None  # logging.completions_every_steps (`lmpo show`)
        self.logprob_settings = build.logprob_settings(config)
        self._compiled_policy: stages.CompiledCalls | None = None  # loop.compile: the policy's log-prob forwards

    @property
    def controller(self):
        """The adaptive entropy controller (held by the objective driver), or None."""
        return self.driver.controller

    @property
    def needs_ref_model(self) -> bool:
        """Whether the run has a reference model: the objective's KL term needs its log-probs
        (``driver.needs.ref_logp``), or the KL in the reward does (``objective.kl_in_reward``)."""
        return self.driver.needs.ref_logp or self.cfg.objective.kl_in_reward

    def policy(self):
        """The policy for log-prob forwards: under ``loop.compile`` a view of it whose calls run compiled."""
        if not self.cfg.loop.compile:
            return self.model
        if self._compiled_policy is None or self._compiled_policy.module is not self.model:
            self._compiled_policy = stages.CompiledCalls(self.model)
        return self._compiled_policy

    # ---------------------------------------------------------------- the run
    def train(self, resume: str | os.PathLike | bool | None = None, *, overwrite: bool = False,
              allow_config_change: bool = False) -> TrainResult:
        """Run (or resume) the whole schedule: warm-up, RL steps, evaluations, checkpoints.

        Args:
            resume: None (a new run), ``"auto"`` (the newest complete checkpoint of ``logging.run_dir``) or a
                checkpoint / run directory. A run directory that already holds a run is refused without it.
            overwrite: delete the run already in ``logging.run_dir`` and start again.
            allow_config_change: resume although the config differs from the stored one in keys other than
                ``lmpo.trainer.rundir.RESUMABLE_KEYS`` (steps, logging, evaluation, checkpoints).

        The run directory is locked for the whole call (``lmpo.runs.RunLock``: a second writer is refused). A
        Ctrl-C (SIGINT) finishes the current RL step, writes a checkpoint and raises
        :class:`lmpo.errors.Interrupted`; a second Ctrl-C stops at once.
        """
        with RunLock(self.run_dir, dir_option="logging.run_dir", log=self.log):
            return self._train(resume, overwrite, allow_config_change)

    def _train(self, resume, overwrite: bool, allow_config_change: bool) -> TrainResult:
        cfg = self.cfg
        t_start = time.perf_counter()
        resume_path = prepare_train_dir(cfg, resume, overwrite, allow_config_change, self.log)
        result = TrainResult(run_dir=self.run_dir, steps_done=0)
        totals = cfg.derived_totals()
        self.log("lmpo train: " + ", ".join(f"{k}={v}" for k, v in totals.items()) + f", device={self.device}")

        # 1. supervised warm-up (skipped on resume: the checkpoint already holds the warmed-up weights)
        if resume_path is None and cfg.sft.steps > 0:
            check_set = self.train_examples[: cfg.sft.check_examples]
            result.sft_losses = supervised_warmup(
                self.model, self.tokenizer, self.task, self.train_examples, cfg.sft, seed=cfg.loop.seed,
                device=self.device, log=self.log, accuracy_check=lambda: self.evaluate(check_set)["eval/accuracy"])
        # 2. reference model: a frozen copy of the initial policy (or a given path), only when needed
        if self.needs_ref_model:
            self.ref_model = build.build_reference(cfg, self.model, self.device)
        # 3. optimizer, schedule, prompt order, counters; a checkpoint's state over them on resume
        self.optimizer = build_optimizer(self.model.parameters(), cfg.optim)
        self.schedule = Schedule(self.optimizer, cfg.optim, cfg.total_optimizer_steps)
        self.prompts = PromptOrder(self.train_examples, cfg.loop.seed)
        self.nonfinite_total, self.nonfinite_in_row = 0, 0
        self.final_eval_done = False
        start_step, metrics_rows = 0, None
        if resume_path is not None:
            start_step, metrics_rows = ckpt.restore_trainer_state(self, resume_path)
            self.log(f"resumed from {resume_path} at step {start_step}")
        if self.rollout_engine is None and not cfg.rollout.async_staleness:
            self.rollout_engine = build.build_rollout_engine(cfg, self.model, self.tokenizer, device=self.device,
                                                             record_logprobs=self.driver.needs.rollout_logp)
        lg = cfg.logging
        self.metrics = MetricsLogger(self.run_dir, cfg.loop.steps, start_step=start_step, keep_rows=metrics_rows,
                                     progress_bar=lg.progress_bar, tensorboard=lg.tensorboard, wandb=lg.wandb,
                                     wandb_project=lg.wandb_project, config=config_to_dict(cfg),
                                     print_every_steps=lg.print_every_steps)
        if lg.completions_every_steps > 0:
            self.completion_log = CompletionLog(self.run_dir, lg.completions_every_steps, lg.completions_per_step,
                                                start_step=start_step, metrics=self.metrics)
        # 4. the RL steps, with evaluations and checkpoints when due
        try:
            if cfg.rollout.async_staleness:  # the rollout worker; closed below whatever happens (no orphan)
                self._start_pipeline(start_step)
            with stop_on_sigint(self.log) as self._stop:
                if resume_path is None and cfg.eval.at_start:
                    result.eval_before = self.evaluate()
                    self.metrics.log(0, result.eval_before, kind="eval")
                self._stop_if_asked(start_step)
                step = start_step
                for step in range(start_step + 1, cfg.loop.steps + 1):
                    stats = self.rl_step(step)
                    self.metrics.log(step, stats)
                    result.history.append(stats)
                    if cfg.eval.every_steps and step % cfg.eval.every_steps == 0 and step != cfg.loop.steps:
                        self.metrics.log(step, self.evaluate(), kind="eval")
                    if cfg.checkpoint.every_steps and step % cfg.checkpoint.every_steps == 0:
                        self.save(step)
                    self._stop_if_asked(step)
                result.steps_done = step
                if not self.final_eval_done:
                    result.eval_after = self.evaluate()
                    self.metrics.log(cfg.loop.steps, result.eval_after, kind="eval")
                    self.final_eval_done = True
                    if cfg.checkpoint.at_end:
                        self.save(cfg.loop.steps)
                if cfg.checkpoint.final_model:
                    self.save_final_model(step)
        finally:
            if self._pipeline is not None:
                self._pipeline.engine.close()
                self._pipeline, self.rollout_engine = None, None
            self.metrics.close()
            if self.completion_log is not None:
                self.completion_log.close()
        if cfg.logging.plots:
            result.plots = plot_runs([self.run_dir])
        result.nonfinite_skipped = self.nonfinite_total
        result.seconds = time.perf_counter() - t_start
        return result

    def _start_pipeline(self, start_step: int) -> None:
        """The rollout worker of ``rollout.async_staleness`` (``lmpo.trainer.pipeline``), going on from a
        checkpoint's weight versions when this run resumed from one that has them."""
        cfg, held = self.cfg, self._async_held
        if held is not None and len(held) != cfg.rollout.async_staleness:
            self.log(f"the checkpoint holds {len(held)} earlier weight versions, rollout.async_staleness is "
                     f"{cfg.rollout.async_staleness}: the schedule starts again from the checkpoint's weights")
            held = None
        self.rollout_engine = build.build_async_rollout(cfg, self.model, self.model_factory, device=self.device,
                                                        held=held, log=self.log)
        self._pipeline = AsyncPipeline(self.rollout_engine, self.prompts, start=start_step,
                                       last_step=cfg.loop.steps, prompts_per_step=cfg.loop.prompts_per_step,
                                       completions_per_prompt=cfg.rollout.completions_per_prompt, seed=cfg.loop.seed)
        self._async_held = None

    def _stop_if_asked(self, step: int) -> None:
        if self._stop.requested:
            path = self.save(step)
            raise Interrupted(f"stopped by Ctrl-C after RL step {step} of {self.cfg.loop.steps}; checkpoint "
                              f"written to {path}.", checkpoint=path)

    # ---------------------------------------------------------------- one RL step
    def rl_step(self, step: int) -> dict[str, float]:
        """One RL step: generate → score → [KL in the reward] → advantages → [RLVCR] → update; its metrics."""
        cfg, obj, dev = self.cfg, self.objective, self.device
        t0 = time.perf_counter()
        # sample prompts, generate G completions each, score rewards (prompt-major: sequence b belongs to prompt
        # b // G); with dynamic sampling, as many draws as it takes to fill the batch with informative groups
        self._generate_s = 0.0
        scored, sampling_stats = self._sample_and_score(step)
        ro, rewards = scored.rollout, scored.rewards
        group = ro.group_ids.to(dev)
        t_gen = t0 + self._generate_s
        # multi-turn episodes come with their own batch: attention on every token, loss on the policy's only
        full = self._episode_batch if self.cfg.env.id is not None else RolloutBatch.from_rollout(ro, dev)
        # KL in the reward (objective.kl_in_reward): the advantages see r − β·Σ KL, the reward metrics r
        adv_rewards, kl_stats, kl_ref_logp = stages.kl_in_reward(
            self.policy(), self.ref_model, full, rewards, self.kl_ctrl, settings=self.logprob_settings,
            estimator=cfg.objective.kl_reward_estimator, log_ratio_clamp=obj.log_ratio_clamp,
        ) if self.kl_ctrl is not None else (rewards, {}, None)
        inputs = stages.advantage_inputs(self.estimator, self.scorer, scored.examples, ro, scored.per_fn,
                                         engine=self.rollout_engine, device=dev, autocast_enabled=cfg.loop.autocast)
        adv, adv_stats, zero_var, keep = stages.advantages(self.estimator, adv_rewards, group, inputs,
                                                           filter_zero_variance=cfg.objective.filter_zero_variance)
        if self.completion_log is not None and self.completion_log.due(step):
            self.completion_log.log(step, completion_records(step, scored.examples, ro, rewards, scored.per_fn,
                                                             scored.correct, adv, cfg.logging.completions_per_step))
        t_score = time.perf_counter()
        stats = stages.rollout_stats(scored, adv, adv_stats, zero_var, keep, full.loss_mask,
                                     self.tokenizer.eos_token_id)
        stats.update(sampling_stats)
        stats.update(kl_stats)
        if cfg.env.id is not None:  # a truncated episode is one cut by a budget, whether or not it sampled a stop
            stats["completion/truncated_frac"] = ro.truncated.float().mean()
        if cfg.rlvcr.enabled:  # RLVCR (docs/rlvcr.md, lmpo.rlvcr): expand successes per thinking level, mix advantages
            rl = rlvcr_stage(self.model, self.tokenizer, ro, rewards, cfg.rlvcr, keep=keep, scale=obj.advantage_scale,
                             temperature=cfg.rollout.temperature, top_p=cfg.rollout.top_p, top_k=cfg.rollout.top_k,
                             generator=torch.Generator(dev).manual_seed(seed_for(cfg.loop.seed, step, 5)))
            ro, adv, keep, full = rl.rollout, rl.advantages, rl.keep, RolloutBatch.from_rollout(rl.rollout, dev)
            stats.update(rl.metrics)

        if cfg.env.id is not None and cfg.env.turn_discount is not None:  # per-turn credit: (B, T) advantages
            eb = self._episode_turns
            adv = episodes.turn_advantages(self.estimator, eb.turn_rewards.to(dev), eb.turn_mask.to(dev),
                                           eb.turn_ids.to(dev), group, cfg.env.turn_discount)
        # the sequences trained on; the reference log-probs of the KL in the reward are reused when needed
        idx = torch.nonzero(keep).squeeze(-1)
        batch = full.with_(advantages=adv, ref_logp=kl_ref_logp if self.driver.needs.ref_logp else None).select(idx)
        trainable = idx.numel() > 0
        if cfg.objective.mask_truncated_completions:
            loss_mask, stats["completion/truncated_masked_frac"] = mask_truncated(batch.loss_mask,
                                                                                ro.truncated.to(dev)[idx])
            batch = batch.with_(loss_mask=loss_mask)
            trainable = trainable and bool(loss_mask.any())
        if batch.rollout_logp is None and self.driver.needs.rollout_logp:
            raise stages.missing_rollout_logprobs(obj, self.rollout_engine)
        stats.update(self._update(step, batch) if trainable else {})
        self.rollout_engine.sync_weights(self.model)  # after this step's optimizer steps, before the next rollout
        t_end = time.perf_counter()

        tokens = float(scored.rollout.completion_mask.sum()) + float(batch.loss_mask.sum())
        stats.update({"time/generate_s": t_gen - t0, "time/score_s": t_score - t_gen, "time/train_s": t_end - t_score,
                      "perf/step_s": t_end - t0, "perf/tokens_per_s": tokens / max(t_end - t0, 1e-9),
                      "optim/nonfinite_skipped": float(self.nonfinite_total)})
        return to_host(stats)

    def _sample_and_score(self, step: int) -> tuple[ScoredRollout, dict[str, float]]:
        """This step's scored rollout: one draw, or DAPO dynamic sampling's draws (``rollout.dynamic_sampling``)."""
        ro = self.cfg.rollout
        if self.cfg.env.id is not None:
            return self._play_episodes(step)
        if not ro.dynamic_sampling:
            return self._draw(step, 0), {}
        return dynamic_sample(lambda k: self._draw(step, k), self.cfg.loop.prompts_per_step,
                              ro.completions_per_prompt, metric=ro.dynamic_sampling_metric,
                              max_draws=ro.dynamic_sampling_max_draws, pad_token_id=self.tokenizer.pad_token_id)

    def _draw(self, step: int, k: int) -> ScoredRollout:
        """Draw ``k`` of RL step ``step``: the next ``prompts_per_step`` prompts, G completions each, scored."""
        cfg = self.cfg
        t = time.perf_counter()
        if self._pipeline is not None:  # sampled by the worker with the weights of step − 1 − k (same seed)
            examples, ro = self._pipeline.rollout(step)  # (CPU tensors: the stages move what they use)
        else:
            examples = self.prompts.take(cfg.loop.prompts_per_step)
            seed = seed_for(cfg.loop.seed, step, 1) if k == 0 else seed_for(cfg.loop.seed, step, 1, k)
            # (no inference_mode: the sampled ids become inputs of the training graph)
            with stages.autocast(cfg.loop.autocast, self.device):
                ro = self.rollout_engine.generate([e.prompt for e in examples], cfg.rollout.completions_per_prompt,
                                                  seed=seed)
        self._generate_s += time.perf_counter() - t
        rw = cfg.rewards
        return stages.score(self.scorer, self.accuracy_fn, examples, ro, success_threshold=rw.success_threshold,
                            device=self.device, max_new_tokens=cfg.rollout.max_new_tokens,
                            overlong_buffer_len=rw.overlong_buffer_len, overlong_penalty_factor=rw.overlong_penalty_factor)

    def _play_episodes(self, step: int) -> tuple[ScoredRollout, dict[str, float]]:
        """Multi-turn (``env.id``): G episodes of each of the next ``prompts_per_step`` examples, scored by their
        returns; the batch to train on is kept in ``self._episode_batch`` (``lmpo.trainer.episodes``)."""
        cfg = self.cfg
        examples = self.prompts.take(cfg.loop.prompts_per_step)
        seed = seed_for(cfg.loop.seed, step, 1)
        if self.episode_runner is None:  # here, not in __init__: it samples from the (possibly LoRA-wrapped) policy
            ro = cfg.rollout
            self.episode_runner = episodes.make_runner(self.model, self.tokenizer, cfg.env, temperature=ro.temperature,
                                                       top_p=ro.top_p, top_k=ro.top_k)
        t = time.perf_counter()
        with stages.autocast(cfg.loop.autocast, self.device):
            played = episodes.play_step(self.episode_runner, cfg.env, examples, cfg.rollout.completions_per_prompt,
                                        seed=seed % 2**31, generator=torch.Generator(self.device).manual_seed(seed),
                                        tokenizer=self.tokenizer, device=self.device)
        self._generate_s += time.perf_counter() - t
        self._episode_batch, self._episode_turns = played.batch, played.episode_batch
        return played.scored, played.metrics

    # ---------------------------------------------------------------- the update
    def _update(self, step: int, batch: RolloutBatch) -> dict[str, float]:
        """``epochs_per_step × minibatches_per_step`` optimizer steps on one rollout batch; merged statistics."""
        cfg, settings = self.cfg, self.logprob_settings
        self.model.train()
        # behaviour log-probs: only when the same rollout is used for more than one optimizer step
        old = stages.logprobs(self.policy(), batch, settings=settings, with_grad=False).logp if cfg.off_policy else None
        ref = batch.ref_logp
        if ref is None and self.driver.needs.ref_logp:
            ref = stages.logprobs(self.ref_model, batch, settings=settings, with_grad=False).logp
        batch = batch.with_(old_logp=old, ref_logp=ref)
        # on-policy, the single optimizer step's forwards are the training log-probs before the update
        keep_logp = batch.rollout_logp is not None and old is None
        per_step: list[dict[str, float]] = []
        lr = self.schedule.current_lr()
        train_logp = None
        for epoch, m, rows in self._minibatches(step, len(batch)):
            cov_gen = torch.Generator(device=self.device).manual_seed(seed_for(cfg.loop.seed, step, 3, epoch, m))
            stats, train_logp = self._optimizer_step(step, batch, rows, cov_gen, keep_logp=keep_logp)
            if stats is not None:
                lr = stats.pop("optim/lr")
                per_step.append(stats)
        out = merge_stats(per_step) if per_step else {"loss/total": float("nan"), "optim/grad_norm": float("nan")}
        out["optim/lr"] = float(lr)  # of the last optimizer step
        if batch.rollout_logp is not None:
            out.update(mismatch_metrics(old if old is not None else train_logp, batch.rollout_logp, batch.loss_mask))
        return out

    def _minibatches(self, step: int, B: int):
        """``(epoch, index, rows)`` of every optimizer step of an RL step: each epoch a seeded shuffle of the B
        sequences (in order when there is one minibatch), cut into ``minibatches_per_step`` equal parts."""
        M = self.cfg.loop.minibatches_per_step
        size = -(-B // M)
        shuffle_gen = torch.Generator().manual_seed(seed_for(self.cfg.loop.seed, step, 2))
        for epoch in range(self.cfg.loop.epochs_per_step):
            order = torch.randperm(B, generator=shuffle_gen) if M > 1 else torch.arange(B)
            order = order.to(self.device)
            for m in range(M):
                if order[m * size:(m + 1) * size].numel():
                    yield epoch, m, order[m * size:(m + 1) * size]

    def _optimizer_step(self, step: int, batch: RolloutBatch, rows: torch.Tensor, cov_gen: torch.Generator, *,
                        keep_logp: bool = False) -> tuple[dict[str, float] | None, torch.Tensor | None]:
        """One optimizer step over the minibatch ``rows`` (microbatches accumulate with exact global
        normalisers). Returns its statistics (None when the loss or gradient was non-finite and the step was
        skipped) and, with ``keep_logp``, the detached (len(rows), T) log-probs its forwards took."""
        cfg, needs = self.cfg, self.driver.needs
        num_tokens = batch.loss_mask[rows].sum()
        num_seqs = int(rows.numel())
        self.optimizer.zero_grad(set_to_none=True)
        loss_sum = torch.zeros((), device=self.device)
        taken: list[torch.Tensor] = []
        for start in range(0, num_seqs, cfg.loop.seqs_per_microbatch):
            mu = rows[start:start + cfg.loop.seqs_per_microbatch]
            distill = {}  # the policy's full logits and the teacher's, for a distillation part
            if self.teacher is not None:
                with stages.autocast(cfg.loop.autocast, self.device):
                    fwd, distill = self.teacher.forward(self.model, batch.input_ids[mu], batch.attention_mask[mu],
                                                        batch.completion_ids[mu], with_entropy=needs.entropy,
                                                        temperature=cfg.rollout.temperature)
            else:
                fwd = stages.logprobs(self.policy(), batch, mu, settings=self.logprob_settings, with_grad=True,
                                      with_entropy=needs.entropy, grad_norm_mode=needs.token_grad_norm)
            if keep_logp:
                taken.append(fwd.logp.detach())
            loss = self.driver.loss(
                fwd.logp, batch.old_logp[mu] if batch.old_logp is not None else fwd.logp.detach(),
                batch.advantages[mu], batch.loss_mask[mu], weight=mu.numel() / num_seqs,
                ref_logp=batch.ref_logp[mu] if batch.ref_logp is not None else None, entropy=fwd.entropy,
                token_grad_norm=fwd.token_grad_norm, rollout_logp=batch.rollout_logp[mu] if needs.rollout_logp else None,
                num_tokens=num_tokens, num_seqs=num_seqs, generator=cov_gen, **distill)
            if self.loss_hook is not None:
                loss = self.loss_hook(step, loss)
            loss.backward()
            loss_sum = loss_sum + loss.detach()
        params = [p for p in self.model.parameters() if p.requires_grad]
        max_norm = cfg.optim.max_grad_norm if cfg.optim.max_grad_norm > 0 else math.inf
        grad_norm = torch.nn.utils.clip_grad_norm_(params, max_norm)
        logp = torch.cat(taken) if taken else None
        # the one host sync of the step: the objective's statistics, the loss and the gradient norm
        stats = self.driver.end_step(extra={"loss/total": loss_sum, "optim/grad_norm": grad_norm},
                                     update_controller=False)
        if not (math.isfinite(stats["loss/total"]) and math.isfinite(stats["optim/grad_norm"])):
            self._skip_nonfinite(step, stats)
            return None, logp
        self.nonfinite_in_row = 0
        stats["optim/lr"] = self.schedule.apply()
        self.optimizer.step()
        self.schedule.advance()
        self._sync_ref_if_due()
        self.driver.commit_step(stats)
        return stats, logp

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

    def _sync_ref_if_due(self) -> None:
        """TR-DPO reference sync after every ``objective.ref_sync_steps``-th optimizer step (``lmpo.trainer.ref_sync``)."""
        ob = self.cfg.objective
        if ob.ref_sync_steps > 0 and self.schedule.step_index % ob.ref_sync_steps == 0:
            sync_reference(self.ref_model, self.model, ob.ref_sync_alpha)

    # ---------------------------------------------------------------- evaluation, checkpoints (lmpo.trainer.checkpoint)
    def evaluate(self, examples=None) -> dict[str, float]:
        """Greedy ``eval/...`` metrics of the policy on ``examples`` (default: the held-out examples)."""
        ev, ro = self.cfg.eval, self.cfg.rollout
        held_out = examples is None
        examples = self.eval_examples if examples is None else examples
        if self.cfg.env.id is not None:  # greedy episodes: eval/accuracy is the success rate
            return episodes.evaluate_episodes(self.model, self.tokenizer, self.cfg.env, examples, seed=self.cfg.loop.seed)
        out = evaluate(self.model, self.tokenizer, examples, accuracy_fn=self.accuracy_fn,
                       scorer=self.scorer, max_new_tokens=ev.max_new_tokens or ro.max_new_tokens,
                       seqs_per_batch=ev.seqs_per_batch, device=self.device,
                       success_threshold=self.cfg.rewards.success_threshold)
        if held_out and ev.samples_per_prompt > 0:  # pass@k / avg@n of sampled completions (lmpo.trainer.passk)
            out.update(sampled_metrics(self.model, self.tokenizer, examples, self.accuracy_fn,
                                       samples_per_prompt=ev.samples_per_prompt,
                                       max_new_tokens=ev.max_new_tokens or ro.max_new_tokens,
                                       temperature=ro.temperature, top_p=ro.top_p, seed=self.cfg.loop.seed,
                                       prompts_per_batch=max(1, ev.seqs_per_batch // ev.samples_per_prompt),
                                       success_threshold=self.cfg.rewards.success_threshold))
        return out

    def state_dict(self, step: int) -> dict:
        """What a checkpoint after RL step ``step`` holds besides the weights (``ckpt.trainer_state``)."""
        return ckpt.trainer_state(self, step)

    def save(self, step: int) -> Path:
        if getattr(self, "metrics", None) is not None:
            self.metrics.sync()  # the rows this checkpoint counts are on disk before it is
        return ckpt.save_checkpoint(self.run_dir, step, self.model, self.state_dict(step), ref_model=self.ref_model,
                                    keep_last=self.cfg.checkpoint.keep_last, tokenizer=self.tokenizer,
                                    base_model_name=self.cfg.model.name)

    def save_final_model(self, step: int) -> Path:
        """RUN_DIR/model/: the policy as ``save_pretrained`` writes it (a LoRA run: its adapter), with the
        tokenizer; published atomically with a manifest like a checkpoint (:mod:`lmpo.checkpoints`)."""
        return publish_directory(self.run_dir / FINAL_MODEL_DIR, step, lambda tmp: write_hf_files(
            tmp, self.model, self.tokenizer, base_model_name=self.cfg.model.name))
