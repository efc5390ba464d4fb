"""Reference KL (SPEC §1.5) and aggregation (SPEC §1.6)."""

import math

import pytest
import torch
from obj_helpers import aggregate_loop, make_batch

from lmpo.objectives import AGGREGATIONS, Objective
from lmpo.objectives.parts.aggregation import aggregate
from lmpo.objectives.parts.kl import kl_estimate


def test_kl_estimators_hand_case():
    # logp = −1, ref = −1.5: k1 = 0.5, k2 = 0.125, k3 = e^{−0.5} + 0.5 − 1
    logp, ref = torch.tensor([-1.0]), torch.tensor([-1.5])
    assert kl_estimate(logp, ref, "k1").item() == pytest.approx(0.5)
    assert kl_estimate(logp, ref, "k2").item() == pytest.approx(0.125)
    assert kl_estimate(logp, ref, "k3").item() == pytest.approx(math.exp(-0.5) - 0.5)


def test_k3_is_nonnegative_unbiased_and_clamped():
    g = torch.Generator().manual_seed(0)
    # samples y ~ π over 5 categories: E_π[k3] = KL(π‖π_ref)
    p = torch.softmax(torch.randn(5, generator=g, dtype=torch.float64), 0)
    q = torch.softmax(torch.randn(5, generator=g, dtype=torch.float64), 0)
    k3 = kl_estimate(p.log(), q.log(), "k3")
    torch.testing.assert_close((p * k3).sum(), (p * (p.log() - q.log())).sum())
    assert (k3 >= 0).all()
    big = kl_estimate(torch.tensor([-200.0]), torch.tensor([0.0]), "k3")
    assert torch.isfinite(big).all()


@pytest.mark.parametrize("estimator", ["k1", "k2", "k3"])
def test_kl_term_aggregated_like_the_loss(estimator):
    logp, old, adv, mask = make_batch(seed=3)
    ref = logp.detach() - 0.2
    base = Objective(aggregation="seq_mean_token_sum")
    with_kl = Objective(aggregation="seq_mean_token_sum", kl_coef=0.3, kl_estimator=estimator)
    l0, _ = base(logp, old, adv, mask)
    l1, stats = with_kl(logp, old, adv, mask, ref_logp=ref)
    expected = 0.3 * aggregate_loop(kl_estimate(logp, ref, estimator), mask, "seq_mean_token_sum")
    torch.testing.assert_close(l1 - l0, expected)
    torch.testing.assert_close(stats["loss/kl_ref"], expected.detach())


@pytest.mark.parametrize("mode", AGGREGATIONS)
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_aggregation_matches_loop(mode, dtype):
    for seed in range(2):
        g = torch.Generator().manual_seed(seed)
        per_token = torch.randn(5, 11, generator=g, dtype=dtype)
        mask = torch.rand(5, 11, generator=g) > 0.4
        mask[3] = False  # an empty row
        got = aggregate(per_token, mask.to(dtype), mode, norm_constant=16.0 if mode.endswith("_norm") else None)
        ref = aggregate_loop(per_token, mask, mode, norm_constant=16.0)
        torch.testing.assert_close(got, ref)


def test_aggregation_hand_case():
    # rows: [1, 2 | 3 masked], [4 | masked, masked]; B = 2, T = 3
    per_token = torch.tensor([[1.0, 2.0, 3.0], [4.0, 5.0, 6.0]])
    m = torch.tensor([[1.0, 1.0, 0.0], [1.0, 0.0, 0.0]])
    assert aggregate(per_token, m, "token_mean").item() == pytest.approx(7 / 3)
    assert aggregate(per_token, m, "seq_mean_token_mean").item() == pytest.approx((1.5 + 4) / 2)
    assert aggregate(per_token, m, "seq_mean_token_sum").item() == pytest.approx(7 / 2)
    assert aggregate(per_token, m, "seq_sum_norm").item() == pytest.approx(7 / 6)
    assert aggregate(per_token, m, "seq_sum_norm", norm_constant=7.0).item() == pytest.approx(7 / 14)


@pytest.mark.parametrize("preset", ["dapo", "grpo", "dr_grpo"])
def test_gradient_accumulation_exact_with_global_counts(preset):
    logp, old, adv, mask = make_batch(batch=8, seed=7)
    obj = Objective.preset(preset)
    full, _ = obj(logp, old, adv, mask)
    (g_full,) = torch.autograd.grad(full, logp)
    n_tok, n_seq = mask.sum(), mask.shape[0]
    total = 0
    for idx in (slice(0, 3), slice(3, 8)):
        part, _ = obj(logp[idx], old[idx], adv[idx], mask[idx], num_tokens=n_tok, num_seqs=n_seq)
        total = total + part
    (g_acc,) = torch.autograd.grad(total, logp)
    torch.testing.assert_close(total, full)
    torch.testing.assert_close(g_acc, g_full)


@pytest.mark.parametrize("mode", AGGREGATIONS)
def test_empty_rows_and_all_masked_batch_are_finite_with_zero_gradient(mode):
    logp, old, adv, mask = make_batch(seed=2)
    mask = mask.clone()
    mask[1] = False
    loss, stats = Objective(aggregation=mode)(logp, old, adv, mask)
    (grad,) = torch.autograd.grad(loss, logp)
    assert torch.isfinite(loss) and (grad[1] == 0).all()
    empty = torch.zeros_like(mask)
    for level in ("token", "sequence", "sequence_arith", "token_ema"):
        loss, stats = Objective(aggregation=mode, level=level)(logp, old, adv, empty)
        (grad,) = torch.autograd.grad(loss, logp)
        assert loss.item() == 0.0 and (grad == 0).all()
        assert all(torch.isfinite(v) for v in stats.values())
        assert stats["ratio/min"].item() == stats["ratio/max"].item() == stats["ratio/mean"].item() == 1.0
        assert stats["tokens/valid"].item() == 0 and stats["clip/low_frac"].item() == 0
