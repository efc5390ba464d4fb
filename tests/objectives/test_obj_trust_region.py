"""Trust regions (SPEC §1.2)."""

import math

import pytest
import torch
from obj_helpers import make_batch

from lmpo.objectives import Objective
from lmpo.objectives.parts import TRUST_REGIONS


def trust_region_loss(rho, adv, mode, **params):
    """The registered part's per-token term (the parts take only their own parameters)."""
    return TRUST_REGIONS[mode](**params).term(rho, adv, None)


def _loop_ppo(rho, adv, lo, hi, dual_c=None):
    out = torch.empty_like(rho)
    for i in range(rho.numel()):
        r, a = rho.view(-1)[i].item(), adv.view(-1)[i].item()
        val = -min(r * a, min(max(r, lo), hi) * a)
        if dual_c is not None and a < 0:
            val = min(val, -dual_c * a)
        out.view(-1)[i] = val
    return out


@pytest.mark.parametrize("seed", [0, 1, 2])
@pytest.mark.parametrize("dual", [False, True])
def test_clipped_modes_match_scalar_loop(seed, dual):
    g = torch.Generator().manual_seed(seed)
    rho = torch.exp(torch.randn(7, 9, generator=g, dtype=torch.float64) * 0.8)
    adv = torch.randn(7, 9, generator=g, dtype=torch.float64)
    loss = trust_region_loss(rho, adv, "clip_higher", eps_low=0.2, eps_high=0.28, dual_clip=dual).loss
    torch.testing.assert_close(loss, _loop_ppo(rho, adv, 0.8, 1.28, 3.0 if dual else None))
    loss = trust_region_loss(rho, adv, "ppo", eps_low=0.1, eps_high=0.1, dual_clip=dual, dual_clip_c=2.0).loss
    torch.testing.assert_close(loss, _loop_ppo(rho, adv, 0.9, 1.1, 2.0 if dual else None))


@pytest.mark.parametrize("dual", [False, True])
def test_clipped_form_matches_textbook_min_values_and_gradients(dual):
    g = torch.Generator().manual_seed(4)
    rho = torch.exp(torch.randn(9, 13, generator=g, dtype=torch.float64)).requires_grad_()
    adv = torch.randn(9, 13, generator=g, dtype=torch.float64) * 2
    cot = torch.rand(9, 13, generator=g, dtype=torch.float64)
    for mode, kw, lo, hi in (("ppo", dict(eps_low=0.2, eps_high=0.2), 0.8, 1.2),
                             ("clip_higher", dict(eps_low=0.2, eps_high=0.28), 0.8, 1.28)):
        fast = trust_region_loss(rho, adv, mode, dual_clip=dual, **kw).loss
        slow = torch.maximum(-rho * adv, -torch.clamp(rho, lo, hi) * adv)
        if dual:
            slow = torch.where(adv < 0, torch.minimum(slow, -3.0 * adv), slow)
        torch.testing.assert_close(fast, slow)
        torch.testing.assert_close(torch.autograd.grad(fast, rho, cot)[0], torch.autograd.grad(slow, rho, cot)[0])
    # sign_asym as the seed writes it: ε chosen by the sign of A inside a symmetric clip, then the min
    eps = torch.where(adv > 0, 0.28, 0.2)
    slow = -torch.minimum(rho * adv, torch.clamp(rho, 1 - eps, 1 + eps) * adv)
    fast = trust_region_loss(rho, adv, "sign_asym", eps_pos=0.28, eps_neg=0.2).loss
    torch.testing.assert_close(fast, slow)
    torch.testing.assert_close(torch.autograd.grad(fast, rho, cot)[0], torch.autograd.grad(slow, rho, cot)[0])


def test_sign_asym_equals_clip_higher_under_eps_mapping():
    for seed in range(3):
        logp, old, adv, mask = make_batch(seed=seed, drift=0.5, per_token_adv=True)
        a = Objective(trust_region="sign_asym", eps_pos=0.35, eps_neg=0.15)
        b = Objective(trust_region="clip_higher", eps_high=0.35, eps_low=0.15)
        la, sa = a(logp, old, adv, mask)
        lb, sb = b(logp, old, adv, mask)
        torch.testing.assert_close(la, lb)
        torch.testing.assert_close(torch.autograd.grad(la, logp)[0], torch.autograd.grad(lb, logp)[0])
        for key in ("clip/low_frac", "clip/high_frac"):
            torch.testing.assert_close(sa[key], sb[key])


def test_ptrw_gradient_sign_change_at_rho_rho_minus_one_equals_sigma_squared():
    sigma = 0.5
    root = (1 + math.sqrt(1 + 4 * sigma**2)) / 2  # ρ(ρ−1) = σ² → ρ ≈ 1.2071
    rho = torch.tensor([0.6, 1.0, root - 0.01, root + 0.01, 1.6], dtype=torch.float64, requires_grad=True)
    adv = torch.ones(5, dtype=torch.float64)
    loss = trust_region_loss(rho, adv, "gaussian", ptrw_sigma=sigma, ptrw_grad="full").loss
    (grad,) = torch.autograd.grad(loss.sum(), rho)
    # d(−φρA)/dρ = −φ(1 − ρ(ρ−1)/σ²): negative (ρ pushed up) below the root, positive above it
    assert (grad[:3] < 0).all() and (grad[3:] > 0).all()
    phi = torch.exp(-((rho.detach() - 1) ** 2) / (2 * sigma**2))
    torch.testing.assert_close(grad, -phi * (1 - rho.detach() * (rho.detach() - 1) / sigma**2))
    loss = trust_region_loss(rho, adv, "gaussian", ptrw_sigma=sigma, ptrw_grad="detach_phi").loss
    (grad,) = torch.autograd.grad(loss.sum(), rho)
    torch.testing.assert_close(grad, -phi)  # a pure weight, never sign-flipped


