"""Multi-turn episodes: a policy and an environment (``lmpo.envs``) → one token-exact record per episode.

One episode, as the sequence the trainer sees::

    prompt_ids      the opening messages rendered by the chat template, generation prompt included
    completion_ids  turn 0 (sampled) | observation 0 (rendered) | turn 1 (sampled) | … | turn K−1 (sampled)
    policy_mask     1 … 1            | 0 … 0                    | 1 … 1            | … | 1 … 1
    logprobs        sampler log-probs on the policy's tokens, 0.0 on the environment's

**Token-exact.** The policy's tokens are kept exactly as sampled, stop token included; they are never decoded
and encoded again. The context of turn k+1 is literally the context of turn k, the tokens of turn k and the
tokens of observation k, so the sequence a trainer computes log-probs on is the one the sampler conditioned on.
Re-rendering the whole conversation instead would not give that: templates that strip ``<think>…</think>``
from earlier assistant turns (Qwen3's, DeepSeek-R1's) and BPE merges across the turn boundary both change the
tokens of earlier turns (the drift reported in verl#6719 and prime-rl#1352).

**Incremental rendering.** Observation k's tokens are what the chat template writes after an assistant turn's
content, up to and including the next generation prompt: the template renders a reference conversation (one
user message, one assistant message holding a marker) with and without the observation messages, and the
text after the marker is the suffix (:meth:`ChatRenderer.observation_ids`). Whatever the template does to
earlier assistant turns does not matter, because the marker turn is the one the suffix follows. The template's
end-of-turn text begins with the stop token the policy already sampled (``<|im_end|>``); that part is dropped
so that the stop token appears once.

**Budgets** (``lmpo.envs.EpisodeBudget``): a turn may sample at most ``max_new_tokens_per_turn`` tokens and
never past ``max_total_tokens`` for the whole sequence; a turn cut by either, an observation that would not
fit, and the ``max_turns``-th turn all end the episode as *truncated*, ``end_reason`` naming the budget. The
truncated tokens the policy sampled keep ``policy_mask`` 1 and their log-probs; ``loss_mask`` equals
``policy_mask`` except that ``mask_truncated=True`` zeroes it for every truncated episode (overlong
filtering, DAPO's choice).

**Bad environments.** An environment whose ``reset``/``step`` raises, returns a malformed result or outlives
``step_timeout_s`` gives an :class:`lmpo.envs.EnvError` naming the environment, the episode and the turn;
with ``on_env_error="truncate"`` the episode ends there instead, truncated with ``end_reason="env_error"``
and the error text in ``Episode.error`` (counted by :func:`episode_metrics`). An environment that never
terminates is cut by ``max_turns``.

>>> runner = EpisodeRunner(HFTurnSampler(model, tokenizer), tokenizer, EpisodeBudget(max_turns=4))
>>> episodes = runner.run("GuessNumber-v0", examples, completions_per_example=4, seed=0)
>>> batch = collate_episodes(episodes, tokenizer.pad_token_id)     # (B, P) prompts, (B, T) completions + masks
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

import torch
from torch import nn

from lmpo.envs.base import (
    OBSERVATION_ROLES,
    OPENING_ROLES,
    EnvError,
    EpisodeBudget,
    LMEnv,
    Message,
    StepResult,
    call_with_timeout,
    check_messages,
    make_env,
)
from lmpo.envs.checker import check_failure, checked_call, expert_budget_problem
from lmpo.errors import InputError
from lmpo.generation.hf import _filter_top_k_top_p, sample_categorical
from lmpo.generation.rollout import eos_token_ids
from lmpo.tasks.base import Example
from lmpo.tasks.chat import render_conversation

#: why an episode ended
END_REASONS = ("terminated", "env_truncated", "max_turns", "max_total_tokens", "max_new_tokens_per_turn", "env_error")
ON_ENV_ERROR = ("raise", "truncate")
#: the end reasons that are the driver's budgets (``EpisodeBudget`` fields of the same names)
_BUDGET_REASONS = ("max_turns", "max_total_tokens", "max_new_tokens_per_turn")


# ----------------------------------------------------------------------------------------------------
# sampling one turn
# ----------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class SampledTurn:
    """One assistant turn as sampled: its token ids (the stop token last, when it stopped), the sampler's
    log-prob of each and whether it ended with a stop token (False: cut by its token limit)."""

    token_ids: list[int]
    logprobs: list[float]
    stopped: bool


class TurnSampler(Protocol):
    """What the driver needs from a generation engine: continue token contexts by one turn each.

    ``sample(contexts, max_new_tokens, generator)`` gets B token-id lists (each the whole episode so far) and a
    per-row token limit, and returns B :class:`SampledTurn`. The contexts must be used exactly as given
    (never decoded and re-encoded). ``stop_token_ids`` end a turn.
    """

    stop_token_ids: Sequence[int]

    def sample(self, contexts: Sequence[Sequence[int]], max_new_tokens: Sequence[int],
               generator: torch.Generator | None = None) -> list[SampledTurn]: ...


class HFTurnSampler:
    """Batched sampling of one turn from a Hugging Face causal LM, given token contexts.

    The B contexts are left-padded into one batch (positions counted from each row's first real token), pre-filled
    once, then decoded one token per step with a key/value cache; a row stops at a stop token or at its own
    limit. Log-probs are ``log softmax(logits / τ)`` at the sampled token (τ = 1 when greedy), the quantity
    ``HFRollout`` records and the trainer's log-probs are taken under.

    Args:
        model, tokenizer: the policy (sampled under ``no_grad`` in eval mode; its mode is restored).
        temperature: τ; 0 means greedy.
        top_p, top_k: nucleus mass (1.0 = off) and top-k (0 = off).
        stop_token_ids: ids that end a turn (default: the tokenizer's and the generation config's EOS).
    """

    def __init__(self, model: nn.Module, tokenizer, temperature: float = 1.0, top_p: float = 1.0, top_k: int = 0,
                 stop_token_ids: Sequence[int] | None = None) -> None:
        if temperature < 0 or not 0.0 < top_p <= 1.0 or top_k < 0:
            raise ValueError(f"need temperature >= 0, 0 < top_p <= 1, top_k >= 0; got {temperature}, {top_p}, {top_k}")
        if tokenizer.pad_token_id is None:
            raise ValueError("tokenizer has no pad token; set tokenizer.pad_token = tokenizer.eos_token")
        self.model, self.tokenizer = model, tokenizer
        self.temperature, self.top_p, self.top_k = temperature, top_p, top_k
        self.stop_token_ids = sorted(stop_token_ids if stop_token_ids is not None else eos_token_ids(tokenizer, model))
        if not self.stop_token_ids:
            raise ValueError("no stop token: give stop_token_ids, or a tokenizer / generation config with an EOS")

    def _next(self, logits: torch.Tensor, generator: torch.Generator | None) -> tuple[torch.Tensor, torch.Tensor]:
        """(B, V) logits → (B,) sampled ids and (B,) their log-probs."""
        if self.temperature == 0:
            scaled = logits.float()
            token = scaled.argmax(-1)
        else:
            scaled = logits.float() / self.temperature
            token = sample_categorical(_filter_top_k_top_p(scaled, self.top_k, self.top_p).softmax(-1), generator)
        return token, scaled.log_softmax(-1).gather(-1, token[:, None]).squeeze(-1)

    def sample(self, contexts: Sequence[Sequence[int]], max_new_tokens: Sequence[int],
               generator: torch.Generator | None = None) -> list[SampledTurn]:
        from transformers import DynamicCache

        if len(contexts) != len(max_new_tokens) or not contexts:
            raise ValueError("sample() needs one max_new_tokens per context and at least one context")
        device = next(self.model.parameters()).device
        B, P = len(contexts), max(len(c) for c in contexts)
        ids = torch.full((B, P), self.tokenizer.pad_token_id, dtype=torch.long)
        mask = torch.zeros((B, P), dtype=torch.long)
        for i, c in enumerate(contexts):
            ids[i, P - len(c):] = torch.tensor(list(c), dtype=torch.long)
            mask[i, P - len(c):] = 1
        ids, mask = ids.to(device), mask.to(device)
        limit = torch.tensor(list(max_new_tokens), device=device)
        stop = torch.tensor(self.stop_token_ids, device=device)
        positions = (mask.cumsum(-1) - 1).clamp(min=0)
        was_training = self.model.training
        self.model.eval()
        tokens, logprobs = [], []
        done = torch.zeros(B, dtype=torch.bool, device=device)
        try:
            with torch.no_grad():
                cache = DynamicCache()
                out = self.model(input_ids=ids, attention_mask=mask, position_ids=positions, past_key_values=cache,
                                 use_cache=True, logits_to_keep=1)
                for step in range(int(limit.max())):
                    token, lp = self._next(out.logits[:, -1], generator)
                    tokens.append(token)
                    logprobs.append(lp)
                    done = done | torch.isin(token, stop) | (limit <= step + 1)
                    if bool(done.all()):
                        break
                    mask = torch.cat([mask, mask.new_ones((B, 1))], dim=1)
                    positions = positions[:, -1:] + 1
                    out = self.model(input_ids=token[:, None], attention_mask=mask, position_ids=positions,
                                     past_key_values=cache, use_cache=True)
        finally:
            self.model.train(was_training)
        token_rows = torch.stack(tokens, 1).tolist()  # (B, steps)
        logprob_rows = torch.stack(logprobs, 1).tolist()
        stop_ids = set(self.stop_token_ids)
        turns = []
        for row, lps, n in zip(token_rows, logprob_rows, max_new_tokens):
            end = next((j + 1 for j, t in enumerate(row[:n]) if t in stop_ids), None)
            length = end if end is not None else min(n, len(row))
            turns.append(SampledTurn(row[:length], lps[:length], stopped=end is not None))
        return turns


# ----------------------------------------------------------------------------------------------------
# incremental rendering
# ----------------------------------------------------------------------------------------------------

#: the content of the reference assistant turn whose end the observation suffix is cut at
_MARKER = "LMPO-END-OF-ASSISTANT-TURN"


class ChatRenderer:
    """Token ids of an episode's opening and of each observation, from the policy's chat template.

    Args:
        tokenizer: the policy's tokenizer.
        chat_template: a template used instead of the tokenizer's own (text).
    Raises:
        InputError: neither the tokenizer nor ``chat_template`` has a template.
    """

    def __init__(self, tokenizer, chat_template: str | None = None) -> None:
        if chat_template is None and not getattr(tokenizer, "chat_template", None):
            raise InputError("multi-turn episodes are rendered with a chat template, and the tokenizer has none; use a "
                             "chat model or pass chat_template (the Jinja text) to the episode runner.")
        self.tokenizer, self.chat_template = tokenizer, chat_template

    def render(self, messages: Sequence[Mapping[str, Any]], add_generation_prompt: bool,
               tools: Sequence[Mapping[str, Any]] | None = None) -> str:
        return render_conversation(self.tokenizer, messages, self.chat_template, add_generation_prompt, tools)

    def opening_ids(self, messages: Sequence[Message], tools: Sequence[Mapping[str, Any]] | None = None) -> list[int]:
        """The opening rendered with the generation prompt, encoded as ``apply_chat_template(tokenize=True)`` would."""
        return list(self.tokenizer(self.render(messages, True, tools))["input_ids"])

    def observation_ids(self, observation: Sequence[Message], stop_token_id: int | None,
                        tools: Sequence[Mapping[str, Any]] | None = None) -> list[int]:
        """The tokens that follow an assistant turn's sampled tokens: the rest of the template's end of that turn,
        the observation messages and the next generation prompt (see the module docstring).

        ``stop_token_id`` is the token the turn ended with; when the template's end-of-turn text starts with it,
        that text is not repeated.
        """
        reference = [{"role": "user", "content": "?"}, {"role": "assistant", "content": _MARKER}]
        text = self.render([*reference, *observation], True, tools)
        if text.count(_MARKER) != 1:
            raise InputError("the chat template does not render an assistant message's content verbatim exactly once, "
                             "so the tokens between turns cannot be rendered incrementally; use a template that "
                             "writes assistant content as it is.")
        suffix = text[text.index(_MARKER) + len(_MARKER):]
        if stop_token_id is not None:
            stop_text = self.tokenizer.decode([stop_token_id])
            if stop_text and suffix.startswith(stop_text):
                suffix = suffix[len(stop_text):]
        return list(self.tokenizer(suffix, add_special_tokens=False)["input_ids"])


# ----------------------------------------------------------------------------------------------------
# episodes
# ----------------------------------------------------------------------------------------------------


@dataclass
class Episode:
    """One episode, token-exact (see the module docstring for the layout).

    ``completion_ids``, ``policy_mask``, ``loss_mask``, ``logprobs`` and ``turn_ids`` have one entry per
    completion token; ``turn_ids`` is the policy turn (0 …) of each sampled token and −1 on environment tokens.
    ``rewards`` and ``infos`` have one entry per turn the environment answered. ``messages`` is the whole
    conversation as text (assistant turns decoded without special tokens), for logs and reward functions.
    """

    env_id: str
    example: Example | None
    seed: int | None
    group: int
    messages: list[Message]
    prompt_ids: list[int]
    completion_ids: list[int] = field(default_factory=list)
    policy_mask: list[int] = field(default_factory=list)
    loss_mask: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    turn_ids: list[int] = field(default_factory=list)
    rewards: list[float] = field(default_factory=list)
    infos: list[dict[str, Any]] = field(default_factory=list)
    terminated: bool = False
    truncated: bool = False
    end_reason: str | None = None
    error: str | None = None

    @property
    def done(self) -> bool:
        return self.end_reason is not None

    @property
    def num_turns(self) -> int:
        """Policy turns sampled (a turn cut by a budget counts)."""
        return max(self.turn_ids, default=-1) + 1

    @property
    def episode_return(self) -> float:
        """The undiscounted sum of the turn rewards."""
        return float(sum(self.rewards))

    def policy_token_ids(self) -> list[int]:
        """The sampled tokens, in order: what the policy generated, and what the trainer trains on."""
        return [t for t, m in zip(self.completion_ids, self.policy_mask) if m]

    def _append(self, ids: Sequence[int], policy: bool, turn: int, logprobs: Sequence[float] | None = None) -> None:
        self.completion_ids.extend(ids)
        self.policy_mask.extend([int(policy)] * len(ids))
        self.loss_mask.extend([int(policy)] * len(ids))
        self.logprobs.extend(logprobs if logprobs is not None else [0.0] * len(ids))
        self.turn_ids.extend([turn if policy else -1] * len(ids))

    def _end(self, reason: str, error: str | None = None) -> None:
        self.end_reason, self.error = reason, error
        self.terminated = reason == "terminated"
        self.truncated = not self.terminated


def _check_step_result(result: Any) -> StepResult:
    if not isinstance(result, tuple) or len(result) != 5:
        raise ValueError(f"step() must return (observation, reward, terminated, truncated, info), got {result!r:.200}")
    observation, reward, terminated, truncated, info = result
    observation = check_messages(observation, OBSERVATION_ROLES, "observation")
    if isinstance(reward, bool) or not isinstance(reward, (int, float)) or not math.isfinite(reward):
        raise ValueError(f"reward must be a finite number, got {reward!r}")
    if not isinstance(terminated, bool) or not isinstance(truncated, bool):
        raise ValueError(f"terminated and truncated must be bools, got {terminated!r} and {truncated!r}")
    if not isinstance(info, dict):
        raise ValueError(f"info must be a dict, got {type(info).__name__}")
    if not (terminated or truncated) and not observation:
        raise ValueError("no observation for an episode that goes on (the policy would speak twice in a row)")
    return StepResult(observation, float(reward), terminated, truncated, info)


class EpisodeRunner:
    """Plays episodes of an environment with a :class:`TurnSampler`, all episodes of a call batched turn by turn.

    Args:
        sampler: the policy (``HFTurnSampler`` or any ``TurnSampler``); None to play only experts.
        tokenizer: the policy's tokenizer (with a chat template, or give ``chat_template``).
        budget: the episode budgets (``lmpo.envs.EpisodeBudget``).
        chat_template: a template used instead of the tokenizer's own.
        mask_truncated: zero the loss mask of truncated episodes.
        on_env_error: ``"raise"`` (an :class:`lmpo.envs.EnvError`) or ``"truncate"`` (end that episode).
        step_timeout_s: wall-clock limit of one ``reset``/``step`` call (None: no limit). A call past it is
            abandoned on its thread; the environment object is not used again.
    """

    def __init__(self, sampler: TurnSampler | None, tokenizer, budget: EpisodeBudget | None = None,
                 chat_template: str | None = None, mask_truncated: bool = False, on_env_error: str = "raise",
                 step_timeout_s: float | None = None) -> None:
        if on_env_error not in ON_ENV_ERROR:
            raise InputError(f"on_env_error={on_env_error!r} must be one of {', '.join(ON_ENV_ERROR)}")
        if step_timeout_s is not None and step_timeout_s <= 0:
            raise InputError(f"step_timeout_s={step_timeout_s} must be positive (or None for no limit)")
        self.sampler, self.tokenizer = sampler, tokenizer
        self.budget = budget or EpisodeBudget()
        self.renderer = ChatRenderer(tokenizer, chat_template)
        self.mask_truncated, self.on_env_error, self.step_timeout_s = mask_truncated, on_env_error, step_timeout_s

    def _env_failed(self, episode: Episode, index: int, turn: int | None, what: str, error: BaseException) -> None:
        where = "reset" if turn is None else f"turn {turn}"
        detail = " ".join(str(error).split())[:500]
        message = (f"environment {episode.env_id or '?'} failed at {where} of episode {index} "
                   f"(seed {episode.seed}): {what}: {type(error).__name__}: {detail}")
        if self.on_env_error == "raise":
            if isinstance(error, TimeoutError):
                fix = (f"Find why it hangs, or raise `env.step_timeout_s` (now {self.step_timeout_s:g} s; "
                       "EpisodeRunner(step_timeout_s=...))")
            else:
                fix = "Fix the environment (lmpo.envs.check_env finds most such faults)"
            raise EnvError(f"{message}. {fix}, or set `env.on_env_error: truncate` (EpisodeRunner(on_env_error="
                           "'truncate')) to end such episodes as truncated, counted in episodes/end_env_error."
                           ) from error
        episode._end("env_error", message)

    def run(self, env: str | Callable[[], LMEnv], examples: Sequence[Example | None], completions_per_example: int = 1,
            seed: int = 0, generator: torch.Generator | None = None, expert: bool = False) -> list[Episode]:
        """Play ``completions_per_example`` episodes of every example; returns them example-major
        (episode ``i·G + g`` is example i's g-th, ``Episode.group`` = i).

        ``env`` is a registered id or a factory returning a fresh environment (one per episode). The G episodes of
        an example reset with the same seed, ``seed + i``, so that an environment drawing its own problem
        (``example=None``) gives the whole group the same one.

        ``expert=True`` plays the environment's ``expert_action()`` instead of sampling (demonstrations for a
        supervised warm-up): each turn is the expert's text encoded once and followed by the sampler's first stop
        token (the tokenizer's EOS without a sampler), with log-prob 0, through the same budgets and rendering.
        """
        if completions_per_example < 1 or not examples:
            raise InputError("run() needs at least one example and completions_per_example >= 1")
        if not expert and self.sampler is None:
            raise InputError("EpisodeRunner has no sampler: give one, or play the environment's expert (expert=True)")
        factory = (lambda: make_env(env)) if isinstance(env, str) else env
        envs, episodes = [], []
        try:
            for i, example in enumerate(examples):
                for _ in range(completions_per_example):
                    e = factory()
                    envs.append(e)
                    episodes.append(Episode(env_id=e.env_id or type(e).__name__, example=example, seed=seed + i,
                                            group=i, messages=[], prompt_ids=[]))
                    self._reset(e, episodes[-1], len(episodes) - 1)
            self._play(envs, episodes, generator, expert)
        finally:
            for e in envs:
                try:
                    e.close()
                except Exception:  # noqa: BLE001 - closing is best effort; the episodes are already recorded
                    pass
        if self.mask_truncated:
            for episode in episodes:
                if episode.truncated:
                    episode.loss_mask = [0] * len(episode.loss_mask)
        return episodes

    def _reset(self, env: LMEnv, episode: Episode, index: int) -> None:
        try:
            result = call_with_timeout(lambda: env.reset(episode.example, seed=episode.seed), self.step_timeout_s)
            if not isinstance(result, tuple) or len(result) != 2:
                raise ValueError(f"reset() must return (messages, info), got {result!r:.200}")
            opening = check_messages(result[0], OPENING_ROLES, "opening messages")
            if not opening:
                raise ValueError("reset() returned no opening messages")
        except Exception as e:  # noqa: BLE001 - every failure of the environment is reported the same way
            self._env_failed(episode, index, None, "reset() failed or returned a malformed opening", e)
            return
        episode.messages = opening
        episode.prompt_ids = self.renderer.opening_ids(opening, env.tool_schemas)
        if len(episode.prompt_ids) >= self.budget.max_total_tokens:
            raise InputError(f"the opening of environment {episode.env_id} (episode {index}) is "
                             f"{len(episode.prompt_ids)} tokens, which leaves no room within budget.max_total_tokens="
                             f"{self.budget.max_total_tokens}; raise max_total_tokens or shorten the prompt.")

    def _expert_turn(self, env: LMEnv, limit: int) -> SampledTurn:
        stop = self.sampler.stop_token_ids[0] if self.sampler is not None else self.tokenizer.eos_token_id
        ids = list(self.tokenizer(env.expert_action(), add_special_tokens=False)["input_ids"]) + [stop]
        return SampledTurn(ids[:limit], [0.0] * min(len(ids), limit), stopped=len(ids) <= limit)

    def _play(self, envs: list[LMEnv], episodes: list[Episode], generator: torch.Generator | None,
              expert: bool = False) -> None:
        budget = self.budget
        while True:
            active = [i for i, ep in enumerate(episodes) if not ep.done]
            if not active:
                return
            contexts = [episodes[i].prompt_ids + episodes[i].completion_ids for i in active]
            limits = [min(budget.max_new_tokens_per_turn, budget.max_total_tokens - len(c)) for c in contexts]
            if expert:
                turns = [self._expert_turn(envs[i], n) for i, n in zip(active, limits)]
            else:
                turns = self.sampler.sample(contexts, limits, generator)
            if len(turns) != len(active):
                raise RuntimeError(f"the sampler returned {len(turns)} turns for {len(active)} contexts")
            for i, turn, limit in zip(active, turns, limits):
                self._advance(envs[i], episodes[i], i, turn, limit)

    def _advance(self, env: LMEnv, episode: Episode, index: int, turn: SampledTurn, limit: int) -> None:
        budget = self.budget
        k = episode.num_turns
        if len(turn.token_ids) > limit or len(turn.logprobs) != len(turn.token_ids):
            raise RuntimeError(f"the sampler returned {len(turn.token_ids)} tokens and {len(turn.logprobs)} log-probs "
                               f"for a turn limited to {limit} tokens")
        episode._append(turn.token_ids, True, k, turn.logprobs)
        text = self.tokenizer.decode(turn.token_ids, skip_special_tokens=True)
        episode.messages.append({"role": "assistant", "content": text})
        if not turn.stopped:  # an unfinished turn is not an action: the environment never sees it
            per_turn = limit == budget.max_new_tokens_per_turn
            episode._end("max_new_tokens_per_turn" if per_turn else "max_total_tokens")
            return
        try:
            result = _check_step_result(call_with_timeout(lambda: env.step(text), self.step_timeout_s))
        except Exception as e:  # noqa: BLE001 - every failure of the environment is reported the same way
            self._env_failed(episode, index, k, "step() failed or returned a malformed result", e)
            return
        episode.rewards.append(result.reward)
        episode.infos.append(result.info)
        if result.terminated or result.truncated:
            episode.messages.extend(result.observation)
            episode._end("terminated" if result.terminated else "env_truncated")
            return
        if k + 1 >= budget.max_turns:
            episode.messages.extend(result.observation)
            episode._end("max_turns")
            return
        observation_ids = self.renderer.observation_ids(result.observation, turn.token_ids[-1], env.tool_schemas)
        if len(episode.prompt_ids) + len(episode.completion_ids) + len(observation_ids) >= budget.max_total_tokens:
            episode.messages.extend(result.observation)
            episode._end("max_total_tokens")
            return
        episode._append(observation_ids, False, k)
        episode.messages.extend(result.observation)


def run_episodes(sampler: TurnSampler | None, tokenizer, env: str | Callable[[], LMEnv], examples: Sequence[Example | None],
                 completions_per_example: int = 1, budget: EpisodeBudget | None = None, seed: int = 0,
                 generator: torch.Generator | None = None, expert: bool = False,
                 **runner_options: Any) -> list[Episode]:
    """``EpisodeRunner(sampler, tokenizer, budget, **runner_options).run(env, examples, …)`` in one call.

    With ``expert=True`` a demonstration that a budget cut is no demonstration of the expert: a warning names
    the budget field and how many episodes it cut (:func:`check_expert_budget` says how many
    tokens the expert needed)."""
    runner = EpisodeRunner(sampler, tokenizer, budget, **runner_options)
    episodes = runner.run(env, examples, completions_per_example, seed=seed, generator=generator, expert=expert)
    if expert:
        cut = [e.end_reason for e in episodes if e.end_reason in _BUDGET_REASONS]
        for reason in sorted(set(cut)):
            warnings.warn(f"{cut.count(reason)} of {len(episodes)} expert episodes were cut by the budget's "
                          f"{reason} = {getattr(runner.budget, reason)}: raise it, or they demonstrate cut-off "
                          "turns", stacklevel=2)
    return episodes


# ----------------------------------------------------------------------------------------------------
# batches and metrics
# ----------------------------------------------------------------------------------------------------


@dataclass
class EpisodeBatch:
    """B episodes as padded tensors, the layout of ``lmpo.generation.Rollout`` plus the multi-turn masks.

    prompt_ids:      (B, P) long, left-padded with the pad token.
    prompt_mask:     (B, P) long, 1 on real prompt tokens.
    completion_ids:  (B, T) long, right-padded: policy turns and observations.
    attention_mask:  (B, T) long, 1 on every real completion token (policy and environment).
    policy_mask:     (B, T) long, 1 on the tokens the policy sampled.
    loss_mask:       (B, T) long, ``policy_mask`` (zeroed for truncated episodes with ``mask_truncated``).
    logprobs:        (B, T) float32, the sampler's log-probs on policy tokens, 0 elsewhere.
    turn_ids:        (B, T) long, the policy turn of each token, −1 on environment tokens and padding.
    returns:         (B,) float32, each episode's return (the sum of its turn rewards).
    group_ids:       (B,) long, the example each episode played (the advantage groups).
    truncated:       (B,) bool.
    num_turns:       (B,) long.
    turn_rewards:    (B, K) float32, the reward of each policy turn (0 for a turn the environment never answered,
                     and at padding), K the most turns of an episode.
    turn_mask:       (B, K) long, 1 on the episode's turns.
    """

    prompt_ids: torch.Tensor
    prompt_mask: torch.Tensor
    completion_ids: torch.Tensor
    attention_mask: torch.Tensor
    policy_mask: torch.Tensor
    loss_mask: torch.Tensor
    logprobs: torch.Tensor
    turn_ids: torch.Tensor
    returns: torch.Tensor
    group_ids: torch.Tensor
    truncated: torch.Tensor
    num_turns: torch.Tensor
    turn_rewards: torch.Tensor
    turn_mask: torch.Tensor

    @property
    def input_ids(self) -> torch.Tensor:
        """(B, P + T) the input of the training forward."""
        return torch.cat([self.prompt_ids, self.completion_ids], dim=1)

    @property
    def full_attention_mask(self) -> torch.Tensor:
        """(B, P + T) mask of real tokens."""
        return torch.cat([self.prompt_mask, self.attention_mask], dim=1)

    def __len__(self) -> int:
        return self.completion_ids.shape[0]


def collate_episodes(episodes: Sequence[Episode], pad_token_id: int) -> EpisodeBatch:
    """Pad episodes into an :class:`EpisodeBatch`; group ids renumbered 0 … in order of first appearance."""
    if not episodes:
        raise ValueError("collate_episodes needs at least one episode")
    B = len(episodes)
    P = max(len(e.prompt_ids) for e in episodes)
    T = max(1, max(len(e.completion_ids) for e in episodes))
    prompt_ids = torch.full((B, P), pad_token_id, dtype=torch.long)
    prompt_mask = torch.zeros((B, P), dtype=torch.long)
    completion_ids = torch.full((B, T), pad_token_id, dtype=torch.long)
    attention_mask, policy_mask, loss_mask = (torch.zeros((B, T), dtype=torch.long) for _ in range(3))
    logprobs = torch.zeros((B, T), dtype=torch.float32)
    turn_ids = torch.full((B, T), -1, dtype=torch.long)
    K = max(1, max(e.num_turns for e in episodes))
    turn_rewards = torch.zeros((B, K), dtype=torch.float32)
    turn_mask = torch.zeros((B, K), dtype=torch.long)
    groups: dict[int, int] = {}
    for b, e in enumerate(episodes):
        turn_mask[b, : e.num_turns] = 1
        if e.rewards:
            turn_rewards[b, : len(e.rewards)] = torch.tensor(e.rewards, dtype=torch.float32)
        n, m = len(e.prompt_ids), len(e.completion_ids)
        prompt_ids[b, P - n:] = torch.tensor(e.prompt_ids, dtype=torch.long)
        prompt_mask[b, P - n:] = 1
        if m:
            completion_ids[b, :m] = torch.tensor(e.completion_ids, dtype=torch.long)
            attention_mask[b, :m] = 1
            policy_mask[b, :m] = torch.tensor(e.policy_mask, dtype=torch.long)
            loss_mask[b, :m] = torch.tensor(e.loss_mask, dtype=torch.long)
            logprobs[b, :m] = torch.tensor(e.logprobs, dtype=torch.float32)
            turn_ids[b, :m] = torch.tensor(e.turn_ids, dtype=torch.long)
        groups.setdefault(e.group, len(groups))
    return EpisodeBatch(
        prompt_ids=prompt_ids, prompt_mask=prompt_mask, completion_ids=completion_ids, attention_mask=attention_mask,
        policy_mask=policy_mask, loss_mask=loss_mask, logprobs=logprobs, turn_ids=turn_ids,
        returns=torch.tensor([e.episode_return for e in episodes], dtype=torch.float32),
        group_ids=torch.tensor([groups[e.group] for e in episodes], dtype=torch.long),
        truncated=torch.tensor([e.truncated for e in episodes], dtype=torch.bool),
        num_turns=torch.tensor([e.num_turns for e in episodes], dtype=torch.long),
        turn_rewards=turn_rewards, turn_mask=turn_mask,
    )


def turn_returns(turn_rewards: torch.Tensor, turn_mask: torch.Tensor, gamma: float = 1.0) -> torch.Tensor:
    """Discounted returns-to-go over an episode's turns: ``G_k = Σ_{j ≥ k} γ^{j−k} r_j``, 0 at padding.

    turn_rewards: (B, K) float, turn_mask: (B, K) 0/1 with each row's ones first (``EpisodeBatch``'s).
    Returns (B, K) float32. γ = 1 gives the undiscounted return-to-go, and ``G_0`` the episode return.
    Naive equivalent: ``G[b, k] = sum(gamma ** (j - k) * r[b, j] for j in range(k, n_b))``, n_b = row b's turns.
    The loop runs over turns (K ≤ ``max_turns``), not tokens.
    """
    if not 0.0 <= gamma <= 1.0:
        raise ValueError(f"gamma={gamma} must be in [0, 1]")
    rewards = turn_rewards.float() * turn_mask
    returns = torch.zeros_like(rewards)
    running = torch.zeros_like(rewards[:, 0])
    for k in range(rewards.shape[1] - 1, -1, -1):
        running = rewards[:, k] + gamma * running
        returns[:, k] = running
    return returns * turn_mask


def per_turn_to_tokens(values: torch.Tensor, turn_ids: torch.Tensor) -> torch.Tensor:
    """(B, K) per-turn values spread over the tokens of each turn: (B, T), 0 on environment tokens and padding
    (``turn_ids`` −1). With ``turn_returns`` it gives per-token advantages of turn-level credit."""
    gathered = values.gather(1, turn_ids.clamp(min=0))
    return gathered.masked_fill(turn_ids < 0, 0.0)


def episode_metrics(episodes: Sequence[Episode]) -> dict[str, float]:
    """Means over episodes, keys ``episodes/<name>``: return, turns, policy and environment tokens, truncated
    fraction, the fraction ending for each reason (``episodes/end_<reason>``), tool calls per episode and the
    fraction of them that ran without error (``episodes/tool_call_valid_rate``, from ``ToolEnv``'s info), and
    the fraction of episodes with a turn whose ``info["correct"]`` is true (``episodes/success_rate``; present
    when any episode's environment reports ``correct``; episodes cut before an answer count as failures)."""
    if not episodes:
        return {}
    n = len(episodes)
    out = {
        "episodes/return_mean": sum(e.episode_return for e in episodes) / n,
        "episodes/turns_mean": sum(e.num_turns for e in episodes) / n,
        "episodes/policy_tokens_mean": sum(sum(e.policy_mask) for e in episodes) / n,
        "episodes/env_tokens_mean": sum(len(e.policy_mask) - sum(e.policy_mask) for e in episodes) / n,
        "episodes/truncated_fraction": sum(e.truncated for e in episodes) / n,
    }
    for reason in END_REASONS:
        out[f"episodes/end_{reason}"] = sum(e.end_reason == reason for e in episodes) / n
    calls = sum(i.get("tool_calls", 0) for e in episodes for i in e.infos)
    errors = sum(i.get("tool_errors", 0) for e in episodes for i in e.infos)
    out["episodes/tool_calls_mean"] = calls / n
    if calls:
        out["episodes/tool_call_valid_rate"] = (calls - errors) / calls
    if any("correct" in i for e in episodes for i in e.infos):  # the environment judges answers: over every
        # episode, so that one cut before it answered counts as a failure
        out["episodes/success_rate"] = sum(any(i.get("correct") for i in e.infos) for e in episodes) / n
    return out


# ----------------------------------------------------------------------------------------------------
# Experts under a budget (check an environment as a warm-up will play it)
# ----------------------------------------------------------------------------------------------------


class _Unclosed:
    """The environment under check as the episode driver sees it, except that the driver's ``close`` after its
    episode does not close it (the caller goes on with it)."""

    def __init__(self, env: LMEnv) -> None:
        self.env = env

    def expert_action(self) -> str:
        return checked_call(self.env, "expert_action()", self.env.expert_action)

    def close(self) -> None:
        pass

    def __getattr__(self, name: str):
        return getattr(self.env, name)


def play_expert(runner: EpisodeRunner, factory: Callable[[], LMEnv], example: Example | None, seed: int):
    """One expert episode of ``factory()``'s environment through ``runner``: the episode and the tokens each expert
    turn needed (its text and the stop token), which the budget may have cut."""
    texts: list[str] = []

    def recording():
        env = factory()
        expert = env.expert_action
        env.expert_action = lambda: texts.append(expert()) or texts[-1]
        return env

    episode = runner.run(recording, [example], 1, seed=seed, expert=True)[0]
    needed = [len(runner.tokenizer(t, add_special_tokens=False)["input_ids"]) + 1 for t in texts]
    return episode, needed


def check_expert_budget(env: LMEnv, examples: Sequence[Example | None], budget: EpisodeBudget, tokenizer, *,
                        chat_template: str | None = None, seed: int = 0) -> None:
    """Play ``env``'s expert on every example through the episode driver under ``budget`` and the tokenizer's chat
    template (or ``chat_template``), as a supervised warm-up does; raise :class:`lmpo.envs.EnvCheckError` naming
    the budget field that cuts it, its value and what the expert needed (``budget.max_new_tokens_per_turn`` = 96
    (it needs 104 tokens)), or the expert's failure. ``lmpo.envs.check_env`` checks the rest of the protocol."""
    runner = EpisodeRunner(None, tokenizer, budget, chat_template=chat_template, on_env_error="truncate")
    for example in examples:
        episode, needed = play_expert(runner, lambda: _Unclosed(env), example, seed)
        problem = expert_budget_problem(episode, budget, needed)
        if problem is not None:
            raise check_failure(env, problem)
