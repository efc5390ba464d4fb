"""Importance levels (SPEC §1.1): slow-loop references, invariances, hand cases."""

import math

import pytest
import torch
from obj_helpers import make_batch, naive_ema

from lmpo.objectives import Objective
from lmpo.objectives.parts import LEVELS, Context
from lmpo.objectives.parts.levels import ema_block_size, ema_scan


@pytest.mark.parametrize("beta", [0.05, 0.2, 0.5, 0.9, 0.99, 1.0])
@pytest.mark.parametrize("length", [1, 37, 300])
def test_ema_scan_matches_naive_loop_values_and_grads(beta, length):
    g = torch.Generator().manual_seed(length)
    w = torch.exp(torch.randn(3, length, generator=g, dtype=torch.float64) * 3).requires_grad_()
    valid = torch.rand(3, length, generator=g) > 0.3  # holes, and possibly empty rows
    valid[2] = False
    fast, slow = ema_scan(w, valid, beta), naive_ema(w, valid, beta)
    torch.testing.assert_close(fast, slow)
    cot = torch.randn(3, length, generator=g, dtype=torch.float64)
    (g_fast,) = torch.autograd.grad(fast, w, cot)
    (g_slow,) = torch.autograd.grad(slow, w, cot)
    torch.testing.assert_close(g_fast, g_slow)


def test_ema_scan_block_not_dividing_T_and_float32():
    g = torch.Generator().manual_seed(3)
    w = torch.exp(torch.randn(2, 101, generator=g))  # float32
    valid = torch.rand(2, 101, generator=g) > 0.2
    for block in (1, 7, 64, 256):
        torch.testing.assert_close(ema_scan(w, valid, 0.3, block_size=block), naive_ema(w, valid, 0.3),
                                   rtol=2e-5, atol=1e-6)


def test_ema_block_size_never_overflows_rescaling():
    for beta in (1e-4, 0.2, 0.5, 0.9, 0.999, 0.999999):
        c = ema_block_size(beta)
        assert 1 <= c <= 256
        assert c * -math.log1p(-beta) <= math.log(1e25) + 1e-9 or c == 1


@pytest.mark.parametrize("beta", [0.01, 0.2, 0.9, 0.999])
def test_ema_stays_finite_at_32k_tokens(beta):
    g = torch.Generator().manual_seed(0)
    length = 32768
    w = torch.exp(torch.randn(2, length, generator=g) * 6).clamp(math.exp(-20), math.exp(20)).requires_grad_()
    valid = torch.rand(2, length, generator=g) > 0.1
    out = ema_scan(w, valid, beta)
    assert torch.isfinite(out).all()
    out.sum().backward()
    assert torch.isfinite(w.grad).all()
    # the tail of a long sequence still matches the loop started from the exact state 2000 tokens earlier
    start = length - 2000
    state = out[:, start - 1].detach()
    ref = []
    for t in range(start, length):
        state = torch.where(valid[:, t], (1 - beta) * state + beta * w[:, t].detach(), state)
        ref.append(state)
    torch.testing.assert_close(out[:, start:].detach(), torch.stack(ref, -1), rtol=1e-4, atol=1e-30)


def test_ema_scan_leaves_inputs_untouched_and_accepts_float_masks():
    w = torch.exp(torch.randn(2, 40, generator=torch.Generator().manual_seed(0)))
    valid = (torch.rand(2, 40, generator=torch.Generator().manual_seed(1)) > 0.3).float()
    w0, v0 = w.clone(), valid.clone()
    out = ema_scan(w, valid, 0.3)
    torch.testing.assert_close(out, naive_ema(w, valid.bool(), 0.3))
    assert torch.equal(w, w0) and torch.equal(valid, v0)


def test_ema_hand_case():
    # β = 0.5, w = [3, (masked) 100, 1]: w'_1 = 0.5·1 + 0.5·3 = 2; masked keeps 2; w'_3 = 0.5·2 + 0.5·1 = 1.5
    w = torch.tensor([[3.0, 100.0, 1.0]])
    valid = torch.tensor([[True, False, True]])
    torch.testing.assert_close(ema_scan(w, valid, 0.5), torch.tensor([[2.0, 2.0, 1.5]]))


@pytest.mark.parametrize("grad", ["local", "full"])
def test_ema_beta_one_equals_token_level(grad):
    logp, old, adv, mask = make_batch(seed=4, per_token_adv=True)
    tok = Objective(level="token", aggregation="token_mean")
    ema = Objective(level="token_ema", ema_beta=1.0, ema_grad=grad, aggregation="token_mean")
    l1, s1 = tok(logp, old, adv, mask)
    l2, s2 = ema(logp, old, adv, mask)
    g1, g2 = torch.autograd.grad(l1, logp)[0], torch.autograd.grad(l2, logp)[0]
    torch.testing.assert_close(l1, l2)
    torch.testing.assert_close(g1, g2)
    torch.testing.assert_close(s1["clip/low_frac"], s2["clip/low_frac"])