def test_hand_case_ppo_and_dual_clip():
    # ρ = 1.5, A = 1: clipped at 1.2 → loss −1.2. ρ = 0.5, A = −1: max(0.5, 0.8)·1 → 0.8.
    # ρ = 5, A = −1: unclipped −ρA = 5, dual clip caps at 3.
    rho = torch.tensor([1.5, 0.5, 5.0])
    adv = torch.tensor([1.0, -1.0, -1.0])
    loss = trust_region_loss(rho, adv, "ppo", eps_low=0.2, eps_high=0.2).loss
    torch.testing.assert_close(loss, torch.tensor([-1.2, 0.8, 5.0]))
    loss = trust_region_loss(rho, adv, "ppo", eps_low=0.2, eps_high=0.2, dual_clip=True).loss
    torch.testing.assert_close(loss, torch.tensor([-1.2, 0.8, 3.0]))
    loss = trust_region_loss(rho, adv, "none").loss
    torch.testing.assert_close(loss, torch.tensor([-1.5, 0.5, 5.0]))


def test_clip_fraction_stats_count_only_active_side():
    # token level, 4 valid tokens: ρ = 1.5 (A>0, high clip), 1.5 (A<0: not active), 0.5 (A<0, low), 1.0
    logp = torch.log(torch.tensor([[1.5, 1.5, 0.5, 1.0, 9.0]])).requires_grad_()
    old = torch.zeros(1, 5)
    adv = torch.tensor([[1.0, -1.0, -1.0, 1.0, 1.0]])
    mask = torch.tensor([[1, 1, 1, 1, 0]], dtype=torch.float32)
    _, stats = Objective(trust_region="ppo")(logp, old, adv, mask)
    assert stats["clip/high_frac"].item() == pytest.approx(0.25)
    assert stats["clip/low_frac"].item() == pytest.approx(0.25)
    assert stats["ratio/max"].item() == pytest.approx(1.5) and stats["ratio/min"].item() == pytest.approx(0.5)
    assert stats["ratio/mean"].item() == pytest.approx(1.125)


def test_sequence_level_clip_stats_are_per_sequence():
    # 3 sequences of very different lengths; only the short one (A>0) is clipped high: 1/3, not a token share
    logp = torch.zeros(3, 6, requires_grad=True)
    old = torch.zeros(3, 6)
    old[0, 0] = -0.3  # s = exp(0.3/1) for the 1-token row
    mask = torch.zeros(3, 6, dtype=torch.bool)
    mask[0, 0] = True
    mask[1] = True
    mask[2, :3] = True
    adv = torch.tensor([1.0, 1.0, -1.0])
    _, stats = Objective(level="sequence", eps_low=3e-4, eps_high=4e-4)(logp, old, adv, mask)
    assert stats["clip/high_frac"].item() == pytest.approx(1 / 3)
    assert stats["clip/low_frac"].item() == 0.0


def _ratios(rows, dtype=torch.float64):
    """(logp, old_logp) whose token ratios are ``rows`` (old log-prob log 0.1 everywhere)."""
    rho = torch.tensor(rows, dtype=dtype)
    old = torch.full_like(rho, math.log(0.1))
    return (old + rho.log()).requires_grad_(), old


def test_clipped_trust_region_reports_its_clip_and_dual_clip_fractions():
    """Four tokens with A = −1 and ratios 0.5, 1, 4, 5 under ppo (ε = 0.2) with dual clip c = 3: the lower bound
    0.8 binds at the first token (1/4), no upper bound binds for A < 0, the dual clip at the last two (2/4)."""
    logp, old = _ratios([[0.5, 1.0, 4.0, 5.0]])
    mask = torch.ones(1, 4, dtype=torch.bool)
    adv = torch.tensor([-1.0], dtype=torch.float64)
    _, stats = Objective(trust_region="ppo", dual_clip=True, dual_clip_c=3.0)(logp, old, adv, mask)
    assert stats["clip/low_frac"].item() == 0.25 and stats["clip/high_frac"].item() == 0.0
    assert stats["clip/region_frac"].item() == 0.25 and stats["clip/dual_frac"].item() == 0.5
    _, stats = Objective(trust_region="ppo")(logp, old, adv, mask)
    assert "clip/dual_frac" not in stats and stats["clip/low_frac"].item() == 0.25


def test_gaussian_reports_its_mean_trust_weight_per_token_and_per_sequence():
    """φ(ρ) = exp(−(ρ−1)²/(2·0.5²)): φ(1) = 1 and φ(1.5) = e^{−1/2}, so the mean over the two valid tokens is
    (1 + e^{−1/2})/2; a masked token with ratio 7 does not count. At the sequence level with constant ratios per
    row the sequence ratios are 1 and 1.5 and the mean runs over the two non-empty sequences: the same value."""
    want = (1.0 + math.exp(-0.5)) / 2
    logp, old = _ratios([[1.0, 1.5, 7.0]])
    mask = torch.tensor([[True, True, False]])
    _, stats = Objective(trust_region="gaussian")(logp, old, torch.tensor([1.0], dtype=torch.float64), mask)
    assert stats["ptrw/phi_mean"].item() == pytest.approx(want, rel=1e-12)
    logp, old = _ratios([[1.0, 1.0], [1.5, 1.5], [2.0, 2.0]])
    mask = torch.tensor([[True, True], [True, True], [False, False]])
    adv = torch.tensor([1.0, -1.0, 1.0], dtype=torch.float64)
    _, stats = Objective(level="sequence", trust_region="gaussian")(logp, old, adv, mask)
    assert stats["ptrw/phi_mean"].item() == pytest.approx(want, rel=1e-12)
