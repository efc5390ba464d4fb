"""What every generation engine returns (``Rollout``) and the protocol the trainer drives it through."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, fields, replace
from typing import Protocol, runtime_checkable

import torch
from torch import nn


@dataclass
class Rollout:
    """A batch of B = N·G sequences: N prompts, each repeated for its G completions (rows ``i·G … i·G+G−1``).

    prompt_ids:      (B, P) long, left-padded with the pad token.
    prompt_mask:     (B, P) long, 1 on real prompt tokens.
    completion_ids:  (B, T) long, right-padded with the pad token after EOS.
    completion_mask: (B, T) long, 1 up to and including the first EOS, 0 after it.
    group_ids:       (B,) long, the prompt's index in this batch (0 … N−1): the advantage groups.
    prompts:         B prompt strings (repeated G times each).
    completions:     B completion strings, decoded without special tokens.
    truncated:       (B,) bool, True where no EOS was produced within ``max_new_tokens``.
    logprobs:        (B, T) float32 or None: the sampler's log-probability of each sampled token under
                     ``log softmax(logits / τ)`` — the distribution the trainer's log-probs are taken under —
                     0 at padding; recorded on request (the rollout log-probs of mismatch corrections).
    """

    prompt_ids: torch.Tensor
    prompt_mask: torch.Tensor
    completion_ids: torch.Tensor
    completion_mask: torch.Tensor
    group_ids: torch.Tensor
    prompts: list[str]
    completions: list[str]
    truncated: torch.Tensor
    logprobs: torch.Tensor | None = None

    @property
    def input_ids(self) -> torch.Tensor:
        """(B, P + T) prompt followed by completion: the input of the training forward."""
        return torch.cat([self.prompt_ids, self.completion_ids], dim=1)

    @property
    def attention_mask(self) -> torch.Tensor:
        """(B, P + T) mask of real tokens."""
        return torch.cat([self.prompt_mask, self.completion_mask], dim=1)

    @property
    def completion_lengths(self) -> torch.Tensor:
        """(B,) long, tokens per completion including EOS."""
        return self.completion_mask.sum(-1)

    def __len__(self) -> int:
        return self.completion_ids.shape[0]


@dataclass(frozen=True)
class RolloutBatch:
    """The B sequences one RL step trains on, as tensors on the training device; every stage after scoring reads
    one and returns a new one (``with_``), none adds keys or writes into it.

    input_ids:      (B, P + T) long, prompt then completion (``Rollout.input_ids``).
    attention_mask: (B, P + T) long, 1 on real tokens.
    completion_ids: (B, T) long, the sampled tokens whose log-probs are trained.
    loss_mask:      (B, T) bool, the completion tokens the loss counts (0 on padding and on masked rows, e.g.
                    truncated completions under ``mask_truncated_completions``).
    advantages:     (B,) float, or None before the advantage stage (the lab's log-prob-only batches).
    old_logp:       (B, T) behaviour log-probs (no gradient), or None: on-policy, the update's own forward is
                    the behaviour policy.
    ref_logp:       (B, T) reference-model log-probs, or None when nothing asks for a reference.
    rollout_logp:   (B, T) the sampler's log-probs (``Rollout.logprobs``), or None when the engine recorded none.

    Optional fields are None when absent, and are tested that one way (``batch.ref_logp is None``).
    """

    input_ids: torch.Tensor
    attention_mask: torch.Tensor
    completion_ids: torch.Tensor
    loss_mask: torch.Tensor
    advantages: torch.Tensor | None = None
    old_logp: torch.Tensor | None = None
    ref_logp: torch.Tensor | None = None
    rollout_logp: torch.Tensor | None = None

    @classmethod
    def from_rollout(cls, rollout: Rollout, device: torch.device | str | None = None) -> RolloutBatch:
        """A rollout's sequences (loss mask = completion mask, ``rollout_logp`` = its log-probs) on ``device``."""
        return cls(input_ids=rollout.input_ids.to(device), attention_mask=rollout.attention_mask.to(device),
                   completion_ids=rollout.completion_ids.to(device),
                   loss_mask=rollout.completion_mask.to(device).bool(),
                   rollout_logp=rollout.logprobs.to(device) if rollout.logprobs is not None else None)

    def __len__(self) -> int:
        return self.completion_ids.shape[0]

    def select(self, rows: torch.Tensor) -> RolloutBatch:
        """The batch's ``rows`` ((K,) long index on the batch's device), every tensor field alike."""
        return RolloutBatch(**{f.name: None if getattr(self, f.name) is None else getattr(self, f.name)[rows]
                               for f in fields(self)})

    def with_(self, **changes: torch.Tensor | None) -> RolloutBatch:
        """A copy with ``changes`` (field name → tensor); the batch itself is never written."""
        return replace(self, **changes)


@runtime_checkable
class RolloutEngine(Protocol):
    """What the trainer needs from a generation engine.

    ``generate`` returns N·G completions for N prompts, G each, as a ``Rollout``; ``sync_weights`` is
    called by the trainer after its optimizer steps, before the next ``generate``, so that an engine holding
    its own copy of the weights (vLLM) can refresh it (an engine that samples from the training model's own
    parameters does nothing).
    """

    def generate(
        self,
        prompts: Sequence[str],
        completions_per_prompt: int = 1,
        seed: int | None = None,
        generator: torch.Generator | None = None,
        greedy: bool = False,
    ) -> Rollout: ...

    def sync_weights(self, model: nn.Module) -> None: ...


def eos_token_ids(tokenizer, model) -> set[int]:
    """Every id that ends a completion: the tokenizer's EOS and those of the model's generation config."""
    eos = {tokenizer.eos_token_id} if tokenizer.eos_token_id is not None else set()
    gen_eos = getattr(getattr(model, "generation_config", None), "eos_token_id", None)
    if isinstance(gen_eos, int):
        eos.add(gen_eos)
    elif gen_eos is not None:
        eos.update(gen_eos)
    return eos


def completion_mask(completion_ids: torch.Tensor, eos_ids: Sequence[int], ignore_eos: bool = False) -> torch.Tensor:
    """(B, T) long: 1 up to and including the first EOS, 0 after it (all 1 with ``ignore_eos``)."""
    if ignore_eos:
        return torch.ones_like(completion_ids)
    is_eos = torch.isin(completion_ids, torch.tensor(list(eos_ids), device=completion_ids.device))
    # eos seen strictly before position t  <=>  cumsum up to t minus is_eos[t] > 0
    seen_before = (is_eos.long().cumsum(-1) - is_eos.long()) > 0
    return (~seen_before).long()


class SamplingEngine:
    """What every engine shares: its sampling settings (validated here, ValueError naming the bad one) and the
    token ids that end a completion."""

    def __init__(self, model: nn.Module, tokenizer, max_new_tokens: int, temperature: float, top_p: float,
                 top_k: int, ignore_eos: bool, record_logprobs: bool) -> None:
        if max_new_tokens < 1:
            raise ValueError(f"max_new_tokens={max_new_tokens} must be >= 1")
        if temperature < 0:
            raise ValueError(f"temperature={temperature} must be >= 0 (0 = greedy)")
        if not 0.0 < top_p <= 1.0:
            raise ValueError(f"top_p={top_p} must be in (0, 1]")
        if top_k < 0:
            raise ValueError(f"top_k={top_k} must be >= 0 (0 = off)")
        if tokenizer.pad_token_id is None:
            raise ValueError("tokenizer has no pad token; set tokenizer.pad_token = tokenizer.eos_token")
        eos = eos_token_ids(tokenizer, model)
        if not eos:
            raise ValueError("neither the tokenizer nor the model's generation_config defines an EOS token")
        self.model, self.tokenizer = model, tokenizer
        self.max_new_tokens, self.temperature, self.top_p, self.top_k = max_new_tokens, temperature, top_p, top_k
        self.ignore_eos, self.record_logprobs = ignore_eos, record_logprobs
        self.eos_token_ids = sorted(eos)

    @staticmethod
    def check_request(prompts: Sequence[str], completions_per_prompt: int) -> None:
        if completions_per_prompt < 1:
            raise ValueError(f"completions_per_prompt={completions_per_prompt} must be >= 1")
        if not prompts:
            raise ValueError("generate() needs at least one prompt")


def select_rows(rollout: Rollout, rows: torch.Tensor) -> Rollout:
    """The rollout's ``rows`` (a (K,) long index), group ids renumbered 0 … in order of first appearance.

    Select whole groups (all G rows of a prompt, in order) to keep the ``i·G … i·G+G−1`` layout.
    """
    rows = rows.to(rollout.completion_ids.device)
    group = rollout.group_ids[rows]
    _, first = torch.unique_consecutive(group, return_inverse=True)
    listed = rows.tolist()
    return Rollout(
        prompt_ids=rollout.prompt_ids[rows], prompt_mask=rollout.prompt_mask[rows],
        completion_ids=rollout.completion_ids[rows], completion_mask=rollout.completion_mask[rows],
        group_ids=first.to(rollout.group_ids.dtype),
        prompts=[rollout.prompts[i] for i in listed], completions=[rollout.completions[i] for i in listed],
        truncated=rollout.truncated[rows.to(rollout.truncated.device)],
        logprobs=rollout.logprobs[rows] if rollout.logprobs is not None else None,
    )


def concat_rollouts(rollouts: Sequence[Rollout], pad_token_id: int) -> Rollout:
    """One rollout of several, in order: prompts re-padded on the left and completions on the right to the widest
    (pad ``pad_token_id``, mask 0, log-prob 0), group ids offset so that groups stay distinct. Log-probs are kept
    only when every part has them."""
    if not rollouts:
        raise ValueError("concat_rollouts needs at least one rollout")
    if len(rollouts) == 1:
        return rollouts[0]
    P = max(r.prompt_ids.shape[1] for r in rollouts)
    T = max(r.completion_ids.shape[1] for r in rollouts)

    def left(x: torch.Tensor, width: int, value: float) -> torch.Tensor:
        return torch.nn.functional.pad(x, (width - x.shape[1], 0), value=value)

    def right(x: torch.Tensor, width: int, value: float) -> torch.Tensor:
        return torch.nn.functional.pad(x, (0, width - x.shape[1]), value=value)

    offsets, total = [], 0
    for r in rollouts:
        offsets.append(total)
        total += int(r.group_ids.max()) + 1 if len(r) else 0
    with_logprobs = all(r.logprobs is not None for r in rollouts)
    return Rollout(
        prompt_ids=torch.cat([left(r.prompt_ids, P, pad_token_id) for r in rollouts]),
        prompt_mask=torch.cat([left(r.prompt_mask, P, 0) for r in rollouts]),
        completion_ids=torch.cat([right(r.completion_ids, T, pad_token_id) for r in rollouts]),
        completion_mask=torch.cat([right(r.completion_mask, T, 0) for r in rollouts]),
        group_ids=torch.cat([r.group_ids + o for r, o in zip(rollouts, offsets)]),
        prompts=[p for r in rollouts for p in r.prompts],
        completions=[c for r in rollouts for c in r.completions],
        truncated=torch.cat([r.truncated for r in rollouts]),
        logprobs=torch.cat([right(r.logprobs, T, 0.0) for r in rollouts]) if with_logprobs else None,
    )
