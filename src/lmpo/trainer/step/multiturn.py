"""Multi-turn training: the trainer's episode stage (its config section, ``EnvConfig``, is in ``lmpo.trainer.config``).

With ``env.id`` set, an RL step plays ``completions_per_prompt`` episodes of the environment per example (the
examples come from the environment's task, ``lmpo.envs.make_env_task``) through
``lmpo.generation.episodes.EpisodeRunner`` and ``HFTurnSampler``, and turns them into the same
``RolloutBatch`` the single-turn path trains on::

    input_ids       opening prompt | turn 0 | observation 0 | turn 1 | …      (token-exact, as sampled)
    attention_mask  1 on every real token, the environment's included
    loss_mask       1 on the policy's tokens only (observations, tool outputs and padding 0)
    rollout_logp    the sampler's log-probs (0 on the environment's tokens)

The episode return (the sum of the turn rewards) is each sequence's reward, so the advantage estimators work
over the G episodes of an example exactly as over G completions of a prompt. ``objective.mask_truncated_completions``
zeroes the loss mask of every truncated episode (a turn or total-token budget, ``max_turns``, the environment's
own truncation, or an environment error under ``env.on_env_error: truncate``).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from lmpo.envs import make_env
from lmpo.envs.plugins import names_a_file
from lmpo.errors import InputError
from lmpo.generation import Rollout, RolloutBatch
from lmpo.generation.episodes import (
    Episode,
    EpisodeBatch,
    EpisodeRunner,
    HFTurnSampler,
    collate_episodes,
    episode_metrics,
    per_turn_to_tokens,
    turn_returns,
)
from lmpo.generation.worker import EpisodeSpec
from lmpo.trainer.step.sampling import ScoredRollout
from lmpo.trainer.step.stages import TrainInput


def ensure_chat_template(tokenizer, env, model_name: str) -> None:
    """Episodes are rendered with a chat template: the tokenizer's or ``env.chat_template``; a built-in preset's
    character tokenizer (``model.name: tiny``) gets ``lmpo.models.chat.TINY_CHAT_TEMPLATE``, which renders the
    environment's tool schemas compactly."""
    from lmpo.models import MODEL_PRESETS
    from lmpo.models.chat import TINY_CHAT_TEMPLATE

    if env.chat_template is None and not getattr(tokenizer, "chat_template", None) and model_name in MODEL_PRESETS:
        tokenizer.chat_template = TINY_CHAT_TEMPLATE
    if env.chat_template is None and not getattr(tokenizer, "chat_template", None):
        raise InputError(f"`env.id` = {env.id!r}: multi-turn episodes are rendered with a chat template, and the "
                         f"tokenizer of model {model_name!r} has none. Use a chat model, or give the Jinja template "
                         "as env.chat_template.")


def make_runner(model, tokenizer, env, *, temperature: float, top_p: float = 1.0, top_k: int = 0) -> EpisodeRunner:
    """The episode runner of a run: the policy sampled with the rollout settings, ``env``'s budget and handling."""
    sampler = HFTurnSampler(model, tokenizer, temperature=temperature, top_p=top_p, top_k=top_k)
    return EpisodeRunner(sampler, tokenizer, env.budget, chat_template=env.chat_template,
                         on_env_error=env.on_env_error, step_timeout_s=env.step_timeout_s)


def episode_spec(env, rollout, tokenizer) -> EpisodeSpec:
    """What the rollout worker of ``rollout.async_staleness`` plays ``env``'s episodes with: the runner
    ``make_runner`` builds here (the tokenizer's chat template, as ``ensure_chat_template`` left it, travels
    along), the environment of ``env_factory``, ``env.import`` with files made absolute."""
    imports = tuple(str(Path(item).resolve()) if names_a_file(item) else item for item in env.imports)
    return EpisodeSpec(env_id=env.id, env_options=dict(env.options), imports=imports,
                       sandbox_require=env.sandbox.require, budget=env.budget, chat_template=env.chat_template,
                       tokenizer_chat_template=getattr(tokenizer, "chat_template", None),
                       on_env_error=env.on_env_error, step_timeout_s=env.step_timeout_s,
                       temperature=rollout.temperature, top_p=rollout.top_p, top_k=rollout.top_k)


def env_factory(env, options: dict | None = None):
    """A callable building a fresh environment of ``env`` (its id and options, with ``options`` laid over them)
    per episode."""
    merged = {**env.options, **(options or {})}
    return lambda: make_env(env.id, **merged)


def episodes_to_rollout(episodes: Sequence[Episode], tokenizer, device: torch.device
                        ) -> tuple[Rollout, RolloutBatch, EpisodeBatch]:
    """Episodes as ``(rollout, batch, collated)``: ``collated`` is ``collate_episodes``' batch (CPU).

    The rollout carries what the step's metrics, advantage inputs and completion log read: its
    ``completion_mask`` is the *policy* mask (so ``completion_lengths`` counts the tokens the policy sampled,
    the ``lengths`` of length-aware estimators), ``completions`` the conversation after the opening as text;
    it is not the training layout. The batch is: attention on every real token (the environment's included),
    loss mask on the policy's tokens only, the sampler's log-probs.
    """
    eb = collate_episodes(episodes, tokenizer.pad_token_id)
    prompts = [tokenizer.decode(e.prompt_ids) for e in episodes]
    completions = [tokenizer.decode(e.completion_ids, skip_special_tokens=True) for e in episodes]
    rollout = Rollout(prompt_ids=eb.prompt_ids, prompt_mask=eb.prompt_mask, completion_ids=eb.completion_ids,
                      completion_mask=eb.policy_mask, group_ids=eb.group_ids, prompts=prompts,
                      completions=completions, truncated=eb.truncated, logprobs=eb.logprobs)
    batch = RolloutBatch(input_ids=eb.input_ids.to(device), attention_mask=eb.full_attention_mask.to(device),
                         completion_ids=eb.completion_ids.to(device), loss_mask=eb.loss_mask.to(device).bool(),
                         rollout_logp=eb.logprobs.to(device))
    return rollout, batch, eb


