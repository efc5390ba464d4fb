"""The stages of one RL step as public functions: the loop (``lmpo.trainer.Trainer``), the lab's gradient study and
RLVCR call these, never the Trainer's own methods.

    score(...)              rollout + examples → ScoredRollout: rewards (B,), per-function scores, accuracy
    advantage_inputs(...)   what the advantage estimator needs beyond (rewards, group ids)
    advantages(...)         (B,) advantages, the estimator's statistics, the zero-variance and kept rows
    kl_in_reward(...)       r − β·Σ_t KL_t (verl ``apply_kl_penalty``) and the controller update
    TrainInput              what a step trains on, made by the transform the run chose at build (``build.train_input``):
                            ``sampled_input`` (the sampled batch), ``RLVCRInput`` (RLVCR's expansion of it) or
                            ``multiturn.TurnCredit`` (per-turn credit)
    train_batch(...)        the kept rows with their advantages; truncated completions masked when asked
    logprobs(...)           (B, T) log-probs of a RolloutBatch (its rows) under this run's ``LogprobSettings``
    rollout_stats(...)      the step's reward / advantage / completion metrics

Each takes tensors, built objects (scorer, estimator, models) and plain settings; none reads a config object.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch

from lmpo.errors import RunError
from lmpo.generation import PolicyLogprobs, Rollout, RolloutBatch, policy_logprobs
from lmpo.generation.packing import packed_policy_logprobs
from lmpo.objectives.advantages import zero_variance_mask
from lmpo.objectives.kl_reward import kl_penalised_rewards
from lmpo.rewards.overlong import overlong_penalty
from lmpo.rewards.scorer import reward_arguments
from lmpo.rlvcr.config import RLVCRConfig
from lmpo.rlvcr.expansion import rlvcr_stage
from lmpo.trainer.step.sampling import ScoredRollout, mask_truncated, seed_for


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


@dataclass(frozen=True)
class LogprobSettings:
    """How a run takes log-probs (``lmpo.trainer.run.build.logprob_settings`` makes it from the config).

    temperature: τ the completions were sampled with (log-probs of softmax(logits / τ)).
    group_size: G when rows ``i·G … i·G+G−1`` share a prompt and its forward is shared; None = plain forward.
    seqs_per_microbatch: rows per no-grad forward.
    autocast: run the forwards under bfloat16 autocast (parameters and optimizer stay as they are).
    pack_sequences: run the forwards padding-free (``lmpo.generation.packing``; not with gradient norms).
    """

    temperature: float
    group_size: int | None
    seqs_per_microbatch: int
    autocast: bool = False
    pack_sequences: bool = False


def autocast(enabled: bool, device: torch.device | str) -> contextlib.AbstractContextManager:
    """bfloat16 autocast on ``device``'s type when ``enabled`` (``loop.autocast``), else nothing."""
    if not enabled:
        return contextlib.nullcontext()
    return torch.autocast(device_type=torch.device(device).type, dtype=torch.bfloat16)


def logprobs(model, batch: RolloutBatch, rows: torch.Tensor | None = None, *, settings: LogprobSettings,
             with_grad: bool, with_entropy: bool = False, grad_norm_mode: str | None = None) -> PolicyLogprobs:
    """``lmpo.generation.policy_logprobs`` of ``batch`` (its ``rows`` (K,), or all of it) under ``settings``:
    (K, T) log-probs, plus entropies / token gradient norms on request; without gradient in microbatches."""
    ids, attn, tokens = batch.input_ids, batch.attention_mask, batch.completion_ids
    if rows is not None:
        ids, attn, tokens = ids[rows], attn[rows], tokens[rows]
    if settings.pack_sequences and grad_norm_mode is None:  # padding-free (lmpo.generation.packing)
        with autocast(settings.autocast, ids.device):
            return packed_policy_logprobs(model, ids, attn, tokens, temperature=settings.temperature,
                                          with_entropy=with_entropy, with_grad=with_grad,
                                          seqs_per_microbatch=settings.seqs_per_microbatch)
    with autocast(settings.autocast, ids.device):
        return policy_logprobs(model, ids, attn, tokens, temperature=settings.temperature,
                               with_entropy=with_entropy, grad_norm_mode=grad_norm_mode,
                               group_size=settings.group_size, with_grad=with_grad,
                               seqs_per_microbatch=settings.seqs_per_microbatch)


