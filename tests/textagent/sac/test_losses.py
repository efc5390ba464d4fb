"""Analytic tests of the SAC losses (seed 004 implementation checklist + issue #6)."""

from __future__ import annotations

import math

import pytest
import torch

from lmpo.textagent.sac import losses as L


def _policy(B: int, A: int, seed: int, scale: float = 2.0, illegal_frac: float = 0.3):
    g = torch.Generator().manual_seed(seed)
    logits = torch.randn(B, A, generator=g) * scale
    legal = torch.rand(B, A, generator=g) > illegal_frac
    legal[:, 0] = True
    probs, logp = L.masked_policy(logits, legal)
    return logits, legal, probs, logp


def test_masked_policy_matches_textbook_and_ignores_illegal_logits():
    logits, legal, probs, logp = _policy(5, 11, seed=0)
    ref = torch.softmax(logits.masked_fill(~legal, float("-inf")), -1)
    torch.testing.assert_close(probs, ref * legal, atol=1e-7, rtol=1e-6)
    assert torch.all(probs[~legal] == 0)
    torch.testing.assert_close(probs.sum(-1), torch.ones(5))
    # invariance: garbage (huge, inf-free) logits at illegal positions change nothing
    garbage = logits.masked_fill(~legal, 1e6)
    probs2, logp2 = L.masked_policy(garbage, legal)
    torch.testing.assert_close(probs2, probs)
    # stability: a logit shift of 1e3 (exp would overflow without the max shift) changes nothing beyond
    # the float32 rounding of the shifted logits themselves (~6e-5 at 1e3)
    probs3, _ = L.masked_policy(logits + 1e3, legal)
    torch.testing.assert_close(probs3, probs, atol=2e-4, rtol=0)
    assert torch.isfinite(logp).all() and logp.min() >= math.log(1e-8) - 1e-6


@pytest.mark.parametrize("p", [0.5, 0.9, 0.98])
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_top_p_set_is_minimal_with_mass_at_least_p(p, seed):
    _, legal, probs, _ = _policy(16, 40, seed=seed)
    cand = L.top_p_set(probs, p=p, k_max=40)
    for b in range(16):
        pb = probs[b]
        # slow reference: sort, walk until mass >= p
        order = torch.argsort(pb, descending=True)
        mass, n = 0.0, 0
        while mass < p - 1e-9:
            mass += float(pb[order[n]])
            n += 1
        n = max(n, 1)
        assert int(cand.size[b]) == n
        members = cand.indices[b][cand.member[b]]
        assert float(pb[members].sum()) >= p - 1e-6
        # minimal: dropping the smallest member takes the mass below p
        assert float(pb[members].sum() - pb[members].min()) < p
        assert legal[b][members].all()
        torch.testing.assert_close(cand.probs[b].sum(), torch.tensor(1.0))  # renormalised
        torch.testing.assert_close(cand.coverage[b], pb[members].sum())


def test_top_p_hand_case_and_k_max_cap():
    # π = [0.5, 0.3, 0.15, 0.05]; p = 0.9 needs {0, 1, 2} (mass 0.95); π_p = [0.5, 0.3, 0.15] / 0.95
    probs = torch.tensor([[0.5, 0.3, 0.15, 0.05]])
    cand = L.top_p_set(probs, p=0.9, k_max=10)
    assert cand.indices[0, cand.member[0]].tolist() == [0, 1, 2]
    torch.testing.assert_close(cand.probs[0], torch.tensor([0.5, 0.3, 0.15]) / 0.95)
    torch.testing.assert_close(cand.coverage, torch.tensor([0.95]))
    assert not bool(cand.capped[0])
    capped = L.top_p_set(probs, p=0.9, k_max=2)  # cap: {0, 1}, coverage 0.8 < p
    assert capped.indices[0, capped.member[0]].tolist() == [0, 1]
    torch.testing.assert_close(capped.coverage, torch.tensor([0.8]))
    assert bool(capped.capped[0])


