"""Cross-checks against verl 0.9.1's own functions on the same float64 tensors: value and gradient, max abs diff
≤ 1e-6 (the real installed verl, no re-implementation).

- policy losses ``cispo``, ``sapo``, ``geo_mean`` (GMPO), ``dppo_tv``, ``dppo_kl``, ``dro`` under every
  ``loss_agg_mode`` they honour (``core_algos.compute_policy_loss_*``);
- KL penalties ``k1``, ``abs``, ``k2``/``mse``, ``low_var_kl``/``k3`` and their ``+`` (k2-gradient) forms
  (``core_algos.kl_penalty``) and the aggregated KL term;
- the new aggregations (``core_algos.agg_loss``: ``token-sum``, ``seq-mean-token-sum-norm``);
- rollout correction: ``rollout_corr_helper.compute_rollout_correction_weights`` (token / sequence × TIS /
  IcePop × batch normalisation) applied through ``vanilla``, and ``compute_rollout_rejection_mask`` for every
  ``rollout_rs`` option.
"""

from __future__ import annotations

import pytest
import torch
from verl.trainer.ppo import core_algos as verl
from verl.trainer.ppo.rollout_corr_helper import (
    compute_rollout_correction_weights,
    compute_rollout_rejection_mask,
)
from verl.workers.config import ActorConfig, PolicyLossConfig

from lmpo.objectives import Objective
from lmpo.objectives.parts.aggregation import aggregate

TOL = dict(rtol=0.0, atol=1e-6)
MODES = ("token-mean", "token-sum", "seq-mean-token-mean", "seq-mean-token-sum", "seq-mean-token-sum-norm")
LMPO_AGG = {"token-mean": "token_mean", "token-sum": "token_sum", "seq-mean-token-mean": "seq_mean_token_mean",
            "seq-mean-token-sum": "seq_mean_token_sum", "seq-mean-token-sum-norm": "seq_mean_token_sum_norm"}


def config(clip_low=0.2, clip_high=0.2, mode="token-mean", **extra):
    policy_loss = {k: extra.pop(k) for k in list(extra) if k in ("dro_beta",)}
    return ActorConfig(strategy="fsdp", rollout_n=1, ppo_micro_batch_size_per_gpu=1, clip_ratio=clip_low,
                       clip_ratio_low=clip_low, clip_ratio_high=clip_high, loss_agg_mode=mode,
                       policy_loss=PolicyLossConfig(**policy_loss), **extra)


def batch(seed, B=8, T=16, noise=0.4, per_token_adv=False):
    """float64 verl inputs; one empty row (verl counts non-empty rows only), A broadcast per sequence."""
    g = torch.Generator().manual_seed(seed)
    lengths = torch.randint(1, T + 1, (B,), generator=g)
    lengths[-1] = 0
    mask = torch.arange(T).unsqueeze(0) < lengths.unsqueeze(1)
    old = -torch.rand(B, T, generator=g, dtype=torch.float64) * 3 - 0.01
    logp = old + noise * torch.randn(B, T, generator=g, dtype=torch.float64)
    adv = (torch.randn(B, T, generator=g, dtype=torch.float64) if per_token_adv
           else torch.randn(B, 1, generator=g, dtype=torch.float64).expand(B, T).clone())
    return old, logp, adv, mask


def normalisers(mode, mask):
    """What verl's agg_loss uses without global batch info: the micro-batch's non-empty rows, valid tokens."""
    if mode.startswith("seq"):
        return {"num_seqs": (mask.sum(-1) > 0).sum().to(torch.float64)}
    return {}


def grad_of(fn, logp):
    leaf = logp.clone().requires_grad_()
    loss = fn(leaf)
    loss = loss[0] if isinstance(loss, tuple) else loss
    (grad,) = torch.autograd.grad(loss, leaf)
    return loss.detach(), grad


