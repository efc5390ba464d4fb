"""Thinking levels, the thinking reward and its confidence term (docs/rlvcr.md).

- level of a thinking of ``n`` tokens: the smallest level whose budget is ≥ n, else the largest;
- cost = thinking tokens / max(budgets);
- confidence = mean over the action tokens of π(a_t | prompt, thinking, a_<t) (teacher-forced, current
  policy, one batched forward);
- thinking reward = confidence − λ_cost · cost.

Thinking and action are located in token space: the completion's token ids are searched for the token ids
of the opening and closing tags, so no decode/re-encode round trip can shift a boundary.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch

from lmpo.generation import sequence_logprobs

Tensor = torch.Tensor


def assign_levels(thinking_tokens: Tensor, budgets: Sequence[int]) -> Tensor:
    """Level (1..L) of each thinking length: the smallest budget that fits it, else level L.

    Args:
        thinking_tokens: (B,) integer thinking lengths in tokens.
        budgets: L strictly increasing token budgets.
    Returns:
        (B,) long levels in 1..L. Example with budgets (4, 8, 16, 32): 0→1, 4→1, 5→2, 11→3, 32→4, 40→4.
    """
    b = torch.as_tensor(list(budgets), dtype=torch.long, device=thinking_tokens.device)
    idx = torch.searchsorted(b, thinking_tokens.long(), right=False)  # first budget >= n
    return idx.clamp(max=len(budgets) - 1) + 1


def thinking_cost(thinking_tokens: Tensor, budgets: Sequence[int]) -> Tensor:
    """(B,) ``thinking_tokens / max(budgets)`` as float32 (in [0, 1] when thinking fits the largest budget)."""
    return thinking_tokens.to(torch.float32) / float(max(budgets))


def action_confidence(token_logprobs: Tensor, action_mask: Tensor) -> Tensor:
    """Mean probability of the action tokens: ``Σ_t m_t·exp(logp_t) / Σ_t m_t``.

    Args:
        token_logprobs: (B, T) log π of each completion token (teacher-forced).
        action_mask: (B, T) 1 on the action tokens.
    Returns:
        (B,) float32; 0 for a row without action tokens (nothing to be confident about).
    """
    m = action_mask.to(torch.float32)
    p = token_logprobs.detach().to(torch.float32).exp() * m
    return p.sum(-1) / m.sum(-1).clamp(min=1.0)


def thinking_reward(confidence: Tensor, cost: Tensor, cost_weight: float) -> Tensor:
    """(B,) ``confidence − λ_cost · cost``."""
    return confidence - cost_weight * cost


def find_subsequence(seq: Sequence[int], pattern: Sequence[int], start: int = 0) -> int:
    """Index of the first occurrence of ``pattern`` in ``seq`` at or after ``start``, or −1."""
    n, k = len(seq), len(pattern)
    if k == 0:
        return start if start <= n else -1
    first = pattern[0]
    for i in range(start, n - k + 1):
        if seq[i] == first and list(seq[i:i + k]) == list(pattern):
            return i
    return -1


@dataclass(frozen=True)
class ThinkingSpan:
    """Where the parts of one completion lie, as token offsets into its ids (EOS/pad already removed).

    ``ids[:open_end]`` is everything up to and including the opening tag, ``ids[open_end:close_start]`` the
    thinking, ``ids[close_start:close_end]`` the closing tag, ``ids[close_end:]`` the action.
    """

    open_end: int
    close_start: int
    close_end: int

    @property
    def thinking_tokens(self) -> int:
        return self.close_start - self.open_end


def locate_thinking(ids: Sequence[int], open_ids: Sequence[int], close_ids: Sequence[int],
                    max_prefix_tokens: int = 0) -> ThinkingSpan | None:
    """Find ``open ‖ thinking ‖ close ‖ action`` in a completion's token ids.

    The opening tag must start within the first ``max_prefix_tokens`` tokens (whitespace a chat model may
    emit first); the action is what follows the first closing tag after it. None when either tag is
    missing or a second opening tag appears inside the thinking.
    """
    o = find_subsequence(ids, open_ids)
    if o < 0 or o > max_prefix_tokens:
        return None
    open_end = o + len(open_ids)
    c = find_subsequence(ids, close_ids, open_end)
    if c < 0:
        return None
    if find_subsequence(ids[:c], open_ids, open_end) >= 0:
        return None
    return ThinkingSpan(open_end=open_end, close_start=c, close_end=c + len(close_ids))


def cut_generated_thinking(gen_ids: Sequence[int], close_ids: Sequence[int], stop_ids: Sequence[int],
                           budget: int) -> list[int]:
    """The thinking part of a regenerated continuation: up to the first closing tag or stop token (EOS,
    pad), and at most ``budget`` tokens."""
    end = len(gen_ids)
    c = find_subsequence(gen_ids, close_ids)
    if c >= 0:
        end = c
    stops = set(int(s) for s in stop_ids)
    for i in range(end):
        if int(gen_ids[i]) in stops:
            end = i
            break
    return [int(t) for t in gen_ids[:min(end, budget)]]


def level_instruction(template: str, prompt: str, level: int, levels: int, budget: int) -> str:
    """The prompt under a level instruction: ``template.format(prompt=..., level=..., levels=..., budget=...)``."""
    return template.format(prompt=prompt, level=level, levels=levels, budget=budget)


@torch.no_grad()
def teacher_forced_confidence(model, prompt_ids: Sequence[Sequence[int]], completion_ids: Sequence[Sequence[int]],
                              action_starts: Sequence[int], pad_token_id: int, device: torch.device | str = "cpu",
                              temperature: float = 1.0, seqs_per_batch: int = 64) -> Tensor:
    """Confidence of each completion's action under ``model``, teacher-forced, batched.

    Args:
        prompt_ids: B token-id lists (what the model was conditioned on, e.g. ``<bos>`` + prompt).
        completion_ids: B token-id lists ``open ‖ thinking ‖ close ‖ action`` (no EOS or pad).
        action_starts: B offsets into ``completion_ids`` where the action begins (``ThinkingSpan.close_end``).
        temperature: τ of ``softmax(logits / τ)``; 1 is the policy itself.
    Returns:
        (B,) float32 mean probability of the action tokens (0 for an empty action).

    One forward per ``seqs_per_batch`` rows over left-padded prompts followed by right-padded completions,
    the layout of ``lmpo.generation.sequence_logprobs``. Slow equivalent: for each sample, run the
    model on prompt ‖ completion alone and average ``softmax(logits)[t−1, id_t]`` over the action tokens.
    """
    B = len(completion_ids)
    out = torch.zeros(B, dtype=torch.float32)
    was_training = model.training
    model.eval()
    try:
        for start in range(0, B, seqs_per_batch):
            rows = range(start, min(B, start + seqs_per_batch))
            P = max(len(prompt_ids[i]) for i in rows)
            T = max(max(len(completion_ids[i]) for i in rows), 1)
            ids = torch.full((len(rows), P + T), pad_token_id, dtype=torch.long)
            attn = torch.zeros((len(rows), P + T), dtype=torch.long)
            amask = torch.zeros((len(rows), T), dtype=torch.bool)
            for r, i in enumerate(rows):
                p, c = list(prompt_ids[i]), list(completion_ids[i])
                ids[r, P - len(p):P] = torch.tensor(p, dtype=torch.long)
                attn[r, P - len(p):P] = 1
                if c:
                    ids[r, P:P + len(c)] = torch.tensor(c, dtype=torch.long)
                    attn[r, P:P + len(c)] = 1
                amask[r, action_starts[i]:len(c)] = True
            lp = sequence_logprobs(model, ids.to(device), attn.to(device), T, temperature=temperature).logprobs
            out[start:start + len(rows)] = action_confidence(lp.float().cpu(), amask)
    finally:
        if was_training:
            model.train()
    return out