def test_top_p_one_equals_full_expectation():
    logits, legal, probs, logp = _policy(8, 30, seed=3)
    q = torch.randn(8, 30, generator=torch.Generator().manual_seed(9))
    alpha = 0.3
    cand = L.top_p_set(probs, p=1.0, k_max=30)
    v_top = L.soft_value(cand, q.gather(-1, cand.indices), alpha)
    v_full = ((probs * (q - alpha * logp)) * legal).sum(-1)  # textbook Σ_A π (Q − α log π)
    torch.testing.assert_close(v_top, v_full, atol=1e-5, rtol=1e-5)
    full = L.full_set(probs, logp, legal)
    torch.testing.assert_close(L.soft_value(full, q, alpha), v_full)
    lp_top, _ = L.policy_loss(cand, q.gather(-1, cand.indices), alpha)
    lp_full, _ = L.policy_loss(full, q, alpha)
    torch.testing.assert_close(lp_top, lp_full, atol=1e-5, rtol=1e-5)


def test_soft_value_hand_case():
    # one state, P = {a0, a1}, π_p = [0.75, 0.25], Q = [2, 1], α = 0.5
    # V = 0.75 (2 − 0.5 ln .75) + 0.25 (1 − 0.5 ln .25) = 1.75 + 0.10788 + 0.17329 = 2.03117
    probs = torch.tensor([[0.6, 0.2, 0.2]])
    cand = L.top_p_set(probs, p=0.75, k_max=3)  # {0} has 0.6 < .75 → {0, 1} (or {0, 2}: tie, mass .8)
    assert int(cand.size[0]) == 2
    v = L.soft_value(cand, torch.tensor([[2.0, 1.0]]), 0.5)
    expected = 0.75 * (2 - 0.5 * math.log(0.75)) + 0.25 * (1 - 0.5 * math.log(0.25))
    assert abs(float(v) - expected) < 1e-5 and abs(expected - 2.03117) < 1e-4


def test_terminal_target_is_reward_and_truncation_bootstraps():
    r = torch.tensor([0.7, -1.0, 0.2])
    v_next = torch.tensor([10.0, 5.0, -3.0])
    terminated = torch.tensor([True, False, False])  # row 1: truncated by the time limit (not terminated)
    y = L.soft_td_target(r, terminated, v_next, gamma=0.99)
    assert float(y[0]) == pytest.approx(0.7)  # exactly r: no bootstrap at termination
    assert float(y[1]) == pytest.approx(-1.0 + 0.99 * 5.0)  # truncation still bootstraps: 3.95
    assert float(y[2]) == pytest.approx(0.2 - 0.99 * 3.0)


def test_temperature_direction_and_clamp():
    log_alpha = torch.tensor(math.log(0.1))
    low_h = torch.tensor([0.5, 1.0])
    tgt = torch.tensor([2.0, 2.0])
    up = L.temperature_step(log_alpha, low_h, tgt, lr=0.1)
    # entropy 0.75 below target 2 by 1.25 ⇒ log α rises by 0.1 * 1.25
    assert float(up) == pytest.approx(math.log(0.1) + 0.125)
    down = L.temperature_step(log_alpha, torch.tensor([3.0, 3.0]), tgt, lr=0.1)
    assert float(down) < math.log(0.1)
    capped = L.temperature_step(torch.tensor(math.log(1.9)), low_h, tgt, lr=10.0)
    assert float(capped.exp()) == pytest.approx(2.0)
    floor = L.temperature_step(torch.tensor(math.log(2e-4)), torch.tensor([9.0]), torch.tensor([1.0]), lr=10.0)
    assert float(floor.exp()) == pytest.approx(1e-4)
    assert float(log_alpha) == pytest.approx(math.log(0.1))  # input untouched


def test_target_entropy():
    legal = torch.zeros(2, 10, dtype=torch.bool)
    legal[0, :4] = True
    legal[1, :] = True
    torch.testing.assert_close(L.target_entropy(legal, 0.9), torch.tensor([0.9 * math.log(4), 0.9 * math.log(10)]))


