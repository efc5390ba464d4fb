"""Cross-check against the real TRL: ``GRPOTrainer._compute_loss`` (TRL 1.16) run on a stub ``self``.

The stub supplies only what the loss path reads (log-probs come from a stub
``_get_per_token_logps_and_entropies``; accelerate's gather/reduce are identities for one process), so the
numbers below come from TRL's own code, not from a re-implementation. The new parts are checked in float64
(max abs diff ≤ 1e-6): ``loss_type`` cispo / sapo / vespo / luspo, ``top_entropy_quantile``,
``off_policy_mask_threshold`` and ``use_bias_correction_kl``. TRL's vLLM importance-sampling modes are computed
inside its rollout code, so they are checked end to end in tests/integrations/test_integ_trl.py.
"""

import types
from collections import defaultdict

import pytest
import torch
from obj_helpers import make_batch

from lmpo.objectives import Objective

trl_grpo = pytest.importorskip("trl.trainer.grpo_trainer")


def _trl_loss(logp, old, adv, mask, *, loss_type, level="token", eps_low=0.2, eps_high=0.2, max_len=None,
              beta=0.0, ref=None, entropies=None, top_entropy_quantile=1.0, off_policy_mask_threshold=None,
              sampling=None, bias_correction_kl=False, delta=None, **args):
    entropies = torch.zeros_like(logp) if entropies is None else entropies
    trainer = trl_grpo.GRPOTrainer
    stub = types.SimpleNamespace(
        _get_per_token_logps_and_entropies=lambda model, *a, **k: (logp, entropies, None),
        get_high_entropy_mask=lambda *a: trainer.get_high_entropy_mask(stub, *a),
        get_off_policy_mask=trainer.get_off_policy_mask,
        get_gamma_weights=trainer.get_gamma_weights,
        top_entropy_quantile=top_entropy_quantile,
        off_policy_mask_threshold=off_policy_mask_threshold,
        importance_sampling_level=level,
        beta=beta,
        loss_type=loss_type,
        epsilon_low=eps_low,
        epsilon_high=eps_high,
        args=types.SimpleNamespace(delta=delta, use_bias_correction_kl=bias_correction_kl, steps_per_generation=1,
                                   **args),
        use_vllm=False,
        vllm_importance_sampling_correction=False,
        model=types.SimpleNamespace(training=True),
        current_gradient_accumulation_steps=1,
        max_completion_length=max_len if max_len is not None else logp.shape[1],
        accelerator=types.SimpleNamespace(
            num_processes=1,
            gather=lambda x: x,
            gather_for_metrics=lambda x: x,
            reduce=lambda x, reduction="sum": x,
            pad_across_processes=lambda x, dim=0, pad_index=0: x,
            sync_gradients=True,
        ),
        _entropy_bonus_enabled=False,
        aux_loss_enabled=False,
        _metrics={"train": defaultdict(list), "eval": defaultdict(list)},
    )
    batch, length = logp.shape
    inputs = {
        "prompt_ids": torch.zeros(batch, 1, dtype=torch.long),
        "prompt_mask": torch.ones(batch, 1, dtype=torch.long),
        "completion_ids": torch.zeros(batch, length, dtype=torch.long),
        "completion_mask": mask.long(),
        "advantages": adv,
        "old_per_token_logps": old,
        "num_items_in_batch": mask.sum(),
    }
    if ref is not None:
        inputs["ref_per_token_logps"] = ref
    if sampling is not None:
        inputs["sampling_per_token_logps"] = sampling
    loss = trl_grpo.GRPOTrainer._compute_loss(stub, None, inputs)
    return loss, stub._metrics["train"]


CASES = [
    ("grpo", dict(loss_type="grpo"), {}),
    ("dapo", dict(loss_type="dapo", eps_high=0.28), {}),
    ("dr_grpo", dict(loss_type="dr_grpo", max_len=64), {"norm_constant": 64}),
    ("gspo", dict(loss_type="grpo", level="sequence", eps_low=3e-4, eps_high=4e-4), {}),
]