def score_rewards(scorer, examples: Sequence, rollout: Rollout) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """``(rewards (B,), per-function scores name → (B,))`` of a rollout whose group i is ``examples[i]``."""
    rows = [examples[i] for i in rollout.group_ids.tolist()]
    prompts, completions, answers, columns = reward_arguments(rows, rollout.completions)
    return scorer.score(prompts, completions, answers, **columns)


def score(scorer, accuracy_fn: Callable, examples: Sequence, rollout: Rollout, *, success_threshold: float,
          device: torch.device, max_new_tokens: int, overlong_buffer_len: int = 0,
          overlong_penalty_factor: float = 1.0) -> ScoredRollout:
    """A rollout scored: total rewards (B,) on ``device`` (plus DAPO's overlong penalty, as the reward function
    ``overlong``, when ``overlong_buffer_len`` > 0), per-function scores, and accuracy (B,) float 0/1: the
    accuracy reward reaching ``success_threshold``."""
    group = rollout.group_ids.to(device)
    prompts, completions, answers, columns = reward_arguments([examples[i] for i in group.tolist()],
                                                              rollout.completions)
    rewards, per_fn = scorer.score(prompts, completions, answers, **columns)
    acc_values = accuracy_fn(prompts=prompts, completions=completions, answer=answers, **columns)
    correct = torch.tensor([v is not None and float(v) >= success_threshold for v in acc_values],
                           dtype=torch.float32)
    rewards = rewards.to(device)
    if overlong_buffer_len > 0:
        penalty = overlong_penalty(rollout.completion_lengths.to(device), max_new_tokens, overlong_buffer_len,
                                   overlong_penalty_factor)
        rewards = rewards + penalty.to(rewards.dtype)
        per_fn = {**per_fn, "overlong": penalty}
    return ScoredRollout(list(examples), rollout, rewards, per_fn, correct,
                         reward_errors=float(scorer.last_stats.get("reward/skipped", 0.0)),
                         reward_nonfinite=float(scorer.last_stats.get("reward/nonfinite", 0.0)))


def advantage_inputs(estimator, scorer, examples: Sequence, rollout: Rollout, per_fn: dict[str, torch.Tensor], *,
                     engine, device: torch.device, autocast_enabled: bool = False) -> dict[str, torch.Tensor]:
    """What ``estimator`` needs beyond (rewards, group ids), computed only when it asks: completion lengths (B,),
    each reward function's values (undefined → 0, as in the total) (B, K) with their weights (K,), or the reward
    of each prompt's greedy completion (ReMax: one extra greedy generation per prompt from ``engine``) (B,)."""
    needs = estimator.required_inputs()
    inputs: dict[str, torch.Tensor] = {}
    if "lengths" in needs:
        inputs["lengths"] = rollout.completion_lengths.to(device)
    if "reward_components" in needs:
        names = scorer.names
        inputs["reward_components"] = torch.stack(
            [torch.nan_to_num(per_fn[n], nan=0.0) for n in names], dim=1).to(device)  # (B, K)
        inputs["reward_weights"] = torch.tensor([scorer.weights[n] for n in names], device=device)
    if "baseline_rewards" in needs:
        with torch.no_grad(), autocast(autocast_enabled, device):
            greedy = engine.generate([e.prompt for e in examples], 1, greedy=True)
        prompts, completions, answers, columns = reward_arguments(examples, greedy.completions)
        greedy_rewards, _ = scorer.score(prompts, completions, answers, **columns)  # (P,)
        inputs["baseline_rewards"] = greedy_rewards.to(device)[rollout.group_ids.to(device)]  # (B,)
    return inputs


def advantages(estimator, rewards: torch.Tensor, group_ids: torch.Tensor, inputs: dict[str, torch.Tensor], *,
               filter_zero_variance: bool) -> tuple[torch.Tensor, dict, torch.Tensor, torch.Tensor]:
    """``(advantages (B,), estimator statistics, zero_var (B,) bool, keep (B,) bool)``: zero_var marks completions
    whose group carries no signal (all rewards equal); keep is ``~zero_var`` under ``filter_zero_variance``."""
    adv, adv_stats = estimator(rewards, group_ids, **inputs)
    zero_var = zero_variance_mask(rewards, group_ids)
    keep = ~zero_var if filter_zero_variance else torch.ones_like(group_ids, dtype=torch.bool)
    return adv, adv_stats, zero_var, keep


