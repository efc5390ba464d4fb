"""The training loop. Read ``Trainer.train`` top to bottom; ``rl_step`` is one RL step::

    prompts (P = prompts_per_step)  →  rollout: G completions each (B = P·G sequences)          [collect]
    →  rewards (B,)  [ReMax: + the reward of one greedy completion per prompt]  →  advantages (B,)   [stages]
       [optional zero-variance group filter]
    →  behaviour log-probs (only when off-policy)  →  reference log-probs (only for a KL in the loss or the reward)
    →  for epoch in epochs_per_step, minibatch in minibatches_per_step: one optimizer step         [update]
           for microbatch: logp (B_μ,T) [+ entropy, token_grad_norm when needed] → objective → backward
           clip grad-norm → (skip if non-finite) → AdamW step → schedule → entropy controller
    →  rollout_engine.sync_weights (an engine with its own copy of the weights refreshes it)
    →  metrics → evaluation / checkpoint when due

Each stage is a public function of its own module, which the lab, RLVCR and the async pipeline call too:
``build`` (construction from the config), ``collect`` (prompts → scored rollout), ``stages`` (log-probs, rewards,
advantages), ``update`` (the optimizer steps, through the objective's driver), ``held_out`` (evaluation),
``checkpoint`` and ``rundir`` (saving, resuming).

Determinism: data order is a seeded permutation per data epoch (position saved in checkpoints), each step's
sampling uses a generator seeded from ``(loop.seed, step)``, minibatch shuffles and clip_cov's selection
likewise; on CPU a resumed run reproduces the uninterrupted one bit for bit.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import torch

from lmpo.errors import Interrupted
from lmpo.eval import held_out
from lmpo.generation import RolloutBatch, avoid_cudnn_attention
from lmpo.plots import plot_runs
from lmpo.runs import RunLock, stop_on_sigint
from lmpo.trainer.config import TrainConfig, validate_config
from lmpo.trainer.run import build
from lmpo.trainer.run import state as ckpt
from lmpo.trainer.run.completions import completion_records
from lmpo.trainer.run.export import publish_final_model
from lmpo.trainer.run.metrics import to_host
from lmpo.trainer.run.optim import Schedule, build_optimizer
from lmpo.trainer.run.rundir import prepare_train_dir
from lmpo.trainer.run.sft import episode_warmup, supervised_warmup
from lmpo.trainer.step import collect, stages
from lmpo.trainer.step import update as update_stage
from lmpo.trainer.step.sampling import PromptOrder
from lmpo.trainer.step.update import NonFiniteError, NonFiniteGuard

__all__ = ["NonFiniteError", "TrainResult", "Trainer"]


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

    Its attributes are the run's parts (``build.RunParts``: ``model``, ``scorer``, ``estimator`` …) and, once
    ``train`` has started, ``state`` (``lmpo.trainer.run.state.TrainState``: ``optimizer``, ``schedule``,
    ``prompts``, ``ref_model`` … also read as attributes of the trainer), ``metrics`` and ``pipeline``.
    """

    def __init__(self, config: TrainConfig, *, model=None, tokenizer=None, task=None, rollout_engine=None,
                 model_factory=None, log: Callable[[str], None] | None = None):
        objective = validate_config(config)
        self.model_factory = build.rollout_model_factory(config, model=model, model_factory=model_factory,
                                                         rollout_engine=rollout_engine)
        self.cfg = config
        self.log = log or (lambda msg: print(msg, flush=True))
        if config.loop.num_threads > 0:
            torch.set_num_threads(config.loop.num_threads)
        self.device = build.resolve_device(config.loop.device)
        if self.device.type == "cuda":
            avoid_cudnn_attention()  # its backward gives NaN on left-padded rows under bf16 (see its docstring)
        self.run_dir = Path(config.logging.run_dir)
        parts = build.build_run(config, self.device, objective, model=model, tokenizer=tokenizer, task=task)
        self.objective, self.driver, self.estimator = parts.objective, parts.driver, parts.estimator
        self.task, self.model, self.tokenizer = parts.task, parts.model, parts.tokenizer
        self.train_examples, self.eval_examples = parts.train_examples, parts.eval_examples
        self.scorer, self.accuracy_fn, self.kl_ctrl = parts.scorer, parts.accuracy_fn, parts.kl_ctrl
        self.teacher, self.episode_runner = parts.teacher, parts.episode_runner
        self.logprob_settings, self.update_settings = parts.logprob_settings, parts.update_settings
        self.train_input = parts.train_input  # what each step trains on (build.train_input)
        self.rollout_engine = rollout_engine
        self.state: ckpt.TrainState | None = None  # what the run changes as it trains and checkpoints: train()
        self.pipeline = None  # the AsyncPipeline of rollout.async_staleness >= 1, during train()
        self.completion_log = None  # logging.completions_every_steps (`lmpo show`), during train()
        self._compiled_policy: stages.CompiledCalls | None = None  # loop.compile: the policy's log-prob forwards

    # the run's state, read where the trainer's parts are (``self.state`` holds them from ``train`` on)
    optimizer = property(lambda self: self.state.optimizer)
    schedule = property(lambda self: self.state.schedule)
    prompts = property(lambda self: self.state.prompts)
    nonfinite = property(lambda self: self.state.nonfinite)
    ref_model = property(lambda self: self.state.ref_model if self.state is not None else None)

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
                ``lmpo.trainer.run.rundir.RESUMABLE_KEYS`` (steps, logging, evaluation, checkpoints).

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
        totals = ", ".join(f"{k}={v}" for k, v in cfg.derived_totals().items())
        self.log(f"lmpo train: {totals}, device={self.device}")
        # 1. supervised warm-up (skipped on resume: the checkpoint already holds the warmed-up weights)
        if resume_path is None and cfg.sft.steps > 0:
            check_set = self.train_examples[: cfg.sft.check_examples]
            # an environment's warm-up imitates its expert's episodes (lmpo.trainer.run.sft.episode_warmup)
            warmup, source = (episode_warmup, cfg.env) if cfg.env.id is not None else (supervised_warmup, self.task)
            result.sft_losses = warmup(
                self.model, self.tokenizer, source, self.train_examples, cfg.sft, seed=cfg.loop.seed,
                device=self.device, log=self.log, accuracy_check=lambda: self.evaluate(check_set)["eval/accuracy"])
        # 2. the run's state: a frozen reference model (a copy of the initial policy or a given path, only when
        # needed), optimizer, schedule, prompt order, controllers, counters; a checkpoint's over them on resume
        ref_model = build.build_reference(cfg, self.model, self.device) if self.needs_ref_model else None
        optimizer = build_optimizer(self.model.parameters(), cfg.optim)
        self.state = ckpt.TrainState(
            model=self.model, optimizer=optimizer, schedule=Schedule(optimizer, cfg.optim, cfg.total_optimizer_steps),
            prompts=PromptOrder(self.train_examples, cfg.loop.seed), driver=self.driver,
            nonfinite=NonFiniteGuard(cfg.loop.max_nonfinite_steps, ckpt.checkpoint_dir(self.run_dir)),
            ref_model=ref_model, kl_ctrl=self.kl_ctrl)
        # the newest checkpoint lmpo chose may fall back to an older one; a checkpoint the user named may not
        named = resume not in (None, False, True, "auto", "latest") and ckpt.step_of(Path(resume)) is not None
        start = (self.state.load(resume_path, total_optimizer_steps=cfg.total_optimizer_steps, log=self.log,
                                 fall_back=not named) if resume_path is not None else ckpt.ResumePoint())
        # an environment run samples turn by turn through its episode runner: no single-turn engine to build
        if self.rollout_engine is None and not cfg.rollout.async_staleness and cfg.env.id is None:
            self.rollout_engine = build.build_rollout_engine(cfg, self.model, self.tokenizer, device=self.device,
                                                             record_logprobs=self.driver.needs.rollout_logp)
        self.metrics, self.completion_log = build.build_logs(cfg, self.run_dir, start_step=start.step,
                                                             keep_rows=start.metrics_rows)
        # 4. the RL steps, with evaluations and checkpoints when due
        try:
            if cfg.rollout.async_staleness:  # the rollout worker; closed below whatever happens (no orphan)
                self.pipeline = build.build_async_pipeline(cfg, self.model, self.model_factory, self.prompts,
                                                           start_step=start.step, held=start.async_weights,
                                                           device=self.device, log=self.log,
                                                           tokenizer=self.tokenizer)
                self.rollout_engine = self.pipeline.engine
            with stop_on_sigint(self.log) as self._stop:
                if resume_path is None and cfg.eval.at_start:
                    result.eval_before = self.evaluate()
                    self.metrics.log(0, result.eval_before, kind="eval")
                self._stop_if_asked(start.step)
                step = start.step
                for step in range(start.step + 1, cfg.loop.steps + 1):
                    stats = self.rl_step(step)
                    self.metrics.log(step, stats)
                    result.history.append(stats)
                    if cfg.eval.every_steps and step % cfg.eval.every_steps == 0 and step != cfg.loop.steps:
                        self.metrics.log(step, self.evaluate(), kind="eval")
                    if cfg.checkpoint.every_steps and step % cfg.checkpoint.every_steps == 0:
                        self.save(step)
                    self._stop_if_asked(step)
                result.steps_done = step
                if not self.state.final_eval_done:
                    result.eval_after = self.evaluate()
                    self.metrics.log(cfg.loop.steps, result.eval_after, kind="eval")
                    self.state.final_eval_done = True
                    if cfg.checkpoint.at_end:
                        self.save(cfg.loop.steps)
                if cfg.checkpoint.final_model:
                    self.save_final_model(step)
        finally:
            if self.pipeline is not None:
                self.pipeline.engine.close()
                self.pipeline, self.rollout_engine = None, None
            self.metrics.close()
            if self.completion_log is not None:
                self.completion_log.close()
        if cfg.logging.plots:
            result.plots = plot_runs([self.run_dir])
        result.nonfinite_skipped = self.nonfinite.total
        result.seconds = time.perf_counter() - t_start
        return result

    def _stop_if_asked(self, step: int) -> None:
        if self._stop.requested:
            path = self.save(step)
            raise Interrupted(f"stopped by Ctrl-C after RL step {step} of {self.cfg.loop.steps}; checkpoint "
                              f"written to {path}.", checkpoint=path)

    # ---------------------------------------------------------------- one RL step
    def rl_step(self, step: int) -> dict[str, float]:
        """One RL step: generate → score → [KL in the reward] → advantages → what it trains on (``train_input``:
        [RLVCR expansion, per-turn credit]) → update; its metrics."""
        cfg, obj, dev = self.cfg, self.objective, self.device
        t0 = time.perf_counter()
        # sample prompts, generate G completions each, score rewards (prompt-major: sequence b belongs to prompt
        # b // G); with dynamic sampling, as many draws as it takes to fill the batch with informative groups
        got = self.sample(step)
        scored, ro, rewards = got.scored, got.scored.rollout, got.scored.rewards
        if scored.reward_nonfinite:  # rewards.on_error: skip (with raise the scorer has stopped the run)
            self.metrics.write(f"warning: step {step}: {scored.reward_nonfinite:.0f} reward values were NaN, infinite "
                               f"or beyond ±1e9 ({getattr(self.scorer, 'nonfinite_note', None) or 'see reward/*'}); "
                               "scored as undefined (0 in the total), counted in reward/nonfinite.")
        group = ro.group_ids.to(dev)
        t_gen = t0 + got.generate_s
        # multi-turn episodes come with their own batch: attention on every token, loss on the policy's only
        full = got.played.batch if got.played is not None else RolloutBatch.from_rollout(ro, dev)
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
            self.completion_log.log(step, completion_records(
                step, scored.examples, ro, rewards, scored.per_fn, scored.correct, adv, cfg.logging.completions_per_step,
                episodes=got.played.episodes if got.played is not None else None))
        t_score = time.perf_counter()
        stats = stages.rollout_stats(scored, adv, adv_stats, zero_var, keep, full.loss_mask,
                                     self.tokenizer.eos_token_id)
        stats.update(got.stats)
        stats.update(kl_stats)
        # what the step trains on, as the run chose at build (build.train_input): the sampled batch with these
        # advantages, RLVCR's expansion of it, or per-turn credit over an environment's episodes
        trained = self.train_input(step, got, adv, keep, full, group)
        stats.update(trained.metrics)
        # the sequences trained on; the reference log-probs of the KL in the reward are reused when needed
        batch, trainable, masked_stats = stages.train_batch(
            trained.batch, trained.advantages, trained.keep,
            ref_logp=kl_ref_logp if self.driver.needs.ref_logp else None, truncated=trained.rollout.truncated.to(dev),
            mask_truncated_completions=cfg.objective.mask_truncated_completions)
        stats.update(masked_stats)
        if batch.rollout_logp is None and self.driver.needs.rollout_logp:
            raise stages.missing_rollout_logprobs(obj, self.rollout_engine)
        stats.update(self.update(step, batch) if trainable else {})
        if self.rollout_engine is not None:  # None in environment runs: the episode runner samples from the model
            self.rollout_engine.sync_weights(self.model)  # after this step's optimizer steps, before the next rollout
        t_end = time.perf_counter()
        tokens = float(scored.rollout.completion_mask.sum()) + float(batch.loss_mask.sum())
        stats.update({"time/generate_s": t_gen - t0, "time/score_s": t_score - t_gen, "time/train_s": t_end - t_score,
                      "perf/step_s": t_end - t0, "perf/tokens_per_s": tokens / max(t_end - t0, 1e-9),
                      "optim/nonfinite_skipped": float(self.nonfinite.total)})
        return to_host(stats)

    def sample(self, step: int) -> collect.Collected:
        """RL step ``step``'s scored samples (``lmpo.trainer.step.collect.collect`` with this trainer's parts)."""
        return collect.collect(self.cfg, step, prompts=self.prompts, engine=self.rollout_engine,
                               pipeline=self.pipeline, scorer=self.scorer, accuracy_fn=self.accuracy_fn,
                               tokenizer=self.tokenizer, device=self.device, runner=self.episode_runner)

    def update(self, step: int, batch: RolloutBatch) -> dict[str, float]:
        """Every optimizer step of RL step ``step`` on ``batch`` (``lmpo.trainer.step.update.update``); its statistics."""
        return update_stage.update(step, batch, state=self.state, settings=self.update_settings, policy=self.policy(),
                                   teacher=self.teacher, log=self.metrics.write)

    # ---------------------------------------------------------------- evaluation, checkpoints (lmpo.trainer.run.state)
    def evaluate(self, examples=None) -> dict[str, float]:
        """Greedy ``eval/...`` metrics of the policy on ``examples`` (default: the held-out examples, with pass@k
        under ``eval.samples_per_prompt``): ``lmpo.eval.held_out.evaluate_policy``."""
        return held_out.evaluate_policy(self.cfg, self.model, self.tokenizer,
                                        self.eval_examples if examples is None else examples,
                                        accuracy_fn=self.accuracy_fn, scorer=self.scorer, device=self.device,
                                        sampled=examples is None)

    def state_dict(self, step: int) -> dict:
        """What a checkpoint after RL step ``step`` holds besides the weights (``TrainState.state_dict``)."""
        metrics = getattr(self, "metrics", None)
        return self.state.state_dict(step, pipeline=self.pipeline, metrics_rows=metrics.rows if metrics else 0)

    def save(self, step: int) -> Path:
        """Checkpoint ``step`` (``lmpo.trainer.run.state.TrainState.save``); its path."""
        return self.state.save(self.run_dir, step, pipeline=self.pipeline, metrics=getattr(self, "metrics", None),
                               keep_last=self.cfg.checkpoint.keep_last, tokenizer=self.tokenizer,
                               base_model_name=self.cfg.model.name)

    def save_final_model(self, step: int) -> Path:
        """RUN_DIR/model/ after RL step ``step`` (``lmpo.trainer.run.export.publish_final_model``); its path."""
        return publish_final_model(self.run_dir, step, self.model, self.tokenizer, base_model_name=self.cfg.model.name)