@pytest.mark.parametrize("preset, trl_kwargs, overrides", CASES, ids=[c[0] for c in CASES])
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_presets_reproduce_trl_loss_and_gradient(preset, trl_kwargs, overrides, seed):
    drift = 2e-3 if preset == "gspo" else 0.25  # mean of 48 tokens ≈ 3e-4: sequence ratios straddle ε
    logp, old, adv, mask = make_batch(batch=8, length=48, seed=seed, dtype=torch.float32, drift=drift,
                                      holes=False)
    ours, stats = Objective.preset(preset, **overrides)(logp, old, adv, mask)
    theirs, metrics = _trl_loss(logp, old, adv, mask, **trl_kwargs)
    torch.testing.assert_close(ours, theirs, rtol=1e-5, atol=1e-6)
    g_ours, = torch.autograd.grad(ours, logp)
    g_theirs, = torch.autograd.grad(theirs, logp)
    torch.testing.assert_close(g_ours, g_theirs, rtol=1e-5, atol=1e-7)
    # the clip statistics count the same events
    assert stats["clip/low_frac"].item() == pytest.approx(metrics["clip_ratio/low_mean"][0], abs=1e-6)
    assert stats["clip/high_frac"].item() == pytest.approx(metrics["clip_ratio/high_mean"][0], abs=1e-6)
    if preset == "gspo":
        assert 0 < stats["clip/region_frac"].item() < 1  # the comparison exercised both clipped and free rows


