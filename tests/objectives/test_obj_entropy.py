"""Entropy control (SPEC §1.4): static bonus, adaptive controller, clip_cov, kl_cov."""

import math

import pytest
import torch
from obj_helpers import aggregate_loop, make_batch

from lmpo.objectives import AdaptiveEntropyController, Objective
from lmpo.objectives.parts import covariance
from lmpo.objectives.parts.covariance import clip_cov_selection, flat_topk, kl_cov_selection, token_covariance


def test_controller_follows_skywork_rule_step_by_step():
    ctl = AdaptiveEntropyController(target=0.2, delta=0.005, coef_min=0.0, coef_max=0.012, coef_init=0.0)
    # e:            0.1    0.1    0.3    0.2    0.1    0.1    0.1    0.5
    # c after:      .005   .010   .005   .005   .010   .012   .012   .007   (clipped at hi = 0.012)
    # applied c·1[e ≤ 0.2] (next step, gate from the same e): .005 .010 0 .005 .010 .012 .012 0
    seq_e = [0.1, 0.1, 0.3, 0.2, 0.1, 0.1, 0.1, 0.5]
    seq_c = [0.005, 0.010, 0.005, 0.005, 0.010, 0.012, 0.012, 0.007]
    seq_coef = [0.005, 0.010, 0.0, 0.005, 0.010, 0.012, 0.012, 0.0]
    assert ctl.coef == 0.0
    for e, c, coef in zip(seq_e, seq_c, seq_coef):
        assert ctl.update(e) == pytest.approx(coef)
        assert ctl.c == pytest.approx(c) and ctl.coef == pytest.approx(coef)
    assert ctl.coef_for(0.19) == pytest.approx(0.007) and ctl.coef_for(0.21) == 0.0
    # never below the floor
    for _ in range(10):
        ctl.update(1.0)
    assert ctl.c == 0.0


def test_controller_state_dict_round_trip_and_validation():
    ctl = AdaptiveEntropyController()
    for e in (0.1, 0.05, 0.3):
        ctl.update(e)
    other = AdaptiveEntropyController()
    other.load_state_dict(ctl.state_dict())
    assert other.state_dict() == ctl.state_dict()
    assert other.update(0.1) == ctl.update(0.1)
    with pytest.raises(ValueError, match="entropy_coef_init"):
        AdaptiveEntropyController(coef_init=2.0)
    with pytest.raises(ValueError, match="mean_entropy"):
        ctl.update(float("nan"))
    assert Objective.preset("adaptive_entropy").make_entropy_controller().target == 0.2
    assert Objective.preset("grpo").make_entropy_controller() is None


def test_static_entropy_bonus_aggregated_like_loss():
    logp, old, adv, mask = make_batch(seed=1)
    ent = torch.rand(logp.shape, dtype=torch.float64, requires_grad=True)
    base, _ = Objective(aggregation="token_mean")(logp, old, adv, mask)
    loss, stats = Objective(aggregation="token_mean", entropy_coef=0.1)(logp, old, adv, mask, entropy=ent)
    torch.testing.assert_close(loss - base, -0.1 * aggregate_loop(ent, mask, "token_mean"))
    (g,) = torch.autograd.grad(loss, ent)
    torch.testing.assert_close(g, -0.1 * mask.double() / mask.sum())
    torch.testing.assert_close(stats["entropy/mean"], (ent * mask).sum().detach() / mask.sum())
    # the call-time coefficient (the controller's) overrides the static one
    loss2, _ = Objective(aggregation="token_mean", entropy_coef=0.1)(logp, old, adv, mask, entropy=ent,
                                                                      entropy_coef=0.0)
    torch.testing.assert_close(loss2, base)


def _cov_batch(seed=0, batch=16, length=64):
    logp, old, _, mask = make_batch(batch=batch, length=length, seed=seed, drift=0.0)
    g = torch.Generator().manual_seed(seed + 100)
    adv = torch.randn(batch, generator=g, dtype=torch.float64) * 3.0  # wide advantages → many cov in (1, 5)
    return logp, old, adv, mask


