"""The sampling stage of an RL step: its prompts, their completions (or episodes), scored.

    collect(...)   one RL step's ``Collected``: one draw, DAPO dynamic sampling's draws, or multi-turn episodes
    draw(...)      one draw: the next ``prompts_per_step`` prompts, G completions each, scored
    play(...)      multi-turn (``env.id``): G episodes of each of the next ``prompts_per_step`` examples, scored

``Trainer.sample`` calls ``collect`` with its parts. Every draw is seeded from ``(loop.seed, step, 1[, k])``, so
the completions do not depend on what ran before (a resumed run samples what the uninterrupted one did).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass

import torch

from lmpo.trainer.config import TrainConfig
from lmpo.trainer.step import multiturn, stages
from lmpo.trainer.step.pipeline import AsyncPipeline
from lmpo.trainer.step.sampling import PromptOrder, ScoredRollout, dynamic_sample, seed_for


@dataclass
class Collected:
    """One RL step's samples.

    scored: examples, rollout (B = P·G rows, prompt-major: row b belongs to prompt b // G), rewards (B,),
        per-function scores and correctness.
    stats: DAPO dynamic sampling's ``rollout/*`` counts, or the ``episodes/*`` metrics and the truncated
        fraction; else empty.
    generate_s: seconds spent generating (scoring not included).
    played: multi-turn only: the episodes' batch to train on and their per-turn rewards.
    """

    scored: ScoredRollout
    stats: dict[str, float]
    generate_s: float
    played: multiturn.PlayedStep | None = None


def collect(cfg: TrainConfig, step: int, *, prompts: PromptOrder, engine, pipeline: AsyncPipeline | None,
            scorer, accuracy_fn: Callable, tokenizer, device: torch.device,
            runner: multiturn.EpisodeRunner | None = None) -> Collected:
    """RL step ``step``'s scored samples from the ``engine`` (or the async ``pipeline``'s worker when there is
    one), with DAPO dynamic sampling under ``rollout.dynamic_sampling``; episodes of ``runner`` under
    ``env.id``."""
    if cfg.env.id is not None:
        return play(cfg, step, prompts=prompts, runner=runner, pipeline=pipeline, tokenizer=tokenizer, device=device)
    ro, seconds = cfg.rollout, []

    def one(k: int) -> ScoredRollout:
        scored, generate_s = draw(cfg, step, k, prompts=prompts, engine=engine, pipeline=pipeline, scorer=scorer,
                                  accuracy_fn=accuracy_fn, device=device)
        seconds.append(generate_s)
        return scored

    if not ro.dynamic_sampling:
        return Collected(one(0), {}, sum(seconds))
    scored, stats = dynamic_sample(one, cfg.loop.prompts_per_step, ro.completions_per_prompt,
                                   metric=ro.dynamic_sampling_metric, max_draws=ro.dynamic_sampling_max_draws,
                                   pad_token_id=tokenizer.pad_token_id)
    return Collected(scored, stats, sum(seconds))


def draw(cfg: TrainConfig, step: int, k: int, *, prompts: PromptOrder, engine, pipeline: AsyncPipeline | None,
         scorer, accuracy_fn: Callable, device: torch.device) -> tuple[ScoredRollout, float]:
    """Draw ``k`` of RL step ``step``, scored, and the seconds its generation took."""
    t = time.perf_counter()
    if pipeline is not None:  # sampled by the worker with the weights of step − 1 − k (same seed)
        examples, ro = pipeline.rollout(step)  # (CPU tensors: the stages move what they use)
    else:
        examples = prompts.take(cfg.loop.prompts_per_step)
        seed = seed_for(cfg.loop.seed, step, 1) if k == 0 else seed_for(cfg.loop.seed, step, 1, k)
        # (no inference_mode: the sampled ids become inputs of the training graph)
        with stages.autocast(cfg.loop.autocast, device):
            ro = engine.generate([e.prompt for e in examples], cfg.rollout.completions_per_prompt, seed=seed)
    generate_s = time.perf_counter() - t
    rw = cfg.rewards
    scored = stages.score(scorer, accuracy_fn, examples, ro, success_threshold=rw.success_threshold, device=device,
                          max_new_tokens=cfg.rollout.max_new_tokens, overlong_buffer_len=rw.overlong_buffer_len,
                          overlong_penalty_factor=rw.overlong_penalty_factor)
    return scored, generate_s


def play(cfg: TrainConfig, step: int, *, prompts: PromptOrder, runner: multiturn.EpisodeRunner, tokenizer,
         device: torch.device, pipeline: AsyncPipeline | None = None) -> Collected:
    """Multi-turn (``env.id``): G episodes of each of the next ``prompts_per_step`` examples, scored by their
    returns (``lmpo.trainer.step.multiturn.play_step``), played here or by the async ``pipeline``'s worker; under
    ``rollout.dynamic_sampling``, as many draws of ``prompts_per_step`` examples as it takes to fill the step with
    groups whose returns differ (the ``episodes/*`` metrics then describe every episode played, the kept and the
    dropped)."""
    ro, G, seconds, played_all = cfg.rollout, cfg.rollout.completions_per_prompt, [], []

    def one(k: int) -> ScoredRollout:
        examples = prompts.take(cfg.loop.prompts_per_step)
        # (AsyncPipeline's requests carry the first draw's two seeds)
        seed = seed_for(cfg.loop.seed, step, 1) if k == 0 else seed_for(cfg.loop.seed, step, 1, k)
        t = time.perf_counter()
        with stages.autocast(cfg.loop.autocast, device):
            played = multiturn.play_step(runner, cfg.env, examples, G, seed=seed % 2**31,
                                        generator=torch.Generator(device).manual_seed(seed), tokenizer=tokenizer,
                                        device=device)
        seconds.append(time.perf_counter() - t)
        played_all.append(played)
        return played.scored

    if pipeline is not None:  # played by the worker with the weights of step − 1 − k (the same seeds)
        t = time.perf_counter()
        examples, episodes = pipeline.episodes(step)
        played, draw_stats = multiturn.score_episodes(episodes, examples, tokenizer, device), {}
        seconds.append(time.perf_counter() - t)
    elif not ro.dynamic_sampling:
        one(0)
        played, draw_stats = played_all[0], {}
    else:
        scored, draw_stats = dynamic_sample(one, cfg.loop.prompts_per_step, G, metric=ro.dynamic_sampling_metric,
                                            max_draws=ro.dynamic_sampling_max_draws,
                                            pad_token_id=tokenizer.pad_token_id)
        played = multiturn.score_episodes(scored.episodes, scored.examples, tokenizer, device)
        played.metrics = multiturn.step_metrics([e for p in played_all for e in p.episodes])
    # a truncated episode is one cut by a budget, whether or not it sampled a stop (this replaces the
    # single-turn count of ``stages.rollout_stats``: the step's stats are updated with these)
    stats = {**played.metrics, **draw_stats,
             "completion/truncated_frac": played.scored.rollout.truncated.float().mean()}
    return Collected(played.scored, stats, sum(seconds), played)