def assert_same(ours, theirs, logp):
    v1, g1 = grad_of(ours, logp)
    v2, g2 = grad_of(theirs, logp)
    torch.testing.assert_close(v1, v2, **TOL)
    torch.testing.assert_close(g1, g2, **TOL)
    assert g2.abs().sum() > 0


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("per_token_adv", [False, True])
def test_cispo_equals_verl(mode, per_token_adv):
    old, logp, adv, mask = batch(1, per_token_adv=per_token_adv)
    cfg = config(0.2, 0.28, mode)
    obj = Objective(trust_region="cispo", eps_low=0.2, eps_high=0.28, aggregation=LMPO_AGG[mode],
                    norm_constant=16.0 if mode.endswith("norm") else None)
    assert_same(lambda lp: obj(lp, old, adv, mask, **normalisers(mode, mask))[0],
                lambda lp: verl.compute_policy_loss_cispo(old, lp, adv, mask, mode, cfg), logp)
    ratio = torch.exp(logp - old)
    clipped = ((ratio < 0.8) | (ratio > 1.28)) & mask
    assert 0 < clipped.sum() < mask.sum()  # both regimes exercised


@pytest.mark.parametrize("per_token_adv", [False, True])
def test_sapo_equals_verl(per_token_adv):
    old, logp, adv, mask = batch(2, noise=0.8, per_token_adv=per_token_adv)
    cfg = config(mode="seq-mean-token-mean", tau_pos=1.3, tau_neg=1.7)
    obj = Objective.preset("sapo", sapo_tau_pos=1.3, sapo_tau_neg=1.7)
    assert_same(lambda lp: obj(lp, old, adv, mask, **normalisers("seq-mean-token-mean", mask))[0],
                lambda lp: verl.compute_policy_loss_sapo(old, lp, adv, mask, "seq-mean-token-mean", cfg), logp)


@pytest.mark.parametrize("per_token_adv", [False, True])
def test_gmpo_equals_verl_geo_mean(per_token_adv):
    """verl's geo_mean: sign-aware log-space clip before the geometric mean; a plain mean over rows."""
    old, logp, adv, mask = batch(3, noise=0.5, per_token_adv=per_token_adv)
    cfg = config(0.3, 0.4)
    obj = Objective.preset("gmpo", log_clip_low=0.3, log_clip_high=0.4)
    assert_same(lambda lp: obj(lp, old, adv, mask)[0],
                lambda lp: verl.compute_policy_loss_geo_mean(old, lp, adv, mask, "token-mean", cfg), logp)
    r = logp - old
    assert (((r > 0.4) & (adv > 0) & mask).any() and ((r < -0.3) & (adv < 0) & mask).any())  # clips bind


@pytest.mark.parametrize("name", ["dppo_tv", "dppo_kl"])
@pytest.mark.parametrize("mode", ["token-mean", "seq-mean-token-mean"])
def test_dppo_equals_verl(name, mode):
    old, logp, adv, mask = batch(4, noise=0.6)
    cfg = config(0.05, 0.08, mode, clip_ratio_c=1.5)
    obj = Objective.preset(name, dppo_low=0.05, dppo_high=0.08, dppo_is_cap=1.5, aggregation=LMPO_AGG[mode])
    fn = getattr(verl, f"compute_policy_loss_{name}")
    assert_same(lambda lp: obj(lp, old, adv, mask, **normalisers(mode, mask))[0],
                lambda lp: fn(old, lp, adv, mask, mode, cfg), logp)
    _, metrics = fn(old, logp, adv, mask, mode, cfg)
    _, stats = obj(logp, old, adv, mask, **normalisers(mode, mask))
    assert stats["clip/region_frac"].item() == pytest.approx(metrics["actor/pg_clipfrac"], abs=1e-6)
    assert 0 < metrics["actor/pg_clipfrac"] < 1 and metrics["actor/pg_clipfrac_lower"] > 0