def test_covariance_hand_case():
    # valid logp = [−1, −3], A = [2, 0]: means −2 and 1 → cov = [(1)(1), (−1)(−1)] = [1, 1]
    logp = torch.tensor([[-1.0, -3.0, 9.0]])
    adv = torch.tensor([[2.0, 0.0, 5.0]])
    m = torch.tensor([[1.0, 1.0, 0.0]])
    torch.testing.assert_close(token_covariance(logp, adv, m, m.sum()), torch.tensor([[1.0, 1.0, 0.0]]))


def test_clip_cov_zeroes_exactly_the_selected_tokens_and_is_reproducible():
    logp, old, adv, mask = _cov_batch()
    obj = Objective(cov_control="clip_cov", clip_cov_ratio=0.02, aggregation="token_mean")
    base = Objective(aggregation="token_mean")
    m = mask.double()
    n = m.sum()
    cov = token_covariance(logp.detach(), adv[:, None], m, n)
    chosen = clip_cov_selection(cov, mask, torch.zeros_like(mask), n, ratio=0.02, lb=1.0, ub=5.0,
                                generator=torch.Generator().manual_seed(5))
    assert chosen.sum().item() == max(1, int(0.02 * n.item()))
    assert ((cov[chosen] > 1) & (cov[chosen] < 5)).all() and mask[chosen].all()
    loss, stats = obj(logp, old, adv, mask, generator=torch.Generator().manual_seed(5))
    (grad,) = torch.autograd.grad(loss, logp)
    (g_base,) = torch.autograd.grad(base(logp, old, adv, mask)[0], logp)
    torch.testing.assert_close(grad, torch.where(chosen, 0.0, g_base))
    assert stats["cov/clipped_tokens"].item() == chosen.sum().item()
    again, _ = obj(logp, old, adv, mask, generator=torch.Generator().manual_seed(5))
    torch.testing.assert_close(again, loss)
    other, _ = obj(logp, old, adv, mask, generator=torch.Generator().manual_seed(6))
    assert other.item() != loss.item()


def test_clip_cov_selection_is_uniform_over_candidates_and_skips_trust_clipped():
    cov = torch.tensor([[2.0, 2.0, 2.0, 9.0, 0.5, 2.0]])
    valid = torch.tensor([[True, True, True, True, True, False]])
    clipped = torch.tensor([[False, False, True, False, False, False]])
    counts = torch.zeros(6)
    gen = torch.Generator().manual_seed(0)
    for _ in range(600):
        counts += clip_cov_selection(cov, valid, clipped, torch.tensor(5.0), ratio=0.2, lb=1, ub=5,
                                     generator=gen)[0].double()
    # only tokens 0 and 1 are candidates (2 is trust-clipped, 3 and 4 out of (1,5), 5 invalid); 1 pick each
    assert counts[2:].sum() == 0 and counts.sum() == 600
    assert 240 < counts[0] < 360
    none = clip_cov_selection(cov * 0, valid, clipped, torch.tensor(5.0), ratio=0.2, lb=1, ub=5)
    assert not none.any()  # no candidates: nothing is zeroed


def test_kl_cov_penalises_exactly_top_k():
    logp, old, adv, mask = _cov_batch(seed=1)
    old = logp.detach() + 0.05 * torch.randn(logp.shape, generator=torch.Generator().manual_seed(0),
                                             dtype=torch.float64)
    m = mask.double()
    n = m.sum()
    obj = Objective(cov_control="kl_cov", kl_cov_frac=0.01, kl_cov_coef=1.0, trust_region="none",
                    aggregation="token_mean")
    base = Objective(trust_region="none", aggregation="token_mean")
    loss, stats = obj(logp, old, adv, mask)
    base_loss, _ = base(logp, old, adv, mask)
    cov = token_covariance(logp.detach(), adv[:, None], m, n)
    k = max(1, int(0.01 * n.item()))
    top = torch.zeros(mask.numel(), dtype=torch.bool)
    top[torch.where(mask, cov, -torch.inf).view(-1).topk(k).indices] = True
    top = top.view(mask.shape)
    torch.testing.assert_close(top, kl_cov_selection(cov, mask, n, fraction=0.01))
    expected = base_loss + ((logp - old).abs() * top).sum() / n
    torch.testing.assert_close(loss, expected)
    assert stats["cov/penalised_tokens"].item() == k
    # on-policy (logp == old_logp) the penalty is inert in value and gradient
    on, _ = obj(logp, logp.detach(), adv, mask)
    on_base, _ = base(logp, logp.detach(), adv, mask)
    torch.testing.assert_close(on, on_base)
    torch.testing.assert_close(torch.autograd.grad(on, logp)[0], torch.autograd.grad(on_base, logp)[0])


