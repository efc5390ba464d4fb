"""DAPO's soft overlong punishment: a length penalty added to the reward of completions near the budget.

Yu et al. 2025, "DAPO: An Open-Source LLM Reinforcement Learning System at Scale" (arXiv:2503.14476), eq. (13),
with ``L_max`` the completion budget (``rollout.max_new_tokens``) and ``L_cache`` the buffer
(``rewards.overlong_buffer_len``)::

    R_length(y) = 0                                   if |y| ≤ L_max − L_cache
                  ((L_max − L_cache) − |y|) / L_cache  if L_max − L_cache < |y| ≤ L_max
                  −1                                  if L_max < |y|

times ``overlong_penalty_factor``. Peer: verl ``DAPORewardManager.__call__`` (workers/reward_manager/dapo.py,
``overlong_buffer.len`` / ``overlong_buffer.penalty_factor``), which computes
``min(−(|y| − (L_max − L_cache)) / L_cache · factor, 0)``; the two agree for ``|y| ≤ L_max`` (the only lengths a
sampler capped at ``L_max`` produces), and the paper's −1 floor holds beyond it. ``|y|`` counts the completion's
tokens including its EOS, as verl's ``valid_response_length`` does.
"""

from __future__ import annotations

import torch


def overlong_penalty(lengths: torch.Tensor, max_new_tokens: int, buffer_tokens: int,
                     penalty_factor: float = 1.0) -> torch.Tensor:
    """(B,) the soft overlong penalty (≤ 0) of completions of ``lengths`` tokens (see the module docstring).

    lengths: (B,) completion lengths in tokens (EOS included), any real dtype; the result is float32 on its
    device. ``buffer_tokens`` must be in [1, max_new_tokens].
    """
    if not 1 <= buffer_tokens <= max_new_tokens:
        raise ValueError(f"buffer_tokens={buffer_tokens} must be in [1, max_new_tokens={max_new_tokens}]")
    expected = max_new_tokens - buffer_tokens  # L_max − L_cache: the length that is never punished
    over = (expected - lengths.to(torch.float32)) / buffer_tokens
    return over.clamp(min=-1.0, max=0.0) * penalty_factor
