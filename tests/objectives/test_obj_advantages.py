"""Advantage estimators (SPEC §1.7)."""

import pytest
import torch

from lmpo.objectives.advantages import (
    compute_advantages,
    grpo_advantages,
    rloo_advantages,
    zero_variance_mask,
)


def filter_zero_variance_groups(rewards: torch.Tensor, group_ids: torch.Tensor):
    """Keep mask of DAPO-style group filtering: ``(keep (B,) bool, stats)``; stats give the dropped fraction."""
    zero_var = zero_variance_mask(rewards, group_ids)
    return ~zero_var, {"adv/zero_var_frac": zero_var.float().mean()}


def test_grpo_hand_case():
    # group 7: rewards [1, 0, 0, 1] → mean 0.5, unbiased std sqrt(1/3) = 0.57735
    # group 3: [2, 2] → zero variance → 0; group 9: [5] singleton → 0
    r = torch.tensor([1.0, 0.0, 0.0, 1.0, 2.0, 2.0, 5.0])
    g = torch.tensor([7, 7, 7, 7, 3, 3, 9])
    adv, stats = grpo_advantages(r, g, scale="group")
    a = 0.5 / (0.5773502691896258 + 1e-4)
    torch.testing.assert_close(adv, torch.tensor([a, -a, -a, a, 0.0, 0.0, 0.0]))
    assert stats["adv/zero_var_frac"].item() == pytest.approx(3 / 7)
    adv, _ = grpo_advantages(r, g, scale="none")
    torch.testing.assert_close(adv, torch.tensor([0.5, -0.5, -0.5, 0.5, 0.0, 0.0, 0.0]))
    adv, _ = grpo_advantages(r, g, scale="batch")
    torch.testing.assert_close(adv, torch.tensor([0.5, -0.5, -0.5, 0.5, 0.0, 0.0, 0.0]) / (r.std() + 1e-4))


def test_rloo_hand_case():
    # [1, 0, 0]: 1 − 0 = 1, 0 − 0.5 = −0.5, −0.5; singleton → 0
    r = torch.tensor([1.0, 0.0, 0.0, 3.0])
    g = torch.tensor([0, 0, 0, 1])
    adv, _ = rloo_advantages(r, g)
    torch.testing.assert_close(adv, torch.tensor([1.0, -0.5, -0.5, 0.0]))


@pytest.mark.parametrize("name", ["grpo", "rloo"])  # the others: test_obj_advantages_peers.py
def test_matches_loop_and_permutation_equivariant(name):
    g = torch.Generator().manual_seed(0)
    groups = torch.arange(6).repeat_interleave(4)
    r = torch.randint(0, 3, (24,), generator=g).double()
    adv, _ = compute_advantages(name, r, groups)
    for k in range(6):
        rr = r[groups == k]
        if name == "grpo":
            ref = (rr - rr.mean()) / (rr.std() + 1e-4) if rr.std() > 0 else torch.zeros(4, dtype=torch.float64)
        else:
            ref = torch.stack([rr[i] - torch.cat([rr[:i], rr[i + 1:]]).mean() for i in range(4)])
        torch.testing.assert_close(adv[groups == k], ref)
    perm = torch.randperm(24, generator=g)
    adv_p, _ = compute_advantages(name, r[perm], groups[perm] * 10 + 3)  # relabelled ids too
    torch.testing.assert_close(adv_p, adv[perm])


def test_zero_variance_flag_and_filter():
    r = torch.tensor([1.0, 1.0, 0.0, 1.0, 4.0])
    g = torch.tensor([0, 0, 1, 1, 2])
    assert zero_variance_mask(r, g).tolist() == [True, True, False, False, True]
    keep, stats = filter_zero_variance_groups(r, g)
    assert keep.tolist() == [False, False, True, True, False]
    assert stats["adv/zero_var_frac"].item() == pytest.approx(0.6)


def test_bad_inputs():
    with pytest.raises(ValueError, match="unknown advantage estimator 'ppo'.*grpo"):
        compute_advantages("ppo", torch.zeros(2), torch.zeros(2, dtype=torch.long))
    with pytest.raises(ValueError, match="scale='bogus'"):
        grpo_advantages(torch.zeros(2), torch.zeros(2, dtype=torch.long), scale="bogus")
    with pytest.raises(ValueError, match="group_ids has shape"):
        grpo_advantages(torch.zeros(2), torch.zeros(3, dtype=torch.long))
    with pytest.raises(TypeError, match="integer"):
        grpo_advantages(torch.zeros(2), torch.zeros(2))
    with pytest.raises(ValueError, match="not finite"):
        grpo_advantages(torch.tensor([0.0, float("nan")]), torch.zeros(2, dtype=torch.long))