def test_cov_statistics():
    logp, old, adv, mask = _cov_batch(seed=2)
    m = mask.double()
    n = m.sum()
    _, stats = Objective(cov_control="clip_cov")(logp, old, adv, mask, generator=torch.Generator().manual_seed(0))
    cov = token_covariance(logp.detach(), adv[:, None], m, n)
    torch.testing.assert_close(stats["cov/mean"], cov.sum() / n)
    k = max(1, int(2e-4 * n.item()))
    torch.testing.assert_close(stats["cov/top_mean"], cov[mask].topk(k).values.mean())


@pytest.mark.parametrize("seed", range(24))
def test_flat_topk_selects_what_a_topk_over_all_entries_selects(seed):
    """The block partial selection returns the top-k entries of a plain ``topk`` over the flat tensor: the same
    values in the same order and the same set of indices (ties may come in another order), on shapes where the
    blocks apply (a tail included), where they do not, and with fill values repeated many times."""
    g = torch.Generator().manual_seed(seed)
    B, T = int(torch.randint(1, 70, (1,), generator=g)), int(torch.randint(1, 5000, (1,), generator=g))
    x = torch.rand(B, T, generator=g, dtype=torch.float64 if seed % 2 else torch.float32)
    if seed % 4 == 3:  # invalid positions at the dtype's lowest value, as clip_cov's covariances hold them
        x[torch.rand(B, T, generator=g) < 0.4] = torch.finfo(x.dtype).min
    k = max(1, int(B * T * (2e-4, 2e-3, 0.01)[seed % 3]))
    values, index = x.reshape(-1).topk(k)
    got_values, got_index = flat_topk(x, k)
    assert torch.equal(got_values, values)
    assert set(got_index.tolist()) == set(index.tolist())
    assert torch.equal(x.reshape(-1)[got_index], got_values)


