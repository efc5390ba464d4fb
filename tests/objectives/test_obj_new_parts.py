"""The parts added for parity with TRL / verl / OpenRLHF / ms-swift: one case computed by hand per part (the
numbers in the comments), a naive reference where the part is vectorised, and the construction rules.

Peer cross-checks: test_obj_peer_verl.py, test_obj_trl_crosscheck.py, test_obj_peer_naive.py; properties
(finite in → finite out, zero advantage → zero gradient): test_obj_properties.py.
"""

from __future__ import annotations

import math

import pytest
import torch
from obj_helpers import make_batch

from lmpo.objectives import Objective
from lmpo.objectives.parts.aggregation import aggregate
from lmpo.objectives.parts.credit import high_entropy_mask
from lmpo.objectives.parts.kl import KL_ESTIMATORS, kl_estimate


def t(*rows):
    return torch.tensor(rows, dtype=torch.float64)


def loss_and_grad(objective, logp, old, adv, mask=None, **kw):
    mask = torch.ones(logp.shape, dtype=torch.bool) if mask is None else mask
    leaf = logp.clone().requires_grad_()
    loss, stats = objective(leaf, old, adv, mask, **kw)
    (grad,) = torch.autograd.grad(loss, leaf)
    return loss.item(), grad, stats


def test_cispo_hand_case():
    # r = (0.5, −1) → ρ = (1.6487, 0.3679) → clip to [0.8, 1.28] → w = (1.28, 0.8); A = 2
    # ℓ = −w·A·logp = (−1.28·2·(−1), −0.8·2·(−2)) = (2.56, 3.2); token mean 2.88; ∇ = −w·A/2 = (−1.28, −0.8)
    obj = Objective.preset("cispo", eps_low=0.2, eps_high=0.28)
    loss, grad, stats = loss_and_grad(obj, t([-1.0, -2.0]), t([-1.5, -1.0]), t(2.0))
    assert loss == pytest.approx(2.88)
    torch.testing.assert_close(grad, t([-1.28, -0.8]))
    assert stats["clip/high_frac"].item() == stats["clip/low_frac"].item() == 0.5


def test_sapo_hand_case():
    # on-policy ρ = 1: gate σ(0)·4/τ = 2/τ, slope 4σ(1−σ) = 1 for any τ
    # A = 1, τ_pos = 1: ℓ = −2; A = −1, τ_neg = 2: ℓ = −(2/2)·(−1) = 1; ∇ = −A·1·ρ = (−1, 1); seq mean of 2 rows
    obj = Objective.preset("sapo", sapo_tau_pos=1.0, sapo_tau_neg=2.0)
    loss, grad, _ = loss_and_grad(obj, t([-1.0], [-2.0]), t([-1.0], [-2.0]), t(1.0, -1.0))
    assert loss == pytest.approx((-2.0 + 1.0) / 2)
    torch.testing.assert_close(grad, t([-0.5], [0.5]))


def test_gmpo_hand_case():
    # r = (0.6, −0.7), clip 0.4 in log space. A = +1: only the upper bound: r̃ = (0.4, −0.7), mean −0.15, s = e^−0.15,
    # ℓ = −s, ∇ = (0, −s/2). A = −1: only the lower bound: r̃ = (0.6, −0.4), mean 0.1, ℓ = +e^0.1, ∇ = (e^0.1/2, 0).
    obj = Objective.preset("gmpo")
    logp, old = t([-1.0, -2.0]), t([-1.6, -1.3])
    loss, grad, _ = loss_and_grad(obj, logp, old, t(1.0))
    s = math.exp(-0.15)
    assert loss == pytest.approx(-s)
    torch.testing.assert_close(grad, t([0.0, -s / 2]))
    loss, grad, _ = loss_and_grad(obj, logp, old, t(-1.0))
    assert loss == pytest.approx(math.exp(0.1))
    torch.testing.assert_close(grad, t([math.exp(0.1) / 2, 0.0]))


def test_vespo_hand_case():
    # r = (0.1, −0.3): log w = −0.2, w = 0.81873; A = 1 → k = 2, λ = 3:
    # log φ = 3 + 2·(−0.2) − 3·0.81873 = 0.14381, φ = 1.15467; ℓ = −φ·A·logp, token mean of logp (−1, −2): 1.5·φ
    obj = Objective.preset("vespo")
    loss, grad, stats = loss_and_grad(obj, t([-1.0, -2.0]), t([-1.1, -1.7]), t(1.0))
    phi = math.exp(3 - 0.4 - 3 * math.exp(-0.2))
    assert loss == pytest.approx(1.5 * phi)
    torch.testing.assert_close(grad, t([-phi / 2, -phi / 2]))
    assert stats["vespo/phi_mean"].item() == pytest.approx(phi)


