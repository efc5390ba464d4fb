"""The composed Objective and the preset registry: on-policy REINFORCE, masking, validation, stats."""

import dataclasses

import pytest
import torch
from obj_helpers import aggregate_loop, extra_inputs, make_batch

from lmpo.objectives import PRESETS, Objective, preset_table_markdown
from lmpo.objectives.parts.covariance import clip_cov_selection, token_covariance
from lmpo.objectives.parts.credit import gradient_adaptive_weights, temporal_decay_weights

REQUIRED_PRESETS = {"grpo", "dapo", "dr_grpo", "gspo", "gspo_token", "amic", "ema", "ptrw", "decay",
                    "grad_adaptive", "asym", "clip_cov", "kl_cov", "adaptive_entropy"}


def test_registry_has_required_presets_with_docs():
    assert REQUIRED_PRESETS <= set(PRESETS) and len(PRESETS) >= 14
    table = preset_table_markdown()
    for name, preset in PRESETS.items():
        assert preset.description and preset.formula and preset.paper
        assert f"| `{name}` |" in table
        assert Objective.preset(name).name == name


def test_preset_parts_follow_spec():
    assert Objective.preset("grpo").aggregation == "seq_mean_token_mean"
    dapo = Objective.preset("dapo")
    assert (dapo.aggregation, dapo.trust_region, dapo.eps_low, dapo.eps_high) == ("token_mean", "clip_higher", 0.2,
                                                                                  0.28)
    dr = Objective.preset("dr_grpo")
    assert (dr.aggregation, dr.advantage_scale) == ("seq_sum_norm", "none")
    for name, level in (("gspo", "sequence"), ("gspo_token", "sequence_token")):
        obj = Objective.preset(name)
        assert (obj.level, obj.aggregation, obj.eps_low, obj.eps_high) == (level, "seq_mean_token_mean", 3e-4, 4e-4)
    assert Objective.preset("ptrw").level == "sequence_arith" and Objective.preset("ptrw").trust_region == "gaussian"
    assert "token_grad_norm" in Objective.preset("grad_adaptive").needs
    assert "entropy" in Objective.preset("adaptive_entropy").needs
    assert "entropy" not in Objective.preset("grpo").needs and "ref_logp" not in Objective.preset("grpo").needs


def test_preset_overrides_and_errors():
    obj = Objective.preset("grpo", eps_high=0.3, kl_coef=0.04)
    assert obj.eps_high == 0.3 and obj.kl_coef == 0.04 and "ref_logp" in obj.needs
    assert Objective.preset("dapo", trust_region="ppo").eps_high == 0.28  # dapo sets 0.28 explicitly
    assert Objective(trust_region="clip_higher").eps_high == 0.28 and Objective().eps_high == 0.2
    with pytest.raises(ValueError, match="unknown preset 'grpoo'.*grpo, dapo"):
        Objective.preset("grpoo")
    with pytest.raises(TypeError, match="unknown Objective field.*'epsilon'"):
        Objective.preset("grpo", epsilon=0.2)
    with pytest.raises(dataclasses.FrozenInstanceError):
        obj.level = "sequence"


def _reinforce_reference(obj, logp, adv, mask, kw, generator_seed):
    """−A·c_t·logp_t aggregated the preset's way (+ explicit entropy/KL terms); clip_cov's picks zeroed."""
    m = mask.double()
    lengths = m.sum(-1)
    c = torch.ones_like(m)
    if obj.credit == "temporal_decay":
        c = temporal_decay_weights(mask, lengths, obj.decay_gamma, obj.decay_normalize)
    elif obj.credit == "gradient_adaptive":
        c = gradient_adaptive_weights(kw["token_grad_norm"], mask, lengths, obj.grad_tau)
    per_token = -adv[:, None] * c * logp
    if obj.cov_control == "clip_cov":
        cov = token_covariance(logp.detach(), adv[:, None], m, m.sum())
        chosen = clip_cov_selection(cov, mask, torch.zeros_like(mask), m.sum(), ratio=obj.clip_cov_ratio,
                                    lb=obj.clip_cov_lb, ub=obj.clip_cov_ub,
                                    generator=torch.Generator().manual_seed(generator_seed))
        per_token = torch.where(chosen, 0.0, per_token)
    loss = aggregate_loop(per_token, mask, obj.aggregation)
    if "entropy" in obj.needs:
        coef = kw.get("entropy_coef", obj.entropy_coef)
        loss = loss - coef * aggregate_loop(kw["entropy"], mask, obj.aggregation)
    return loss


@pytest.mark.parametrize("name", sorted(PRESETS))
def test_on_policy_gradient_equals_weighted_reinforce(name):
    obj = Objective.preset(name)
    for seed in range(2):
        logp, _, adv, mask = make_batch(batch=8, length=40, seed=seed)
        adv = adv * 3.0  # wide advantages: clip_cov then has candidates
        kw = extra_inputs(obj, 8, 40, seed=seed)
        if "entropy" in kw:
            kw["entropy"] = kw["entropy"].requires_grad_()
        loss, _ = obj(logp, logp.detach(), adv, mask, generator=torch.Generator().manual_seed(11), **kw)
        ref = _reinforce_reference(obj, logp, adv, mask, kw, 11)
        targets = [logp] + ([kw["entropy"]] if "entropy" in kw else [])
        got = torch.autograd.grad(loss, targets)
        want = torch.autograd.grad(ref, targets)
        for a, b in zip(got, want):
            torch.testing.assert_close(a, b)