@pytest.mark.parametrize("grad", ["local", "full"])
@pytest.mark.parametrize("beta", [0.1, 0.6])
def test_ema_objective_matches_loop_built_objective(grad, beta):
    logp, old, adv, mask = make_batch(seed=5, length=45)
    obj = Objective(level="token_ema", ema_beta=beta, ema_grad=grad, trust_region="none",
                    aggregation="token_mean")
    loss, _ = obj(logp, old, adv, mask)
    (grad_fast,) = torch.autograd.grad(loss, logp)
    w = torch.exp(logp - old)
    if grad == "full":
        rho = naive_ema(w, mask, beta)
    else:  # value w'_t, gradient w'_t·∇logπ_t
        rho = naive_ema(w.detach(), mask, beta) * torch.exp(logp - logp.detach())
    ref = -(rho * adv[:, None] * mask).sum() / mask.sum()
    (grad_ref,) = torch.autograd.grad(ref, logp)
    torch.testing.assert_close(loss, ref)
    torch.testing.assert_close(grad_fast, grad_ref)


def test_gspo_and_gspo_token_same_gradient_per_sequence_advantages():
    for seed in range(3):
        logp, old, adv, mask = make_batch(seed=seed, drift=0.01)
        grads = []
        for level in ("sequence", "sequence_token"):
            obj = Objective(level=level, eps_low=3e-4, eps_high=4e-4)
            loss, _ = obj(logp, old, adv, mask)
            grads.append(torch.autograd.grad(loss, logp)[0])
        torch.testing.assert_close(grads[0], grads[1])
        assert grads[0].abs().sum() > 0


def test_gspo_token_differs_from_gspo_with_token_advantages():
    logp, old, adv, mask = make_batch(seed=1, per_token_adv=True, drift=0.0)
    grads = [torch.autograd.grad(Objective(level=lv)(logp, old, adv, mask)[0], logp)[0]
             for lv in ("sequence", "sequence_token")]
    assert not torch.allclose(grads[0], grads[1])


def importance_weight(level, log_ratio, m, mask, lengths):
    """The registered level's weight ρ on a hand-built call context (log-ratios already masked)."""
    ctx = Context(valid=mask, m=m, lengths=lengths, diff=log_ratio, log_ratio=log_ratio)
    return LEVELS[level]().weight(ctx)


def test_amic_at_least_gspo_equal_for_equal_ratios():
    logp, old, adv, mask = make_batch(seed=2, drift=0.5)
    m = mask.double()
    lengths = m.sum(-1)
    lr = (logp - old).detach() * m
    s_geo, _ = importance_weight("sequence", lr, m, mask, lengths)
    s_ari, _ = importance_weight("sequence_arith", lr, m, mask, lengths)
    assert (s_ari >= s_geo - 1e-12).all() and (s_ari > s_geo + 1e-6).any()
    # equal token ratios inside every sequence: arithmetic == geometric
    equal = (torch.linspace(-0.3, 0.3, mask.shape[0], dtype=torch.float64)[:, None] * m)
    s_geo, _ = importance_weight("sequence", equal, m, mask, lengths)
    s_ari, _ = importance_weight("sequence_arith", equal, m, mask, lengths)
    torch.testing.assert_close(s_ari, s_geo)


def test_sequence_levels_hand_case():
    # one sequence, ratios e^{0.2}, e^{-0.4}, (masked): GSPO s = exp(-0.1), AMIC s' = (e^{0.2}+e^{-0.4})/2
    logp = torch.tensor([[-1.0, -2.0, -3.0]], dtype=torch.float64, requires_grad=True)
    old = torch.tensor([[-1.2, -1.6, 7.0]], dtype=torch.float64)
    mask = torch.tensor([[1, 1, 0]])
    adv = torch.tensor([2.0], dtype=torch.float64)
    for level, value in (("sequence", math.exp(-0.1)), ("sequence_arith", (math.exp(0.2) + math.exp(-0.4)) / 2)):
        loss, stats = Objective(level=level, trust_region="none")(logp, old, adv, mask)
        torch.testing.assert_close(loss, torch.tensor(-2.0 * value, dtype=torch.float64))
        torch.testing.assert_close(stats["ratio/mean"], torch.tensor(value, dtype=torch.float64))


@pytest.mark.parametrize("level", ["token", "sequence", "sequence_token", "sequence_arith", "token_ema"])
def test_log_ratio_clamp_gives_finite_values_and_counts(level):
    logp = torch.zeros(2, 4, dtype=torch.float64, requires_grad=True)
    old = torch.tensor([[100.0, -100.0, 0.0, 0.0], [0.0, 0.0, -100.0, 5.0]], dtype=torch.float64)
    mask = torch.tensor([[1, 1, 1, 0], [1, 1, 1, 1]], dtype=torch.bool)
    adv = torch.tensor([1.0, -1.0], dtype=torch.float64)
    for ema_grad in ("local", "full"):
        # ema_grad is token_ema's own parameter; other levels refuse it
        obj = Objective(level=level, trust_region="none", **({"ema_grad": ema_grad} if level == "token_ema" else {}))
        loss, stats = obj(logp, old, adv, mask)
        (grad,) = torch.autograd.grad(loss, logp)
        assert torch.isfinite(loss) and torch.isfinite(grad).all()
        assert all(torch.isfinite(v) for v in stats.values())
        assert stats["ratio/clamped_tokens"].item() == 3.0