def test_dppo_tv_and_kl_hand_case():
    # token 1: π 0.5 ← π_old 0.2, A > 0: moved up by 0.3 > δ_high = 0.2 → masked (TV); token 2: π 0.3 ← 0.2:
    # moved 0.1 → kept, weight min(ρ, c) = min(1.5, 20) = 1.5; ℓ = (0, −1.5·1·log 0.3), token mean
    logp, old = t([math.log(0.5), math.log(0.3)]), t([math.log(0.2), math.log(0.2)])
    loss, grad, stats = loss_and_grad(Objective.preset("dppo_tv"), logp, old, t(1.0))
    assert loss == pytest.approx(-1.5 * math.log(0.3) / 2)
    torch.testing.assert_close(grad, t([0.0, -0.75]))
    assert stats["clip/high_frac"].item() == 0.5 and stats["clip/low_frac"].item() == 0.0
    # binary KL of token 1: 0.2·log(0.2/0.5) + 0.8·log(0.8/0.5) = 0.19274 > 0.15 → masked; token 2:
    # 0.2·log(0.2/0.3) + 0.8·log(0.8/0.7) = 0.02573 → kept
    kl1 = 0.2 * math.log(0.2 / 0.5) + 0.8 * math.log((0.8 + 1e-8) / (0.5 + 1e-8))
    assert kl1 > 0.15
    loss, _, _ = loss_and_grad(Objective.preset("dppo_kl", dppo_high=0.15), logp, old, t(1.0))
    assert loss == pytest.approx(-1.5 * math.log(0.3) / 2)
    # a token that moved against A is never masked by the KL budget (π ≤ π_old where A > 0)
    loss, _, _ = loss_and_grad(Objective.preset("dppo_kl", dppo_high=1e-6), t([math.log(0.1)]), t([math.log(0.2)]),
                               t(1.0))
    assert loss == pytest.approx(-0.5 * math.log(0.1))


def test_dro_hand_case():
    # logp −1, old −1.5 (r = 0.5), A = 2, β = 0.5: ℓ = −(2·(−1) − ½·0.5·0.25) = 2.0625; ∇ = −(A − β·r) = −1.75
    loss, grad, _ = loss_and_grad(Objective.preset("dro", dro_beta=0.5), t([-1.0]), t([-1.5]), t(2.0))
    assert loss == pytest.approx(2.0625)
    torch.testing.assert_close(grad, t([-1.75]))


def test_high_entropy_mask_hand_case_and_quantile_reference():
    # valid entropies (0.1, 0.5, 0.9, 0.3); ρ = 0.5: the 0.5-quantile of (0.1, 0.3, 0.5, 0.9) is at rank 1.5:
    # 0.3 + 0.5·(0.5 − 0.3) = 0.4 → keep 0.5 and 0.9; the masked 7.0 is ignored
    h = t([0.1, 0.5, 0.9, 0.3, 7.0])
    valid = torch.tensor([[True, True, True, True, False]])
    got = high_entropy_mask(h, valid, valid.sum().double(), 0.5)
    torch.testing.assert_close(got, t([0.0, 1.0, 1.0, 0.0, 0.0]))
    for seed in range(3):  # the sort-based quantile equals torch.quantile on the valid entries
        g = torch.Generator().manual_seed(seed)
        h = torch.rand(5, 9, generator=g, dtype=torch.float64)
        valid = torch.rand(5, 9, generator=g) > 0.3
        for rho in (0.0, 0.2, 0.77, 1.0):
            q = torch.quantile(h[valid], 1 - rho)
            torch.testing.assert_close(high_entropy_mask(h, valid, valid.sum().double(), rho),
                                       ((h >= q) & valid).double())


def test_high_entropy_credit_keeps_only_the_top_tokens_gradient():
    logp, old, adv, mask = make_batch(seed=1)
    entropy = torch.rand(logp.shape, generator=torch.Generator().manual_seed(0), dtype=torch.float64)
    obj = Objective(trust_region="none", credit="high_entropy", entropy_top_frac=0.25)  # no clip: every kept token has a gradient
    _, grad, _ = loss_and_grad(obj, logp.detach(), old, adv, mask, entropy=entropy)
    kept = (grad != 0) & mask
    assert kept.sum().item() == pytest.approx(0.25 * mask.sum().item(), abs=1.0)
    assert entropy[kept].min() >= entropy[mask & ~kept].max()
    assert obj.needs == {"entropy"} and not obj.entropy_in_loss