def turn_advantages(estimator, turn_rewards: torch.Tensor, turn_mask: torch.Tensor, turn_ids: torch.Tensor,
                    group_ids: torch.Tensor, gamma: float) -> torch.Tensor:
    """Per-token advantages of per-turn credit: (B, T), 0 on the environment's tokens and padding.

    ``G = turn_returns(turn_rewards, turn_mask, γ)`` (B, K); for each turn index k the estimator runs on
    ``G[:, k]`` of the episodes that reached turn k, grouped by ``group_ids``; ``per_turn_to_tokens`` spreads
    the (B, K) result over each turn's tokens. Naive equivalent (GRPO, scale ``group``):
    ``A[b, k] = (G[b, k] − mean_{g: same group, has turn k} G[g, k]) / (std + ε)``. With γ = 1, rewards only at
    the last turn and every episode of a group as long, every token gets the episode-return advantage.
    """
    G = turn_returns(turn_rewards, turn_mask, gamma)
    A = torch.zeros_like(G)
    for k in range(G.shape[1]):
        rows = turn_mask[:, k].bool()
        if rows.any():
            A[rows, k] = estimator(G[rows, k], group_ids[rows])[0].to(A.dtype)
    return per_turn_to_tokens(A, turn_ids)


@dataclass(frozen=True)
class TurnCredit:
    """Per-turn credit (``env.turn_discount`` = γ) as a step's transform: the step trains on its episodes with the
    (B, T) advantages of ``turn_advantages`` instead of each episode's return advantage (which the step's metrics
    and completion log report)."""

    estimator: Any
    discount: float
    device: torch.device

    def __call__(self, step: int, collected, advantages: torch.Tensor, keep: torch.Tensor, batch: RolloutBatch,
                 group_ids: torch.Tensor) -> TrainInput:
        eb, dev = collected.played.episode_batch, self.device
        per_token = turn_advantages(self.estimator, eb.turn_rewards.to(dev), eb.turn_mask.to(dev), eb.turn_ids.to(dev),
                                    group_ids, self.discount)
        return TrainInput(collected.scored.rollout, per_token, keep, batch)


@dataclass
class PlayedStep:
    """One RL step's episodes: scored like a single-turn draw, the batch to train on, the ``episodes/*`` metrics
    and the collated episodes (their per-turn rewards, for per-turn credit)."""

    scored: ScoredRollout
    batch: RolloutBatch
    metrics: dict[str, float]
    episodes: list[Episode]
    episode_batch: EpisodeBatch


def play_step(runner: EpisodeRunner, env, examples: Sequence, completions_per_example: int, *, seed: int,
              generator: torch.Generator, tokenizer, device: torch.device) -> PlayedStep:
    """Play G episodes of each example and score them: reward = episode return, correct = an
    ``info["correct"]`` turn (or a positive return where the environment judges no answer)."""
    episodes = runner.run(env_factory(env), list(examples), completions_per_example, seed=seed, generator=generator)
    return score_episodes(episodes, examples, tokenizer, device)


def score_episodes(episodes: Sequence[Episode], examples: Sequence, tokenizer, device: torch.device) -> PlayedStep:
    """Played episodes (G per example, example-major, as ``EpisodeRunner.run`` returns them, here or in the
    rollout worker) as a step: ``play_step``'s scoring, without the playing."""
    episodes = list(episodes)
    rollout, batch, eb = episodes_to_rollout(episodes, tokenizer, device)
    correct = episode_success(episodes)
    scored = ScoredRollout(list(examples), rollout, eb.returns.to(device), {}, correct, episodes=episodes)
    return PlayedStep(scored, batch, step_metrics(episodes, correct), episodes, eb)


def episode_success(episodes: Sequence[Episode]) -> torch.Tensor:
    """(B,) float 0/1: an ``info["correct"]`` turn, or a positive return where the environment judges no answer."""
    judged = any("correct" in i for e in episodes for i in e.infos)
    return torch.tensor([float(any(i.get("correct") for i in e.infos)) if judged else float(e.episode_return > 0)
                         for e in episodes])


def step_metrics(episodes: Sequence[Episode], correct: torch.Tensor | None = None) -> dict[str, float]:
    """The ``episodes/*`` metrics of a step's episodes, ``episodes/success_rate`` included."""
    metrics = episode_metrics(episodes)
    metrics.setdefault("episodes/success_rate",
                       float((episode_success(episodes) if correct is None else correct).mean()))
    return metrics


def evaluate_episodes(model, tokenizer, env, examples: Sequence, *, seed: int) -> dict[str, float]:
    """Greedy episodes on ``examples``: ``eval/accuracy`` (the success rate) and ``eval/episodes/*``."""
    runner = make_runner(model, tokenizer, env, temperature=0.0)
    episodes = runner.run(env_factory(env), list(examples), 1, seed=seed)
    metrics = episode_metrics(episodes)
    judged = "episodes/success_rate" in metrics
    success = metrics["episodes/success_rate"] if judged else sum(e.episode_return > 0 for e in episodes) / len(episodes)
    out = {"eval/accuracy": success, "eval/reward_mean": metrics["episodes/return_mean"]}
    out.update({f"eval/{k}": v for k, v in metrics.items()})
    return out