@pytest.mark.parametrize("mode", ["token-mean", "seq-mean-token-sum"])
def test_dro_equals_verl(mode):
    old, logp, adv, mask = batch(5)
    cfg = config(mode=mode, dro_beta=0.3)
    obj = Objective.preset("dro", dro_beta=0.3, aggregation=LMPO_AGG[mode])
    assert_same(lambda lp: obj(lp, old, adv, mask, **normalisers(mode, mask))[0],
                lambda lp: verl.compute_policy_loss_dro(old, lp, adv, mask, mode, cfg), logp)


KL_PAIRS = [("k1", "k1", False), ("abs", "abs", False), ("k2", "mse", False), ("low_var_kl", "low_var_kl", False),
            ("low_var_kl", "k3", False), ("k1", "k1+", True), ("abs", "abs+", True), ("low_var_kl", "k3+", True),
            ("low_var_kl", "low_var_kl+", True)]


@pytest.mark.parametrize(("ours", "theirs", "k2_grad"), KL_PAIRS, ids=[p[1] for p in KL_PAIRS])
def test_kl_estimators_equal_verl_kl_penalty(ours, theirs, k2_grad):
    _, logp, _, _ = batch(6, noise=0.0)
    ref = logp + 1.5 * torch.randn(logp.shape, generator=torch.Generator().manual_seed(1), dtype=torch.float64)
    ref[0, :3] = logp[0, :3] - 13.0  # k3 > 10 there: low_var_kl's second clamp binds
    obj = Objective(kl_coef=1.0, kl_estimator=ours, kl_k2_grad=k2_grad)
    cot = torch.rand(logp.shape, generator=torch.Generator().manual_seed(2), dtype=torch.float64)
    assert_same(lambda lp: (obj.parts["kl_estimator"].term(lp, ref, 20.0, None) * cot).sum(),
                lambda lp: (verl.kl_penalty(lp, ref, theirs) * cot).sum(), logp)


@pytest.mark.parametrize("mode", MODES)
def test_kl_term_in_the_objective_equals_verl_kl_loss(mode):
    """The KL term is aggregated like the policy term, as verl's ppo_loss aggregates its kl_loss."""
    old, logp, adv, mask = batch(7)
    ref = old - 0.3
    kw = dict(aggregation=LMPO_AGG[mode], norm_constant=16.0 if mode.endswith("norm") else None)
    with_kl = Objective(kl_coef=0.05, kl_estimator="low_var_kl", kl_k2_grad=True, **kw)
    plain = Objective(**kw)
    assert_same(lambda lp: with_kl(lp, old, adv, mask, ref_logp=ref, **normalisers(mode, mask))[0]
                - plain(lp, old, adv, mask, **normalisers(mode, mask))[0],
                lambda lp: 0.05 * verl.agg_loss(verl.kl_penalty(lp, ref, "low_var_kl+"), mask, mode), logp)


@pytest.mark.parametrize("mode", ["token-sum", "seq-mean-token-sum-norm"])
def test_new_aggregations_equal_verl_agg_loss(mode):
    _, per_token, _, mask = batch(8)
    ours = aggregate(per_token, mask.double(), LMPO_AGG[mode], norm_constant=16.0 if mode.endswith("norm") else None,
                     **normalisers(mode, mask))
    torch.testing.assert_close(ours, verl.agg_loss(per_token, mask, mode), **TOL)


def vanilla(lp, old, adv, mask, cfg, weights=None):
    return verl.compute_policy_loss_vanilla(old, lp, adv, mask, "token-mean", cfg, rollout_is_weights=weights)


IS_CASES = [("token", 1.4, False), ("sequence", 2.0, False), ("token", "0.8_1.25", False),
            ("sequence", "0.7_1.6", False), ("token", 1.4, True), ("sequence", "0.7_1.6", True)]


def lmpo_correction(level, threshold, normalize):
    if isinstance(threshold, str):
        low, high = map(float, threshold.split("_"))
        return dict(correction="mis", is_level=level, is_min=low, is_max=high, is_batch_normalize=normalize)
    return dict(correction="tis", is_level=level, is_max=threshold, is_batch_normalize=normalize)


