"""Multi-turn training: the ``env`` config section and the trainer's episode stage.

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

import torch

from lmpo.config import ConfigError, flat_aliases
from lmpo.config import option as _f
from lmpo.envs import ENVS, EpisodeBudget, LMEnv, make_env
from lmpo.envs.base import is_registered, unknown_env_message
from lmpo.envs.plugins import import_env_modules
from lmpo.envs.tools.sandbox import set_default_require
from lmpo.errors import InputError
from lmpo.generation import Rollout, RolloutBatch
from lmpo.generation.episodes import (
    ON_ENV_ERROR,
    Episode,
    EpisodeBatch,
    EpisodeRunner,
    HFTurnSampler,
    collate_episodes,
    episode_metrics,
    per_turn_to_tokens,
    turn_returns,
)
from lmpo.trainer.sampling import ScoredRollout

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
    """Played episodes (G per example, example-major) as a step: ``play_step``'s scoring, without the playing."""
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