def kl_in_reward(policy, ref_model, batch: RolloutBatch, rewards: torch.Tensor, kl_ctrl, *,
                 settings: LogprobSettings, estimator: str, log_ratio_clamp: float):
    """``r − β·Σ_t KL_t`` for every sequence of ``batch`` (verl ``apply_kl_penalty``) with β from ``kl_ctrl``,
    then the controller update with the step's KL over its B sequences.

    Returns (rewards' (B,), ``kl/...`` statistics, reference log-probs (B, T)).
    """
    policy.train()  # the mode the update's behaviour log-probs are taken in
    logp = logprobs(policy, batch, settings=settings, with_grad=False).logp
    ref_logp = logprobs(ref_model, batch, settings=settings, with_grad=False).logp
    beta = float(kl_ctrl.value)
    shaped, stats = kl_penalised_rewards(rewards, logp, ref_logp, batch.loss_mask, beta, estimator, log_ratio_clamp)
    stats["kl/coef"] = beta  # a float: logged exactly, no float32 round trip
    # one host sync for the controller's input, as verl's .item()
    kl_ctrl.update(float(stats["kl/reward_kl"]), int(rewards.numel()))
    return shaped, stats, ref_logp


@dataclass(frozen=True)
class TrainInput:
    """What an RL step trains on: the ``rollout`` its rows come from (B' rows), their ``advantages`` ((B',) or
    per-token (B', T)), the rows ``keep`` (B',) bool marks, the ``batch`` (a RolloutBatch of the B' rows) and the
    statistics of the transform that made it (``metrics``).

    One transform per run, chosen at build (``lmpo.trainer.run.build.train_input``), maps a step's collected
    samples, advantages (B,), kept rows (B,) and batch to it: ``sampled_input``, ``RLVCRInput`` or
    ``lmpo.trainer.step.multiturn.TurnCredit``.
    """

    rollout: Rollout
    advantages: torch.Tensor
    keep: torch.Tensor
    batch: RolloutBatch
    metrics: dict = field(default_factory=dict)


def sampled_input(step: int, collected, advantages: torch.Tensor, keep: torch.Tensor, batch: RolloutBatch,
                  group_ids: torch.Tensor) -> TrainInput:
    """The step trains on what it sampled, with the advantages of its rewards."""
    return TrainInput(collected.scored.rollout, advantages, keep, batch)


@dataclass(frozen=True)
class RLVCRInput:
    """RLVCR (docs/rlvcr.md, ``lmpo.rlvcr``) as a step's transform: the successes expanded per thinking level, the
    mixed action / thinking advantages of the rows and their expansions (they replace the advantages and the kept
    rows), and the loss mask of ``rlvcr.expansion_loss`` (which tokens expansions train). Expansions are sampled
    at the rollout's ``temperature`` / ``top_p`` / ``top_k`` with a generator seeded from ``(seed, step, 5)``."""

    model: Any
    tokenizer: Any
    settings: RLVCRConfig
    scale: str
    temperature: float
    top_p: float
    top_k: int
    seed: int
    device: torch.device

    def __call__(self, step: int, collected, advantages: torch.Tensor, keep: torch.Tensor, batch: RolloutBatch,
                 group_ids: torch.Tensor) -> TrainInput:
        scored, dev = collected.scored, self.device
        rl = rlvcr_stage(self.model, self.tokenizer, scored.rollout, scored.rewards, self.settings, keep=keep,
                         scale=self.scale, temperature=self.temperature, top_p=self.top_p, top_k=self.top_k,
                         generator=torch.Generator(dev).manual_seed(seed_for(self.seed, step, 5)))
        expanded = RolloutBatch.from_rollout(rl.rollout, dev).with_(loss_mask=rl.loss_mask.to(dev))
        return TrainInput(rl.rollout, rl.advantages, rl.keep, expanded, rl.metrics)


