"""Pieces only OpenRLHF or ms-swift ship, against naive references transcribed from their code (float64, max abs
diff ≤ 1e-6). Neither package is installed; the transcriptions cite file, commit and lines.

- OpenRLHF ``openrlhf/models/loss.py`` @ 3c3be62 (``PolicyLoss.forward``, lines 196-217): vLLM IS correction
  ``tis`` (token clamp to [low, high]), ``icepop`` (token mask) and ``seq-mask-tis`` (sequence geometric-mean mask,
  token weights unclamped), applied to the per-token PPO loss; its ``masked_mean`` is
  ``openrlhf/models/utils.py`` line 166.
- ms-swift ``swift/rlhf_trainers/grpo_trainer.py`` @ 3602360 (``_compute_sequence_level_ratios`` lines 2311-2326,
  ``_apply_rollout_importance_sampling`` lines 2328-2376, ``_compute_off_policy_sequence_mask`` lines 2378-2410):
  the four ``rollout_importance_sampling_mode``s (sequence ratios are geometric means there) and the off-policy
  sequence mask (mean advantage per sequence).
"""

from __future__ import annotations

import pytest
import torch
from obj_helpers import make_batch

from lmpo.objectives import Objective

TOL = dict(rtol=0.0, atol=1e-6)


def _batch(seed, spread=0.3):
    logp, old, adv, mask = make_batch(batch=8, length=20, seed=seed, dtype=torch.float64, drift=0.3)
    g = torch.Generator().manual_seed(seed + 100)
    rollout = old + spread * torch.randn(old.shape, generator=g, dtype=torch.float64) \
        + 0.1 * torch.randn(old.shape[0], 1, generator=g, dtype=torch.float64)
    return logp.detach(), old, adv, mask, rollout


def lmpo_weights(old, mask, rollout, **correction):
    """The correction's weights per token: on-policy (logp = old), A = 1 and Σ −ρ·c, the gradient is −c."""
    probe = Objective(trust_region="none", aggregation="token_sum", **correction)
    leaf = old.clone().requires_grad_()
    loss, _ = probe(leaf, old, torch.ones(old.shape[0], dtype=old.dtype), mask, rollout_logp=rollout)
    (grad,) = torch.autograd.grad(loss, leaf)
    return -grad


# ----------------------------------------------------------------------------------------------- OpenRLHF
def openrlhf_masked_mean(tensor, mask, dim=None):  # openrlhf/models/utils.py:166
    return (tensor * mask).sum(dim=dim) / mask.sum(dim=dim)


def openrlhf_vllm_is(old_log_probs, rollout_log_probs, action_mask, kind, low_threshold, high_threshold):
    """openrlhf/models/loss.py:196-217 (the weight multiplying the per-token loss)."""
    rollout_log_ratio = old_log_probs - rollout_log_probs
    if kind == "icepop":
        vllm_is = torch.exp(rollout_log_ratio).detach()
        keep = (vllm_is >= low_threshold) & (vllm_is <= high_threshold)
        return vllm_is * keep
    if kind == "seq-mask-tis":
        seq_log_ratio = openrlhf_masked_mean(rollout_log_ratio, action_mask, dim=-1)
        seq_is = torch.exp(seq_log_ratio)
        seq_mask = (seq_is >= low_threshold) & (seq_is <= high_threshold)
        return seq_mask.unsqueeze(-1) * torch.exp(rollout_log_ratio).detach()
    return torch.exp(rollout_log_ratio).clamp(min=low_threshold, max=high_threshold).detach()


OPENRLHF = {
    "tis": dict(correction="tis", is_level="token"),
    "icepop": dict(correction="mis", is_level="token"),
    "seq-mask-tis": dict(correction="mis", is_level="token", is_mask_level="geometric"),
}


@pytest.mark.parametrize("kind", list(OPENRLHF))
def test_openrlhf_vllm_is_corrections(kind):
    logp, old, adv, mask, rollout = _batch(1)
    low, high = 0.8, 1.3
    want = openrlhf_vllm_is(old, rollout, mask.double(), kind, low, high) * mask
    got = lmpo_weights(old, mask, rollout, is_min=low, is_max=high, **OPENRLHF[kind])
    torch.testing.assert_close(got, want, **TOL)
    assert (want != torch.exp(old - rollout) * mask).any()  # the thresholds bind somewhere
    # applied to OpenRLHF's token-level PPO loss (masked_mean over all tokens, no dual clip)
    leaf, ref_leaf = logp.clone().requires_grad_(), logp.clone().requires_grad_()
    ratio = torch.exp(ref_leaf - old)
    surr = torch.min(ratio * adv[:, None], ratio.clamp(0.8, 1.2) * adv[:, None])
    theirs = openrlhf_masked_mean(-surr * openrlhf_vllm_is(old, rollout, mask.double(), kind, low, high),
                                  mask.double())
    ours, _ = Objective.preset("dapo", eps_high=0.2, is_min=low, is_max=high, **OPENRLHF[kind])(
        leaf, old, adv, mask, rollout_logp=rollout)
    torch.testing.assert_close(ours, theirs, **TOL)
    torch.testing.assert_close(torch.autograd.grad(ours, leaf)[0], torch.autograd.grad(theirs, ref_leaf)[0], **TOL)