@pytest.mark.parametrize(("level", "threshold", "normalize"), IS_CASES, ids=[f"{c[0]}-{c[1]}-{c[2]}" for c in IS_CASES])
def test_rollout_correction_equals_verl_weights(level, threshold, normalize):
    """verl computes the weights from log π_old − log π_rollout and multiplies ``vanilla``'s terms by them; lmpo
    computes them from ``rollout_logp`` inside the objective."""
    old, logp, adv, mask = batch(9, noise=0.3)
    spread = 0.4 if level == "token" else 0.12
    rollout = old + spread * torch.randn(old.shape, generator=torch.Generator().manual_seed(3), dtype=torch.float64)
    weights, _ = compute_rollout_correction_weights(old - rollout, mask.double(), level, threshold, normalize)
    cfg = config()
    obj = Objective.preset("grpo", aggregation="token_mean", dual_clip=True, dual_clip_c=3.0,
                           **lmpo_correction(level, threshold, normalize))
    assert_same(lambda lp: obj(lp, old, adv, mask, rollout_logp=rollout)[0],
                lambda lp: vanilla(lp, old, adv, mask, cfg, weights), logp)
    # the weights themselves: on-policy (logp = old) with A = 1 the gradient of Σ −ρ·c is −c at valid tokens
    probe = Objective(trust_region="none", aggregation="token_sum", **lmpo_correction(level, threshold, normalize))
    _, grad = grad_of(lambda lp: probe(lp, old, torch.ones(old.shape[0], dtype=torch.float64), mask,
                                       rollout_logp=rollout)[0], old)
    torch.testing.assert_close(-grad, weights * mask, **TOL)
    changed = (weights * mask != torch.exp(old - rollout).clamp(max=1e9) * mask) & mask
    assert changed.any() and not changed.all()  # truncation / masking binds for some weights only


RS_OPTIONS = [("token_k1", "0.7_1.3"), ("token_k2", 0.05), ("token_k3", 0.05), ("seq_sum_k1", "0.5_2.0"),
              ("seq_sum_k2", 0.4), ("seq_sum_k3", 0.4), ("seq_mean_k1", "0.9_1.1"), ("seq_mean_k2", 0.03),
              ("seq_mean_k3", 0.03), ("seq_max_k2", 0.15), ("seq_max_k3", 0.15)]


@pytest.mark.parametrize(("option", "threshold"), RS_OPTIONS, ids=[o for o, _ in RS_OPTIONS])
def test_divergence_rejection_equals_verl_rejection_mask(option, threshold):
    old, logp, adv, mask = batch(10, noise=0.3)
    rollout = old + 0.3 * torch.randn(old.shape, generator=torch.Generator().manual_seed(4), dtype=torch.float64)
    verl_mask, _ = compute_rollout_rejection_mask(old - rollout, mask.double(), option, threshold)
    level, estimator = option.rsplit("_", 1)
    kw = dict(rejection="divergence", rs_estimator=estimator, rs_level=level)
    if isinstance(threshold, str):
        low, high = map(float, threshold.split("_"))
        kw.update(rs_min=low, rs_max=high)
    else:
        kw.update(rs_max=float(threshold))
    probe = Objective(trust_region="none", aggregation="token_sum", **kw)
    _, grad = grad_of(lambda lp: probe(lp, old, torch.ones(old.shape[0], dtype=torch.float64), mask,
                                       rollout_logp=rollout)[0], old)
    torch.testing.assert_close(-grad, verl_mask * mask, **TOL)
    kept = verl_mask.bool() & mask
    assert kept.any() and (mask & ~kept).any()  # some rejected, some kept
    # the loss: verl shrinks the response mask; with verl's token count as num_tokens the token mean agrees
    obj = Objective.preset("grpo", aggregation="token_mean", dual_clip=True, **kw)
    assert_same(lambda lp: obj(lp, old, adv, mask, rollout_logp=rollout, num_tokens=kept.sum().double())[0],
                lambda lp: vanilla(lp, old, adv, kept, config()), logp)