@pytest.mark.parametrize("name", sorted(PRESETS))
def test_garbage_in_masked_positions_changes_nothing(name):
    obj = Objective.preset(name, kl_coef=0.1)
    logp, old, adv, mask = make_batch(batch=6, length=30, seed=3, per_token_adv=True, drift=0.2)
    kw = extra_inputs(obj, 6, 30)
    gen = torch.Generator().manual_seed(0)
    garbage = torch.randn(logp.shape, generator=gen, dtype=torch.float64) * 1e4
    garbage[0, -1] = float("nan")
    garbage[1, -1] = float("inf")

    def dirty(x):
        return torch.where(mask, x, garbage)

    logp2 = dirty(logp.detach()).requires_grad_()
    kw2 = {k: dirty(v) if isinstance(v, torch.Tensor) else v for k, v in kw.items()}
    l1, s1 = obj(logp, old, adv, mask, generator=torch.Generator().manual_seed(1), **kw)
    l2, s2 = obj(logp2, dirty(old), dirty(adv), mask, generator=torch.Generator().manual_seed(1), **kw2)
    torch.testing.assert_close(l1, l2)
    g1, g2 = torch.autograd.grad(l1, logp)[0], torch.autograd.grad(l2, logp2)[0]
    torch.testing.assert_close(g1, g2)
    assert (g2[~mask] == 0).all()
    assert s1.keys() == s2.keys()
    for k in s1:
        torch.testing.assert_close(s1[k], s2[k], msg=k)


@pytest.mark.parametrize("name", ["grpo", "gspo", "ema", "clip_cov"])
def test_empty_row_with_nan_sequence_advantage_is_ignored(name):
    obj = Objective.preset(name)
    logp, old, adv, mask = make_batch(batch=5, length=16, seed=6)
    mask = mask.clone()
    mask[2] = False
    dirty_adv = adv.clone()
    dirty_adv[2] = float("nan")
    l1, s1 = obj(logp, old, adv, mask, generator=torch.Generator().manual_seed(0))
    l2, s2 = obj(logp, old, dirty_adv, mask, generator=torch.Generator().manual_seed(0))
    torch.testing.assert_close(l1, l2)
    torch.testing.assert_close(torch.autograd.grad(l1, logp)[0], torch.autograd.grad(l2, logp)[0])
    for key in s1:
        torch.testing.assert_close(s1[key], s2[key], msg=key)


@pytest.mark.parametrize("name", sorted(PRESETS))
def test_extreme_log_ratios_are_finite(name):
    obj = Objective.preset(name)
    logp, _, adv, mask = make_batch(batch=4, length=12, seed=0)
    old = logp.detach() + torch.where(torch.rand(logp.shape) > 0.5, 100.0, -100.0).double()
    loss, stats = obj(logp, old, adv, mask, **extra_inputs(obj, 4, 12))
    (grad,) = torch.autograd.grad(loss, logp)
    assert torch.isfinite(loss) and torch.isfinite(grad).all()
    assert all(torch.isfinite(v) for v in stats.values())
    assert stats["ratio/clamped_tokens"].item() == mask.sum().item()


def test_stats_are_detached_scalars_and_inputs_untouched():
    obj = Objective.preset("clip_cov", kl_coef=0.1, entropy_coef=0.01)
    logp, old, adv, mask = make_batch(seed=1)
    ent = torch.rand(logp.shape, dtype=torch.float64, requires_grad=True)
    ref = old - 0.1
    before = [t.detach().clone() for t in (logp, old, adv, mask, ent, ref)]
    loss, stats = obj(logp, old, adv, mask, entropy=ent, ref_logp=ref, generator=torch.Generator())
    assert loss.dim() == 0 and loss.requires_grad
    for key, value in stats.items():
        assert "/" in key and isinstance(value, torch.Tensor) and value.dim() == 0 and not value.requires_grad
    for a, b in zip(before, (logp, old, adv, mask, ent, ref)):
        torch.testing.assert_close(a, b.detach())
    expected = {"loss/policy", "loss/kl_ref", "loss/entropy", "ratio/mean", "ratio/min", "ratio/max",
                "ratio/clamped_tokens", "clip/low_frac", "clip/high_frac", "kl/behaviour_k3", "kl/ref",
                "entropy/mean", "entropy/coef", "cov/mean", "cov/top_mean", "cov/clipped_tokens", "tokens/valid"}
    assert expected <= stats.keys()