# ----------------------------------------------------------------------------------------------- ms-swift
def swift_sequence_level_ratios(is_ratio, completion_mask):  # grpo_trainer.py:2311-2326
    log_ratio = torch.log(is_ratio.clamp(min=1e-10))
    seq_log_ratios = (log_ratio * completion_mask).sum(-1) / completion_mask.sum(-1).clamp(min=1.0)
    return torch.exp(seq_log_ratios)


def swift_rollout_is(rollout_log_ratio, completion_mask, mode, threshold):  # grpo_trainer.py:2328-2376
    is_ratio = torch.exp(torch.clamp(rollout_log_ratio, min=-20.0, max=20.0))
    if mode == "token_truncate":
        return torch.clamp(is_ratio, max=threshold)
    if mode == "token_mask":
        return torch.where(is_ratio <= threshold, is_ratio, torch.zeros_like(is_ratio))
    seq_ratios = swift_sequence_level_ratios(is_ratio, completion_mask)
    if mode == "sequence_truncate":
        return torch.clamp(seq_ratios, max=threshold).unsqueeze(-1).expand_as(is_ratio)
    return is_ratio * (seq_ratios <= threshold).float().unsqueeze(-1)  # sequence_mask


SWIFT = {
    "token_truncate": dict(correction="tis", is_level="token"),
    "token_mask": dict(correction="mis", is_level="token", is_min=None),
    "sequence_truncate": dict(correction="tis", is_level="geometric"),
    "sequence_mask": dict(correction="mis", is_level="token", is_mask_level="geometric", is_min=None),
}


@pytest.mark.parametrize("mode", list(SWIFT))
def test_ms_swift_rollout_importance_sampling_modes(mode):
    _, old, _, mask, rollout = _batch(2)
    threshold = 1.15 if mode.startswith("token") else 1.05
    want = swift_rollout_is(old - rollout, mask.double(), mode, threshold) * mask
    got = lmpo_weights(old, mask, rollout, is_max=threshold, **SWIFT[mode])
    torch.testing.assert_close(got, want, **TOL)
    assert (want != torch.exp(old - rollout) * mask).any() and want.any()


def swift_off_policy_sequence_mask(per_token_logps, old_policy_per_token_logps, completion_mask, advantages, delta):
    """grpo_trainer.py:2378-2410; advantages per sequence (the caller's mean over tokens, lines 1084-1086)."""
    log_ratio = old_policy_per_token_logps - per_token_logps
    seq_mean_log_ratio = (log_ratio * completion_mask).sum(-1) / completion_mask.sum(-1).clamp(min=1.0)
    return ~((seq_mean_log_ratio > delta) & (advantages < 0))


def test_ms_swift_off_policy_sequence_mask():
    """Same keep decision as lmpo's ``off_policy_seq`` (ms-swift then drops the rows from its normalisers, lmpo
    multiplies the terms by 0 as DeepSeek-V3.2 eq. 9 and TRL do: compared on the mask)."""
    logp, old, adv, mask, _ = _batch(3)
    rollout = logp + 0.2 * torch.rand(logp.shape[0], 1, generator=torch.Generator().manual_seed(5),
                                      dtype=torch.float64)
    want = swift_off_policy_sequence_mask(logp, rollout, mask.double(), adv, 0.08)
    assert want.any() and not want.all()
    probe = Objective(trust_region="none", aggregation="token_sum", rejection="off_policy_seq", opsm_delta=0.08)
    leaf = logp.clone().requires_grad_()
    loss, _ = probe(leaf, logp, -torch.ones_like(adv), mask, rollout_logp=rollout)  # A < 0: every row is tested
    keep = torch.autograd.grad(loss, leaf)[0]  # d/dlogp of Σ −ρ·(−1)·k = k at valid tokens
    want_all_negative = swift_off_policy_sequence_mask(logp, rollout, mask.double(), -torch.ones_like(adv), 0.08)
    torch.testing.assert_close(keep, want_all_negative.double().unsqueeze(-1) * mask, **TOL)