def test_cql_exact_hand_case_and_sampled_agrees():
    # Q = [1, 2, 3], all legal, data action 2 (Q=3): log(e + e² + e³) − 3 = 0.40761
    q = torch.tensor([[1.0, 2.0, 3.0]])
    legal = torch.ones(1, 3, dtype=torch.bool)
    exact = L.cql_exact(q, legal, torch.tensor([3.0]))
    assert float(exact) == pytest.approx(math.log(math.e + math.e**2 + math.e**3) - 3.0, abs=1e-6)
    # small Σ: sampled estimate (data action exact, the others sampled) agrees with the exact value
    g = torch.Generator().manual_seed(0)
    B, A = 6, 12
    q_all = torch.randn(B, A, generator=g)
    legal = torch.rand(B, A, generator=g) > 0.3
    legal[:, 0] = True
    data = torch.zeros(B, dtype=torch.long)
    q_data = q_all[:, 0]
    ex = L.cql_exact(q_all, legal, q_data)
    idx = L.sample_legal_actions(legal, 4000, generator=g, exclude=data)
    assert legal.gather(-1, idx).all() and (idx != 0).all()
    est = L.cql_sampled(q_all.gather(-1, idx), legal.sum(-1), q_data)
    torch.testing.assert_close(est, ex, atol=0.03, rtol=0.0)
    # constant Q: the estimator is exact for any S
    qc = torch.full((1, 5), 0.7)
    lc = torch.ones(1, 5, dtype=torch.bool)
    est_c = L.cql_sampled(qc[:, :2], lc.sum(-1), torch.tensor([0.7]))
    torch.testing.assert_close(est_c, L.cql_exact(qc, lc, torch.tensor([0.7])))
    # the data action is the only legal one: the term is exactly 0 (the exact term too)
    solo = torch.zeros(1, 5, dtype=torch.bool)
    solo[0, 3] = True
    idx_solo = L.sample_legal_actions(solo, 4, exclude=torch.tensor([3]))
    assert (idx_solo == 3).all()
    est_solo = L.cql_sampled(torch.full((1, 4), 9.0), solo.sum(-1), torch.tensor([1.5]))
    assert float(est_solo) == 0.0 and float(L.cql_exact(qc * 0 + 1.5, solo, torch.tensor([1.5]))) == 0.0


def test_cql_sampled_is_bounded_below_and_stops_pushing_a_dominant_data_action():
    # A uniform-sample logsumexp without the data action is unbounded below: with Q(a_data) far above the
    # sampled actions it goes to −∞ and its gradient on Q(a_data) stays −1 (the divergence seen in real
    # runs).  With a_data kept exact: term ≥ 0 and d term / d Q(a_data) = softmax share − 1 → 0.
    q_samples = torch.tensor([[0.0, -1.0, -2.0, 0.5]])
    count = torch.tensor([1000])
    for gap in (0.0, 5.0, 50.0, 500.0):
        q_data = torch.tensor([gap], requires_grad=True)
        term = L.cql_sampled(q_samples, count, q_data)
        (grad,) = torch.autograd.grad(term.sum(), q_data)
        assert float(term) >= 0.0
        if gap >= 50.0:
            assert float(term) < 1e-12 and abs(float(grad)) < 1e-12
    # hand case: Q_samples = [0, 0], |A| = 3, Q(a_data) = 0 → log(1 + (2/2)(1 + 1)) − 0 = log 3
    est = L.cql_sampled(torch.zeros(1, 2), torch.tensor([3]), torch.tensor([0.0]))
    assert float(est) == pytest.approx(math.log(3.0), abs=1e-6)


def test_critic_loss_huber_both_and_bc():
    q1 = torch.tensor([0.0, 3.0], requires_grad=True)
    q2 = torch.tensor([0.5, 0.0], requires_grad=True)
    y = torch.tensor([0.0, 0.0])
    loss, stats = L.critic_loss(q1, q2, y, huber_delta=1.0)
    # Huber(0)=0, Huber(3)=2.5 → mean 1.25; Huber(.5)=.125, Huber(0)=0 → mean .0625; total 1.3125
    assert float(loss.detach()) == pytest.approx(1.3125)
    assert float(stats["value/td_error_abs_max"]) == pytest.approx(3.0)
    logp = torch.log(torch.tensor([[0.5, 0.5], [0.25, 0.75]]))
    bc = L.bc_loss(logp, torch.tensor([0, 1]), torch.tensor([0.0, 1.0]))
    assert float(bc) == pytest.approx(-math.log(0.75))


def test_polyak_and_controller():
    a, b = torch.nn.Linear(2, 2), torch.nn.Linear(2, 2)
    before = b.weight.detach().clone()
    L.polyak_update(b, a, 0.1)
    torch.testing.assert_close(b.weight, 0.9 * before + 0.1 * a.weight.detach())
    c = L.TopPController(0.98, 8, k_limit=20)
    c.observe(0.5, capped_fraction=0.3)
    assert c.k_max == 10 and c.p == 0.98
    c.observe(0.5, capped_fraction=0.0)
    assert c.p == pytest.approx(0.985)
    c.observe(0.99, capped_fraction=0.5)  # coverage fine: nothing changes
    assert c.k_max == 10