@pytest.mark.parametrize("seed", range(6))
def test_clip_cov_and_kl_cov_select_the_tokens_a_full_topk_selects(seed, monkeypatch):
    """kl_cov's picks and ``cov/top_mean`` are those of one ``topk`` over all B·T entries, the selection before
    the partial selection replaced it (a benchmark-sized batch: the blocks apply); clip_cov's systematic pick
    uses no top-k and must not change either."""
    g = torch.Generator().manual_seed(seed)
    B, T = 16, 2048
    logp = -torch.rand(B, T, generator=g) * 4.0
    mask = torch.arange(T)[None, :] < torch.randint(T // 4, T + 1, (B, 1), generator=g)
    adv = torch.randn(B, 1, generator=g) * 2.0 * mask
    m, n = mask.float(), mask.float().sum()
    cov = token_covariance(logp * m, adv, m, n)
    cov = cov.add_(m - 1.0, alpha=-torch.finfo(cov.dtype).min)

    def picks():
        clip = clip_cov_selection(cov, None, None, n, ratio=2e-4, lb=1.0, ub=5.0,
                                  generator=torch.Generator().manual_seed(seed))
        return (clip, kl_cov_selection(cov, mask, n, fraction=2e-3)), covariance.top_fraction_mean(cov, n)

    (clip, kl), top = picks()
    monkeypatch.setattr(covariance, "flat_topk", lambda x, k: x.reshape(-1).topk(k))
    (clip_ref, kl_ref), top_ref = picks()
    assert clip.any() and torch.equal(clip, clip_ref)
    assert kl.sum() == max(1, int(2e-3 * n.item())) and torch.equal(kl, kl_ref)
    assert torch.equal(top, top_ref)


def _clip_cov_pick_reference(cov, num_valid, trust_free, *, ratio, lb, ub, generator):
    """clip_cov's systematic pick written plainly: list the candidates (lb < cov < ub, not trust-clipped) in flat
    order, K = max(1, ⌊r·N⌋), step s = C / K, and take the ranks ⌊(u + i)·s⌋ for i < K (all of them when C ≤ K),
    u the one uniform number drawn from the generator."""
    flat, free = cov.reshape(-1).tolist(), trust_free.reshape(-1).tolist()
    cands = [j for j, (c, f) in enumerate(zip(flat, free)) if lb < c < ub and f == 1.0]
    k = max(1, math.floor(float(num_valid) * ratio))
    u = torch.rand((), generator=generator, dtype=torch.float64).item()
    if len(cands) <= k:
        chosen = cands
    else:
        step = len(cands) / k
        chosen = [cands[math.floor((i + u) * step)] for i in range(k)]
    picked = torch.zeros(cov.numel(), dtype=torch.bool)
    picked[chosen] = True
    return picked.view(cov.shape), len(chosen)


@pytest.mark.parametrize("seed", range(8))
def test_clip_cov_pick_zeroes_the_systematic_sample(seed):
    g = torch.Generator().manual_seed(seed)
    B, T = 32, 2048
    cov = torch.randn(B, T, generator=g) * 3.0
    m = (torch.rand(B, T, generator=g) < 0.7).float()
    cov.add_(m - 1.0, alpha=-torch.finfo(cov.dtype).min)  # invalid positions at the lowest float, as in apply
    cov.view(-1)[:6] = torch.tensor([1.0, 5.0, 1.0000001, 4.9999995, 0.9999999, 5.0000005])  # the open bounds
    trust_free = (torch.rand(B, T, generator=g) < 0.9).float()
    ratio = (2e-4, 2e-3, 0.05)[seed % 3]  # 0.05: fewer candidates than picks, every candidate is zeroed
    index, keep = covariance.clip_cov_pick(cov, None, None, m.sum(), ratio=ratio, lb=1.0, ub=5.0,
                                           generator=torch.Generator().manual_seed(seed), trust_free=trust_free)
    picked = torch.zeros(cov.numel(), dtype=torch.bool)
    picked[index[keep]] = True
    want, k = _clip_cov_pick_reference(cov, m.sum(), trust_free, ratio=ratio, lb=1.0, ub=5.0,
                                       generator=torch.Generator().manual_seed(seed))
    assert want.any() and torch.equal(picked.view(cov.shape), want)
    assert int(keep.sum()) == k == len(set(index[keep].tolist()))  # exactly K distinct tokens (or all C)


def test_clip_cov_pick_zeroes_every_candidate_with_probability_k_over_c():
    """The inclusion probability of the uniform draw it replaces: K / C for every candidate, also when the step
    C / K is not a whole number; exactly K distinct picks per draw."""
    cov = torch.full((1, 40), 9.0)
    cand = torch.tensor([0, 3, 4, 5, 11, 12, 20, 21, 22, 30, 38])  # C = 11
    cov[0, cand] = 2.0
    n, ratio, draws = torch.tensor(40.0), 0.1, 4000  # K = 4, step 2.75
    counts = torch.zeros(40)
    gen = torch.Generator().manual_seed(0)
    for _ in range(draws):
        index, keep = covariance.clip_cov_pick(cov, None, None, n, ratio=ratio, lb=1.0, ub=5.0, generator=gen)
        assert int(keep.sum()) == 4 and len(set(index[keep].tolist())) == 4
        counts[index[keep]] += 1
    assert counts.sum() == 4 * draws and counts[cand].sum() == 4 * draws
    p = counts[cand] / draws
    sd = (4 / 11 * (1 - 4 / 11) / draws) ** 0.5
    assert ((p - 4 / 11).abs() < 4.5 * sd).all(), p