def test_abs_and_low_var_kl_hand_case():
    # logp = −1, ref = −1.5: abs = 0.5; low_var_kl = k3 = e^{−0.5} + 0.5 − 1 = 0.10653 (below the ±10 clamp)
    logp, ref = t(-1.0), t(-1.5)
    assert kl_estimate(logp, ref, "abs").item() == pytest.approx(0.5)
    assert kl_estimate(logp, ref, "low_var_kl").item() == pytest.approx(math.exp(-0.5) - 0.5)
    # k3 = e^{13} − 14 ≈ 4.4e5 is clamped to 10 by low_var_kl, with no gradient there
    far = t(-14.0).requires_grad_()
    value = kl_estimate(far, t(-1.0), "low_var_kl")
    assert value.item() == 10.0 and torch.autograd.grad(value, far)[0].item() == 0.0


@pytest.mark.parametrize("name", list(KL_ESTIMATORS))
def test_kl_modifiers_hand_case(name):
    # k2 gradient: value of the estimator, gradient logp − ref = 0.5; ratio weighted: ρ·k with ρ = e^{0.2}
    logp, ref = t(-1.0).requires_grad_(), t(-1.5)
    part = KL_ESTIMATORS[name](kl_k2_grad=True)
    value = part.term(logp, ref, 20.0, None)
    assert value.item() == pytest.approx(kl_estimate(logp, ref, name).item())
    assert torch.autograd.grad(value, logp)[0].item() == pytest.approx(0.5)
    rho = torch.exp(logp - t(-1.2))
    weighted = KL_ESTIMATORS[name](kl_ratio_weighted=True).term(logp, ref, 20.0, rho)
    k = kl_estimate(logp, ref, name)
    dk = torch.autograd.grad(k, logp, retain_graph=True)[0]
    assert weighted.item() == pytest.approx(math.exp(0.2) * k.item())
    assert torch.autograd.grad(weighted, logp)[0].item() == pytest.approx(math.exp(0.2) * (dk.item() + k.item()))


def test_new_aggregations_hand_case():
    # rows [1, 2 | 3 masked], [4 | masked, masked]: token_sum = 7; seq_mean_token_sum_norm = 7 / (2·3)
    per_token = t([1.0, 2.0, 3.0], [4.0, 5.0, 6.0])
    m = t([1.0, 1.0, 0.0], [1.0, 0.0, 0.0])
    assert aggregate(per_token, m, "token_sum").item() == pytest.approx(7.0)
    assert aggregate(per_token, m, "seq_mean_token_sum_norm").item() == pytest.approx(7 / 6)
    assert aggregate(per_token, m, "seq_mean_token_sum_norm", norm_constant=7.0).item() == pytest.approx(0.5)


def probe_weights(mask, old, rollout, **kw):
    """The correction / rejection factor per token: on-policy with A = 1 and Σ −ρ·c·k, the gradient is −c·k."""
    probe = Objective(trust_region="none", aggregation="token_sum", **kw)
    _, grad, stats = loss_and_grad(probe, old, old, torch.ones(old.shape[0], dtype=old.dtype), mask,
                                   rollout_logp=rollout)
    return -grad, stats