def train_batch(full: RolloutBatch, advantages: torch.Tensor, keep: torch.Tensor, *, ref_logp: torch.Tensor | None,
                truncated: torch.Tensor, mask_truncated_completions: bool
                ) -> tuple[RolloutBatch, bool, dict[str, torch.Tensor]]:
    """The rows of ``full`` (B rows) an RL step trains on: those ``keep`` (B,) bool marks, with their advantages
    ((B,) or per-token (B, T)) and reference log-probs ((B, T) or None); under ``mask_truncated_completions``
    the rows ``truncated`` (B,) bool marks get loss mask 0 (``lmpo.trainer.step.sampling.mask_truncated``).

    Returns the batch, whether there is anything to train on (a kept row; with masking, a token left in the
    loss) and ``completion/truncated_masked_frac`` when masking.
    """
    idx = torch.nonzero(keep).squeeze(-1)
    batch = full.with_(advantages=advantages, ref_logp=ref_logp).select(idx)
    if not mask_truncated_completions:
        return batch, idx.numel() > 0, {}
    loss_mask, frac = mask_truncated(batch.loss_mask, truncated[idx])
    return batch.with_(loss_mask=loss_mask), idx.numel() > 0 and bool(loss_mask.any()), \
        {"completion/truncated_masked_frac": frac}


def missing_rollout_logprobs(objective, engine) -> RunError:
    """The error for an objective that needs the sampler's log-probs from an engine that recorded none."""
    return RunError(f"objective {objective.name!r} needs the sampler's log-probs (correction={objective.correction!r}, "
                    f"rejection={objective.rejection!r}), but the generation engine {type(engine).__name__} "
                    "returned none; give an engine that records them (HFRollout(..., record_logprobs=True), or "
                    "rollout.record_logprobs: true).")


def truncated_fraction(completion_ids: torch.Tensor, completion_mask: torch.Tensor, eos_token_id: int
                       ) -> torch.Tensor:
    """0-dim: the fraction of completions (B, T) with no EOS inside their mask (cut at ``max_new_tokens``)."""
    ids = completion_ids.to(completion_mask.device)
    has_eos = ((ids == eos_token_id) & completion_mask).any(-1)
    return (~has_eos).float().mean()


def rollout_stats(scored: ScoredRollout, adv: torch.Tensor, adv_stats: dict | None, zero_var: torch.Tensor,
                  keep: torch.Tensor, completion_mask: torch.Tensor, eos_token_id: int
                  ) -> dict[str, torch.Tensor | float]:
    """The step's ``reward/``, ``adv/`` and ``completion/`` metrics (0-dim tensors; the loop syncs once).

    ``adv``, ``zero_var``, ``keep``: (B,); ``completion_mask``: (B, T) bool on the training device.
    """
    rewards, per_fn = scored.rewards, scored.per_fn
    lengths = completion_mask.sum(-1).float()
    stats: dict[str, torch.Tensor | float] = {
        "reward/mean": rewards.mean(), "reward/std": rewards.std() if rewards.numel() > 1 else rewards.new_zeros(()),
        "reward/accuracy": scored.correct.mean(), "reward/errors": scored.reward_errors,
        "reward/nonfinite": scored.reward_nonfinite,
        "adv/mean": adv[keep].mean() if keep.any() else adv.new_zeros(()),
        "adv/std": adv[keep].std() if keep.sum() > 1 else adv.new_zeros(()),
        "adv/abs_mean": adv[keep].abs().mean() if keep.any() else adv.new_zeros(()),
        "adv/zero_var_frac": zero_var.float().mean(), "adv/kept_frac": keep.float().mean(),
        "completion/length_mean": lengths.mean(), "completion/length_max": lengths.max(),
        "completion/truncated_frac": truncated_fraction(scored.rollout.completion_ids, completion_mask,
                                                        eos_token_id),
    }
    for name, vals in per_fn.items():
        finite = vals[torch.isfinite(vals)]
        stats[f"reward/{name}/mean"] = finite.mean() if finite.numel() else torch.tensor(float("nan"))
        stats[f"reward/{name}/std"] = finite.std() if finite.numel() > 1 else torch.tensor(0.0)
    for k, v in (adv_stats or {}).items():
        stats.setdefault(k if "/" in k else f"adv/{k}", v)
    return stats
