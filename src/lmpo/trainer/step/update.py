"""The update stage of an RL step: ``epochs_per_step × minibatches_per_step`` optimizer steps on its RolloutBatch.

    update(...)           behaviour / reference log-probs when needed, then every optimizer step; merged statistics
    minibatches(...)      (epoch, index, rows) of each optimizer step: a seeded shuffle per epoch, cut in equal parts
    optimizer_step(...)   microbatch forwards → objective → backward; clip; skip when non-finite, else AdamW step
    NonFiniteGuard        counts skipped optimizer steps and stops the run after too many in a row

``Trainer.update`` calls ``update`` with the run's ``TrainState``; the config values read here come in ``UpdateSettings``
(``lmpo.trainer.run.build.update_settings``). The objective is called through its driver, which merges the
statistics in one host sync per optimizer step; that sync also decides whether the step is finite.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import torch

from lmpo.errors import RunError
from lmpo.generation import RolloutBatch
from lmpo.objectives.driver import merge_stats
from lmpo.trainer.step import stages
from lmpo.trainer.step.mismatch import mismatch_metrics
from lmpo.trainer.step.ref_sync import sync_reference
from lmpo.trainer.step.sampling import seed_for


class NonFiniteError(RunError):
    """Too many consecutive optimizer steps had a non-finite loss or gradient."""


@dataclass(frozen=True)
class UpdateSettings:
    """The config values the update reads (``build.update_settings`` makes it from a ``TrainConfig``).

    seed: ``loop.seed``; minibatch shuffles and clip_cov's selections are seeded from ``(seed, step, …)``.
    epochs_per_step, minibatches_per_step: optimizer steps per RL step = their product.
    seqs_per_microbatch: rows per forward/backward; microbatches of a minibatch accumulate into one step.
    max_grad_norm: clip the global gradient norm to this; 0 = measure it only.
    off_policy: more than one optimizer step per rollout, so behaviour log-probs are taken first.
    temperature, autocast: the sampling temperature and bfloat16 autocast, for a distillation teacher's forwards.
    ref_sync_steps, ref_sync_alpha: TR-DPO's reference sync every this many optimizer steps (0 = never).
    logprobs: how log-probs are taken (``build.logprob_settings``); device: the run's.
    """

    seed: int
    epochs_per_step: int
    minibatches_per_step: int
    seqs_per_microbatch: int
    max_grad_norm: float
    off_policy: bool
    temperature: float
    autocast: bool
    logprobs: stages.LogprobSettings
    device: torch.device
    ref_sync_steps: int = 0
    ref_sync_alpha: float = 1.0


@dataclass
class NonFiniteGuard:
    """Counts optimizer steps skipped for a non-finite loss or gradient (a checkpoint keeps the counts).

    max_in_row: ``loop.max_nonfinite_steps``; that many skips in a row raise :class:`NonFiniteError`.
    checkpoints: the run's checkpoint directory, named in the error (its checkpoints are intact).
    """

    max_in_row: int
    checkpoints: Path
    total: int = 0
    in_row: int = 0

    def skip(self, step: int, stats: dict[str, float], log: Callable[[str], None]) -> None:
        """Count one skipped optimizer step of RL step ``step``; raise once ``max_in_row`` were skipped in a row."""
        self.total += 1
        self.in_row += 1
        log(f"step {step}: non-finite loss or gradient (loss={stats['loss/total']}, grad "
            f"norm={stats['optim/grad_norm']}); optimizer step skipped ({self.in_row} in a row)")
        if self.in_row >= self.max_in_row:
            raise NonFiniteError(
                f"{self.in_row} consecutive optimizer steps had a non-finite loss or gradient "
                f"(limit loop.max_nonfinite_steps={self.max_in_row}); stopping at RL step {step}. Checkpoints "
                f"already written in {self.checkpoints} are intact. Lower optim.lr, check the reward scale, or "
                "use a float32 model.")


def update(step: int, batch: RolloutBatch, *, state, settings: UpdateSettings, policy, teacher,
           log: Callable[[str], None]) -> dict[str, float]:
    """All optimizer steps of RL step ``step`` on ``batch`` (B rows, advantages set); their merged statistics.

    Args:
        state: the run's ``lmpo.trainer.run.state.TrainState``: its ``model`` (the parameters stepped),
            ``optimizer`` and ``schedule``, the objective ``driver``, the frozen ``ref_model`` (or None) and the
            ``nonfinite`` counters are what the update reads and changes.
        policy: what the log-prob forwards call (the model, or its compiled view under ``loop.compile``:
            ``Trainer.policy()``).
        teacher: a ``lmpo.trainer.step.teacher.Teacher`` for a distillation part, or None.
        log: where the non-finite messages go (the metrics log).

    Returns ``loss/*``, the objective's statistics, ``optim/grad_norm``, ``optim/lr`` (of the last optimizer
    step) and, when the rollout recorded its log-probs, the rollout / training mismatch metrics.
    """
    state.model.train()
    # behaviour log-probs: only when the same rollout is used for more than one optimizer step
    old = stages.logprobs(policy, batch, settings=settings.logprobs, with_grad=False).logp if settings.off_policy \
        else None
    ref = batch.ref_logp
    if ref is None and state.driver.needs.ref_logp:
        ref = stages.logprobs(state.ref_model, batch, settings=settings.logprobs, with_grad=False).logp
    batch = batch.with_(old_logp=old, ref_logp=ref)
    # on-policy, the single optimizer step's forwards are the training log-probs before the update
    keep_logp = batch.rollout_logp is not None and old is None
    per_step: list[dict[str, float]] = []
    lr = state.schedule.current_lr()
    train_logp = None
    for epoch, m, rows in minibatches(step, len(batch), settings):
        cov_gen = torch.Generator(device=settings.device).manual_seed(seed_for(settings.seed, step, 3, epoch, m))
        stats, train_logp = optimizer_step(step, batch, rows, cov_gen, state=state, settings=settings, policy=policy,
                                           teacher=teacher, log=log, keep_logp=keep_logp)
        if stats is not None:
            lr = stats.pop("optim/lr")
            per_step.append(stats)
    out = merge_stats(per_step) if per_step else {"loss/total": float("nan"), "optim/grad_norm": float("nan")}
    out["optim/lr"] = float(lr)
    if batch.rollout_logp is not None:
        out.update(mismatch_metrics(old if old is not None else train_logp, batch.rollout_logp, batch.loss_mask))
    return out


def minibatches(step: int, B: int, settings: UpdateSettings) -> Iterator[tuple[int, int, torch.Tensor]]:
    """``(epoch, index, rows)`` of every optimizer step of RL step ``step``: each epoch a seeded shuffle of the
    B sequences (in order when there is one minibatch), cut into ``minibatches_per_step`` parts of ⌈B / M⌉
    rows (the last may be shorter; an empty one is left out). ``rows``: (≤ ⌈B / M⌉,) int64 on ``settings.device``."""
    M = settings.minibatches_per_step
    size = -(-B // M)
    shuffle_gen = torch.Generator().manual_seed(seed_for(settings.seed, step, 2))
    for epoch in range(settings.epochs_per_step):
        order = torch.randperm(B, generator=shuffle_gen) if M > 1 else torch.arange(B)
        order = order.to(settings.device)
        for m in range(M):
            if order[m * size:(m + 1) * size].numel():
                yield epoch, m, order[m * size:(m + 1) * size]


def optimizer_step(step: int, batch: RolloutBatch, rows: torch.Tensor, cov_gen: torch.Generator, *, state,
                   settings: UpdateSettings, policy, teacher, log: Callable[[str], None], keep_logp: bool = False
                   ) -> tuple[dict[str, float] | None, torch.Tensor | None]:
    """One optimizer step over the minibatch ``rows`` ((B_m,) indices into ``batch``, whose ``old_logp`` and
    ``ref_logp`` are set as ``update`` sets them); arguments as ``update``'s, ``cov_gen`` seeds clip_cov.

    Microbatches of ``seqs_per_microbatch`` rows accumulate gradients with the minibatch's token and sequence
    counts as exact global normalisers. Returns the step's statistics (None when the loss or gradient was
    non-finite and the step was skipped) and, with ``keep_logp``, the detached (B_m, T) log-probs its
    forwards took.
    """
    model, optimizer, schedule, driver = state.model, state.optimizer, state.schedule, state.driver
    device = settings.device
    needs = driver.needs
    num_tokens = batch.loss_mask[rows].sum()
    num_seqs = int(rows.numel())
    optimizer.zero_grad(set_to_none=True)
    loss_sum = torch.zeros((), device=device)
    taken: list[torch.Tensor] = []
    for start in range(0, num_seqs, settings.seqs_per_microbatch):
        mu = rows[start:start + settings.seqs_per_microbatch]
        distill = {}  # the policy's full logits and the teacher's, for a distillation part
        if teacher is not None:
            with stages.autocast(settings.autocast, device):
                fwd, distill = teacher.forward(model, batch.input_ids[mu], batch.attention_mask[mu],
                                               batch.completion_ids[mu], with_entropy=needs.entropy,
                                               temperature=settings.temperature)
        else:
            fwd = stages.logprobs(policy, batch, mu, settings=settings.logprobs, with_grad=True,
                                  with_entropy=needs.entropy, grad_norm_mode=needs.token_grad_norm)
        if keep_logp:
            taken.append(fwd.logp.detach())
        loss = driver.loss(
            fwd.logp, batch.old_logp[mu] if batch.old_logp is not None else fwd.logp.detach(),
            batch.advantages[mu], batch.loss_mask[mu], weight=mu.numel() / num_seqs,
            ref_logp=batch.ref_logp[mu] if batch.ref_logp is not None else None, entropy=fwd.entropy,
            token_grad_norm=fwd.token_grad_norm, rollout_logp=batch.rollout_logp[mu] if needs.rollout_logp else None,
            num_tokens=num_tokens, num_seqs=num_seqs, generator=cov_gen, **distill)
        loss.backward()
        loss_sum = loss_sum + loss.detach()
    params = [p for p in model.parameters() if p.requires_grad]
    max_norm = settings.max_grad_norm if settings.max_grad_norm > 0 else math.inf
    grad_norm = torch.nn.utils.clip_grad_norm_(params, max_norm)
    logp = torch.cat(taken) if taken else None
    # the one host sync of the step: the objective's statistics, the loss and the gradient norm
    stats = driver.end_step(extra={"loss/total": loss_sum, "optim/grad_norm": grad_norm}, update_controller=False)
    if not (math.isfinite(stats["loss/total"]) and math.isfinite(stats["optim/grad_norm"])):
        optimizer.zero_grad(set_to_none=True)
        state.nonfinite.skip(step, stats, log)
        return None, logp
    state.nonfinite.in_row = 0
    stats["optim/lr"] = schedule.apply()
    optimizer.step()
    schedule.advance()
    if settings.ref_sync_steps > 0 and schedule.step_index % settings.ref_sync_steps == 0:
        sync_reference(state.ref_model, model, settings.ref_sync_alpha)  # TR-DPO (lmpo.trainer.step.ref_sync)
    driver.commit_step(stats)
    return stats, logp