def test_tis_and_mis_hand_case():
    # Δ = old − rollout = (0.5, −0.2, [masked]): ratios (1.6487, 0.8187)
    old, rollout = t([-1.0, -1.2, -3.0]), t([-1.5, -1.0, 9.0])
    mask = torch.tensor([[True, True, False]])
    w, stats = probe_weights(mask, old, rollout, correction="tis", is_max=1.5)
    torch.testing.assert_close(w, t([1.5, math.exp(-0.2), 0.0]))
    assert stats["rollout/truncated_frac"].item() == 0.5
    # k3 of KL(rollout ‖ old) = mean(e^Δ − Δ − 1) = ((e^0.5 − 1.5) + (e^−0.2 − 0.8)) / 2
    assert stats["rollout/kl_k3"].item() == pytest.approx((math.exp(0.5) - 1.5 + math.exp(-0.2) - 0.8) / 2)
    w, _ = probe_weights(mask, old, rollout, correction="tis", is_level="sequence", is_max=1.5)  # e^{0.3} = 1.3499
    torch.testing.assert_close(w, t([math.exp(0.3), math.exp(0.3), 0.0]))
    w, _ = probe_weights(mask, old, rollout, correction="tis", is_level="geometric", is_min=1.2)  # e^{0.15} → 1.2
    torch.testing.assert_close(w, t([1.2, 1.2, 0.0]))
    w, stats = probe_weights(mask, old, rollout, correction="mis", is_min=0.9, is_max=1.5)  # both outside
    torch.testing.assert_close(w, t([0.0, 0.0, 0.0]))
    assert stats["rollout/masked_frac"].item() == 1.0
    w, _ = probe_weights(mask, old, rollout, correction="mis", is_min=0.5, is_max=1.7)  # both kept, as ratios
    torch.testing.assert_close(w, t([math.exp(0.5), math.exp(-0.2), 0.0]))
    w, _ = probe_weights(mask, old, rollout, correction="tis", is_batch_normalize=True, is_max=None)
    mean = (math.exp(0.5) + math.exp(-0.2)) / 2
    torch.testing.assert_close(w, t([math.exp(0.5) / mean, math.exp(-0.2) / mean, 0.0]))


def test_divergence_rejection_hand_case():
    # Δ = (0.5, −0.2): k3 = (e^0.5 − 1.5, e^−0.2 − 0.8) = (0.14872, 0.01873), mean 0.08373
    old, rollout = t([-1.0, -1.2], [-1.0, -1.0]), t([-1.5, -1.0], [-1.01, -0.99])
    mask = torch.ones(2, 2, dtype=torch.bool)
    keep, stats = probe_weights(mask, old, rollout, rejection="divergence", rs_estimator="k3", rs_level="seq_mean",
                                rs_max=0.05)
    torch.testing.assert_close(keep, t([0.0, 0.0], [1.0, 1.0]))  # row 2: k3 ≈ 5e-5
    assert stats["rollout/rejected_frac"].item() == 0.5
    keep, _ = probe_weights(mask, old, rollout, rejection="divergence", rs_estimator="k3", rs_level="token",
                            rs_max=0.05)
    torch.testing.assert_close(keep, t([0.0, 1.0], [1.0, 1.0]))
    # k1 = −Δ is a log-ratio: keep log(1/1.3) ≤ −Δ ≤ log 1.3 (0.262): −0.5 and 0.2 → (0, 1)
    keep, _ = probe_weights(mask, old, rollout, rejection="divergence", rs_estimator="k1", rs_level="token", rs_max=1.3)
    torch.testing.assert_close(keep, t([0.0, 1.0], [1.0, 1.0]))
    keep, _ = probe_weights(mask, old, rollout, rejection="divergence", rs_estimator="k2", rs_level="seq_max",
                            rs_max=0.1)  # max ½Δ² = 0.125 > 0.1
    torch.testing.assert_close(keep, t([0.0, 0.0], [1.0, 1.0]))


def test_off_policy_sequence_mask_hand_case():
    # mean KL to the sampler: ((−0.8 + 1) + (−0.9 + 1)) / 2 = 0.15 > δ = 0.1: dropped where A < 0, kept where A ≥ 0
    logp, rollout = t([-1.0, -1.0], [-1.0, -1.0]), t([-0.8, -0.9], [-0.8, -0.9])
    obj = Objective(trust_region="none", aggregation="token_sum", rejection="off_policy_seq", opsm_delta=0.1)
    _, grad, stats = loss_and_grad(obj, logp, logp, t(2.0, -2.0), rollout_logp=rollout)
    torch.testing.assert_close(grad, t([-2.0, -2.0], [0.0, 0.0]))
    assert stats["rollout/rejected_frac"].item() == 0.5
    obj = obj.replace(opsm_delta=0.2)  # 0.15 ≤ 0.2: kept
    _, grad, _ = loss_and_grad(obj, logp, logp, t(2.0, -2.0), rollout_logp=rollout)
    torch.testing.assert_close(grad, t([-2.0, -2.0], [2.0, 2.0]))


def test_given_weights_multiply_the_policy_terms_only():
    logp, old, adv, mask = make_batch(seed=4)
    w = torch.rand(logp.shape, generator=torch.Generator().manual_seed(1), dtype=torch.float64) * 2
    ref = old - 0.2
    base = Objective.preset("grpo", kl_coef=0.1)
    got, _ = base.replace(correction="given")(logp, old, adv, mask, ref_logp=ref, rollout_is_weights=w)
    # positively homogeneous clipped terms: weights on the terms = weights folded into the advantages
    want, _ = base(logp, old, adv[:, None] * w, mask, ref_logp=ref)
    torch.testing.assert_close(got, want)