def test_mask_dtypes_and_low_precision_agree():
    logp, old, adv, mask = make_batch(seed=2)
    obj = Objective.preset("dapo")
    ref, _ = obj(logp, old, adv, mask)
    for m in (mask.double(), mask.int(), mask.to(torch.uint8)):
        torch.testing.assert_close(obj(logp, old, adv, m)[0], ref)
    low = logp.detach().float().requires_grad_()
    loss, _ = obj(low, old.float(), adv.float(), mask)
    assert loss.dtype == torch.float32
    torch.testing.assert_close(loss.double(), ref, rtol=1e-5, atol=1e-6)
    half = logp.detach().bfloat16().requires_grad_()
    loss, _ = obj(half, old.bfloat16(), adv.bfloat16(), mask)
    loss.backward()
    assert loss.dtype == torch.float32 and half.grad.dtype == torch.bfloat16


def test_bad_inputs_raise_helpful_errors():
    logp, old, adv, mask = make_batch(batch=3, length=5)
    obj = Objective()
    cases = [
        (dict(old_logp=old[:, :4]), ValueError, r"old_logp has shape \(3, 4\).*\(B, T\) = \(3, 5\)"),
        (dict(mask=mask[:2]), ValueError, r"mask has shape \(2, 5\)"),
        (dict(advantages=adv[:2]), ValueError, r"advantages has shape \(2,\).*\(B,\) = \(3,\)"),
        (dict(mask=mask.to(torch.complex64)), TypeError, "mask has dtype torch.complex64"),
        (dict(mask=mask.double() * 2), ValueError, "mask must hold only 0 and 1"),
        (dict(old_logp=torch.where(mask, float("nan"), old)), ValueError, "old_logp holds a non-finite value"),
        (dict(advantages=torch.tensor([0.0, float("inf"), 1.0], dtype=torch.float64)), ValueError,
         "advantages holds a non-finite"),
        (dict(logp=logp[0]), ValueError, r"logp must be a \(B, T\) tensor"),
    ]
    base = dict(logp=logp, old_logp=old, advantages=adv, mask=mask)
    for change, exc, pattern in cases:
        args = {**base, **change}
        with pytest.raises(exc, match=pattern):
            obj(args["logp"], args["old_logp"], args["advantages"], args["mask"])
    with pytest.raises(ValueError, match="ref_logp is required.*kl_coef=0.1"):
        Objective(kl_coef=0.1)(logp, old, adv, mask)
    with pytest.raises(ValueError, match="entropy is required"):
        Objective(entropy_coef=0.1)(logp, old, adv, mask)
    with pytest.raises(ValueError, match="token_grad_norm is required"):
        Objective.preset("grad_adaptive")(logp, old, adv, mask)
    with pytest.raises(ValueError, match="entropy_coef=controller.coef"):
        Objective.preset("adaptive_entropy")(logp, old, adv, mask, entropy=torch.rand(3, 5))
    with pytest.raises(ValueError, match="num_tokens=0"):
        obj(logp, old, adv, mask, num_tokens=0)
    # masked NaN is fine; check_finite=False skips the value check
    Objective(check_finite=False)(logp, torch.where(mask, float("nan"), old), adv, mask)


@pytest.mark.parametrize(
    "field, value, pattern",
    [
        ("ema_beta", 0.0, r"ema_beta=0.0 is out of range; it must lie in \(0, 1\]"),
        ("ema_beta", 1.5, r"ema_beta=1.5 is out of range"),
        ("eps_low", 0.0, r"eps_low=0.0 is out of range"),
        ("eps_high", -0.1, r"eps_high=-0.1 is out of range"),
        ("eps_pos", 0.0, r"eps_pos=0.0"),
        ("ptrw_sigma", 0.0, r"ptrw_sigma=0.0 is out of range"),
        ("decay_gamma", 0.0, r"decay_gamma=0.0 is out of range"),
        ("decay_gamma", 1.2, r"decay_gamma=1.2"),
        ("grad_tau", -1.0, r"grad_tau=-1.0 is out of range"),
        ("kl_coef", -0.1, r"kl_coef=-0.1"),
        ("kl_cov_frac", 2.0, r"kl_cov_frac=2.0.*k_percent"),
        ("level", "tokens", r"level='tokens' is not a known choice; use one of 'token', 'sequence'"),
        ("trust_region", "trpo", r"trust_region='trpo' is not a known choice"),
        ("aggregation", "mean", r"aggregation='mean' is not a known choice"),
        ("kl_estimator", "k4", r"kl_estimator='k4'"),
        ("credit", "x", r"credit='x'"),
        ("grad_norm_mode", "lm_head", r"grad_norm_mode='lm_head' only applies"),
        ("dual_clip_c", 0.5, r"dual_clip_c=0.5"),
    ],
)
def test_bad_hyperparameters_raise(field, value, pattern):
    with pytest.raises(ValueError, match=pattern):
        Objective(**{field: value})


def test_dual_clip_needs_clipped_trust_region():
    with pytest.raises(ValueError, match="dual_clip=True needs a clipped trust region"):
        Objective(trust_region="gaussian", dual_clip=True)


def test_preset_build_matches_objective_preset():
    for name, preset in PRESETS.items():
        assert preset.build() == Objective.preset(name)
        assert preset.build(kl_coef=0.2).kl_coef == 0.2
