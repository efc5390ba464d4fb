"""Sampler/trainer mismatch statistics: how far the sampler's log-probs are from the training model's.

With ``Δ_t = log π_train(y_t) − log π_rollout(y_t)`` at the valid tokens of B sequences (π_train: the training
model's log-probs of the sampled tokens before this step's update, at the same temperature; π_rollout: what the
sampler recorded), the statistics are those of verl's ``compute_offpolicy_metrics``
(trainer/ppo/rollout_corr_helper.py), under ``mismatch/`` (its ``rollout_corr/`` prefix)::

    kl                  = mean_t(−Δ_t)                     k1 estimate of KL(π_rollout ‖ π_train)
    k3_kl               = mean_t(e^Δ_t − Δ_t − 1)          k3 estimate of the same KL (≥ 0)
    training_ppl        = mean_b exp(−mean_t log π_train)   rollout_ppl likewise with π_rollout
    log_ppl_diff        = mean_b(mean_t log π_rollout − mean_t log π_train)   (and its mean absolute value)
    ppl_ratio           = mean_b exp(log_ppl_diff_b)        training / rollout perplexity, per sequence
    chi2_token          = mean_t(e^{2Δ_t}) − 1              chi2_seq = mean_b(e^{2 Σ_t Δ_t}) − 1
    abs_logp_diff_mean, abs_logp_diff_max = mean_t |Δ_t|, max_t |Δ_t|   (lmpo's own)

``mean_t`` is over all valid tokens of the batch, ``mean_b`` over sequences with at least one valid token. Δ is
clamped to ±20 inside the exponentials, as verl does. When the sampler is the training model itself (lmpo's
``HFRollout``), every statistic is at its zero point (0, or ppl_ratio 1) up to sampling numerics.
"""

from __future__ import annotations

import torch

#: verl's SAFETY_BOUND on log-ratios inside exponentials
_CLAMP = 20.0

@torch.no_grad()
def mismatch_metrics(train_logp: torch.Tensor, rollout_logp: torch.Tensor, mask: torch.Tensor
                     ) -> dict[str, torch.Tensor]:
    """The ``mismatch/*`` statistics (0-dim detached tensors; see the module docstring); {} without valid tokens.

    train_logp, rollout_logp: (B, T) log-probs of the sampled tokens; mask: (B, T) 1 at valid tokens.
    """
    m = mask.to(torch.float32)
    n_tok = m.sum()
    if not bool(n_tok > 0):
        return {}
    train = train_logp.detach().float() * m
    roll = rollout_logp.detach().float() * m
    delta = (train - roll) * m  # Δ_t, 0 at invalid tokens
    lengths = m.sum(-1)
    seq = lengths > 0
    n_seq = lengths.clamp(min=1.0)
    mean_train = train.sum(-1)[seq] / n_seq[seq]  # (B',)
    mean_roll = roll.sum(-1)[seq] / n_seq[seq]
    log_ppl_diff = mean_roll - mean_train
    d = delta.clamp(-_CLAMP, _CLAMP)
    seq_sum = delta.sum(-1)[seq].clamp(-_CLAMP, _CLAMP)
    return {
        "mismatch/kl": (-delta).sum() / n_tok,
        "mismatch/k3_kl": ((torch.exp(d) - d - 1.0) * m).sum() / n_tok,
        "mismatch/abs_logp_diff_mean": delta.abs().sum() / n_tok,
        "mismatch/abs_logp_diff_max": delta.abs().amax(),
        "mismatch/training_ppl": torch.exp(-mean_train).mean(),
        "mismatch/rollout_ppl": torch.exp(-mean_roll).mean(),
        "mismatch/log_ppl_diff": log_ppl_diff.mean(),
        "mismatch/log_ppl_abs_diff": log_ppl_diff.abs().mean(),
        "mismatch/ppl_ratio": torch.exp(log_ppl_diff).mean(),
        "mismatch/chi2_token": (torch.exp(2.0 * d) * m).sum() / n_tok - 1.0,
        "mismatch/chi2_seq": torch.exp(2.0 * seq_sum).mean() - 1.0,
    }