def test_composition_builds_and_refusals_name_both_fields():
    obj = Objective(level="sequence", trust_region="cispo", correction="tis", kl_estimator="low_var_kl", kl_coef=0.01,
                    rejection="off_policy_seq", credit="high_entropy")
    assert obj.needs == {"rollout_logp", "ref_logp", "entropy"}
    assert Objective(**obj.to_dict()) == obj
    with pytest.raises(ValueError, match=r"trust_region='vespo'.*level='sequence'.*set level='token'"):
        Objective(trust_region="vespo", level="sequence")
    with pytest.raises(ValueError, match=r"trust_region='dro'.*level='token_ema'"):
        Objective.preset("dro", level="token_ema")
    with pytest.raises(ValueError, match=r"is_min=2.0 must not exceed is_max=1.5"):
        Objective(correction="mis", is_min=2.0, is_max=1.5)
    with pytest.raises(ValueError, match=r"rs_level='seq_max' takes rs_estimator='k2' or 'k3'"):
        Objective(rejection="divergence", rs_estimator="k1", rs_level="seq_max")
    with pytest.raises(ValueError, match=r"rs_min=0.5 applies to rs_estimator='k1' only"):
        Objective(rejection="divergence", rs_min=0.5)
    with pytest.raises(ValueError, match=r"is_max=2.0 needs a rollout correction \(tis, mis\), but correction='none'"):
        Objective(is_max=2.0)
    with pytest.raises(ValueError, match=r"dual_clip=True needs a clipped trust region.*trust_region='cispo'"):
        Objective(trust_region="cispo", dual_clip=True)
    # switching the part drops the old part's own parameters, keeps shared ones
    assert Objective.preset("cispo").replace(trust_region="ppo").eps_high == 4.0
    assert Objective(correction="mis", is_mask_level="geometric").replace(correction="tis").is_max == 2.0


def test_missing_rollout_logp_is_reported_with_the_part():
    logp, old, adv, mask = make_batch()
    with pytest.raises(ValueError, match=r"rollout_logp is required by this objective \(correction='tis'\)"):
        Objective(correction="tis")(logp, old, adv, mask)


def test_composed_objective_trains_a_toy_policy_against_a_perturbed_sampler():
    """CISPO × sequence level × TIS × low_var_kl (+ OPSM): a categorical policy over 6 answers, sampled by a
    perturbed copy of itself (the sampler mismatch); reward 1 for answer 0. The loss decreases and the policy
    learns the rewarded answer, with the mismatch statistics non-zero."""
    torch.manual_seed(0)
    vocab, G, T = 6, 16, 4
    logits = torch.zeros(vocab, requires_grad=True)
    ref_logits = torch.zeros(vocab)
    obj = Objective(level="sequence", trust_region="cispo", eps_high=1.0, correction="tis", is_max=2.0,
                    kl_estimator="low_var_kl", kl_coef=0.01, rejection="off_policy_seq", opsm_delta=0.5,
                    aggregation="seq_mean_token_mean")
    opt = torch.optim.SGD([logits], lr=0.5)
    g = torch.Generator().manual_seed(1)
    first_p = None
    for _ in range(40):
        with torch.no_grad():
            sampler = torch.log_softmax(logits + 0.3 * torch.randn(vocab, generator=g), -1)  # the mismatch
            tokens = torch.multinomial(sampler.exp(), G * T, replacement=True, generator=g).view(G, T)
            reward = (tokens == 0).float().mean(-1)
            adv = (reward - reward.mean()) / (reward.std() + 1e-4)
            old = torch.log_softmax(logits, -1)[tokens]
        mask = torch.ones(G, T, dtype=torch.bool)
        for _ in range(2):  # two updates per batch: off-policy on the second
            logp = torch.log_softmax(logits, -1)[tokens]
            loss, stats = obj(logp, old, adv, mask, rollout_logp=sampler[tokens],
                              ref_logp=torch.log_softmax(ref_logits, -1)[tokens])
            opt.zero_grad()
            loss.backward()
            opt.step()
        if first_p is None:
            first_p = torch.softmax(logits, -1)[0].item()
    p = torch.softmax(logits.detach(), -1)
    assert p[0] > 0.8 > first_p and p.argmax().item() == 0
    assert stats["rollout/kl_k3"].item() > 0 and stats["loss/kl_ref"].item() > 0