def test_reference_kl_matches_trl_k3():
    logp, old, adv, mask = make_batch(batch=6, length=32, seed=4, dtype=torch.float32, holes=False)
    ref = logp.detach() + 0.3 * torch.randn(logp.shape, generator=torch.Generator().manual_seed(0))
    ours, _ = Objective.preset("grpo", kl_coef=0.04, kl_estimator="k3")(logp, old, adv, mask, ref_logp=ref)
    theirs, _ = _trl_loss(logp, old, adv, mask, loss_type="grpo", beta=0.04, ref=ref)
    torch.testing.assert_close(ours, theirs, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(torch.autograd.grad(ours, logp)[0], torch.autograd.grad(theirs, logp)[0],
                               rtol=1e-5, atol=1e-7)


TOL = dict(rtol=0.0, atol=1e-6)


def _f64_batch(seed, drift=0.4, per_token_adv=False):
    logp, old, adv, mask = make_batch(batch=8, length=24, seed=seed, dtype=torch.float64, drift=drift,
                                      per_token_adv=per_token_adv)
    return logp.detach(), old, adv, mask


def _assert_same_as_trl(objective, logp, old, adv, mask, trl_kwargs, lmpo_kwargs=None):
    lmpo_kwargs = lmpo_kwargs or {}
    ours_leaf, theirs_leaf = logp.clone().requires_grad_(), logp.clone().requires_grad_()
    ours, stats = objective(ours_leaf, old, adv, mask, **lmpo_kwargs)
    theirs, metrics = _trl_loss(theirs_leaf, old, adv, mask, **trl_kwargs)
    torch.testing.assert_close(ours, theirs, **TOL)
    g_ours, g_theirs = torch.autograd.grad(ours, ours_leaf)[0], torch.autograd.grad(theirs, theirs_leaf)[0]
    torch.testing.assert_close(g_ours, g_theirs, **TOL)
    assert g_theirs.abs().sum() > 0
    return stats, metrics


@pytest.mark.parametrize("level", ["token", "sequence"])
def test_cispo_equals_trl(level):
    """TRL caps the weight at ``epsilon_high`` itself (no lower bound): lmpo eps_high = cap − 1, eps_low None."""
    logp, old, adv, mask = _f64_batch(11, drift=0.5 if level == "token" else 0.05)
    stats, metrics = _assert_same_as_trl(Objective.preset("cispo", eps_high=0.25, level=level), logp, old, adv, mask,
                                         dict(loss_type="cispo", level=level, eps_high=1.25))
    if level == "token":  # TRL counts the capped weights of A > 0 tokens; lmpo's high_frac counts every sign
        capped = ((torch.exp(logp - old) > 1.25) & mask).sum() / mask.sum()
        assert stats["clip/high_frac"].item() == pytest.approx(capped.item())
        assert 0 < metrics["cispo_clip_ratio"][0] <= stats["clip/high_frac"].item()


@pytest.mark.parametrize("level", ["token", "sequence"])
@pytest.mark.parametrize("per_token_adv", [False, True])
def test_sapo_equals_trl(level, per_token_adv):
    logp, old, adv, mask = _f64_batch(12, drift=0.6 if level == "token" else 0.2, per_token_adv=per_token_adv)
    objective = Objective.preset("sapo", sapo_tau_pos=0.9, sapo_tau_neg=1.4, level=level)
    _assert_same_as_trl(objective, logp, old, adv, mask,
                        dict(loss_type="sapo", level=level, sapo_temperature_pos=0.9, sapo_temperature_neg=1.4))


@pytest.mark.parametrize("per_token_adv", [False, True])
def test_vespo_equals_trl(per_token_adv):
    logp, old, adv, mask = _f64_batch(13, drift=0.08, per_token_adv=per_token_adv)
    objective = Objective.preset("vespo", vespo_k_pos=1.5, vespo_lambda_pos=2.5, vespo_k_neg=2.5, vespo_lambda_neg=1.5)
    stats, metrics = _assert_same_as_trl(objective, logp, old, adv, mask, dict(
        loss_type="vespo", vespo_k_pos=1.5, vespo_lambda_pos=2.5, vespo_k_neg=2.5, vespo_lambda_neg=1.5))
    assert 0 < stats["vespo/phi_mean"].item() < 1.0


def test_luspo_equals_trl():
    logp, old, adv, mask = _f64_batch(14, drift=2e-3)
    _assert_same_as_trl(Objective.preset("luspo"), logp, old, adv, mask,
                        dict(loss_type="luspo", level="sequence", eps_low=3e-4, eps_high=4e-4))


@pytest.mark.parametrize("top", [0.0, 0.2, 0.5, 1.0])
def test_high_entropy_credit_equals_trl_top_entropy_quantile(top):
    logp, old, adv, mask = _f64_batch(15)
    # float32-representable entropies: TRL takes the quantile in float32
    entropies = (torch.rand(logp.shape, generator=torch.Generator().manual_seed(2)) * 3).double()
    objective = Objective.preset("grpo", credit="high_entropy", entropy_top_frac=top)
    _assert_same_as_trl(objective, logp, old, adv, mask,
                        dict(loss_type="grpo", entropies=entropies, top_entropy_quantile=top),
                        dict(entropy=entropies))


@pytest.mark.parametrize("per_token_adv", [False, True])
def test_off_policy_sequence_mask_equals_trl(per_token_adv):
    logp, old, adv, mask = _f64_batch(16, drift=0.3, per_token_adv=per_token_adv)
    g = torch.Generator().manual_seed(3)
    # mean KL(sampler ‖ π) per row between 0 and 0.2, around the threshold 0.05
    sampling = logp + 0.2 * torch.rand(logp.shape[0], 1, generator=g, dtype=torch.float64) \
        + 0.1 * torch.randn(logp.shape, generator=g, dtype=torch.float64)
    objective = Objective.preset("grpo", rejection="off_policy_seq", opsm_delta=0.05)
    stats, _ = _assert_same_as_trl(objective, logp, old, adv, mask,
                                   dict(loss_type="grpo", off_policy_mask_threshold=0.05, sampling=sampling),
                                   dict(rollout_logp=sampling))
    assert 0 < stats["rollout/rejected_frac"].item() < 1  # some sequences masked, not all


@pytest.mark.parametrize("level", ["token", "sequence"])
def test_ratio_weighted_kl_equals_trl_bias_correction(level):
    logp, old, adv, mask = _f64_batch(17, drift=0.3 if level == "token" else 2e-3)
    ref = logp + 0.3 * torch.randn(logp.shape, generator=torch.Generator().manual_seed(4), dtype=torch.float64)
    eps = (0.2, 0.2) if level == "token" else (3e-4, 4e-4)
    objective = Objective.preset("grpo", level=level, eps_low=eps[0], eps_high=eps[1], kl_coef=0.04,
                                 kl_ratio_weighted=True)
    _assert_same_as_trl(objective, logp, old, adv, mask,
                        dict(loss_type="grpo", level=level, eps_low=eps[0], eps_high=eps[1], beta=0.04, ref=ref,
                             bias_correction_kl=True), dict(ref_logp=ref))


@pytest.mark.parametrize("delta", [1.5, 3.0])
@pytest.mark.parametrize("seed", [0, 1])
def test_trl_delta_equals_dual_clip(delta, seed):
    """TRL's two-sided cap ``delta`` (INTELLECT-2: ``coef_1 = clamp(r, max=δ)`` before the PPO min) equals the
    dual clip with ``c = δ`` whenever δ > 1 + ε_high (TRL's documented range): for A > 0 the clip bounds r below
    1 + ε < δ anyway, for A < 0 both cap the ratio term at δ."""
    logp, old, adv, mask = make_batch(batch=8, length=48, seed=seed, dtype=torch.float64, drift=1.0, holes=False)
    ours, _ = Objective.preset("grpo", dual_clip=True, dual_clip_c=delta)(logp, old, adv, mask)
    theirs, _ = _trl_loss(logp, old, adv, mask, loss_type="grpo", delta=delta)
    torch.testing.assert_close(ours, theirs, rtol=0, atol=1e-6)
    g_ours, = torch.autograd.grad(ours, logp)
    g_theirs, = torch.autograd.grad(theirs, logp)
    torch.testing.assert_close(g_ours, g_theirs, rtol=0, atol=1e-6)
    assert ((logp - old).exp() > delta).any()  # the cap was exercised
