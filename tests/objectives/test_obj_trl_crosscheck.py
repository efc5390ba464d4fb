"""Cross-check against the real TRL: ``GRPOTrainer._compute_loss`` (TRL 1.16) run on a stub ``self``.

The stub supplies only what the loss path reads (log-probs come from a stub
``_get_per_token_logps_and_entropies``; accelerate's gather/reduce are identities for one process), so the
numbers below come from TRL's own code, not from a re-implementation.
"""

import types
from collections import defaultdict

import pytest
import torch
from obj_helpers import make_batch

from lmpo.objectives import Objective

trl_grpo = pytest.importorskip("trl.trainer.grpo_trainer")


def _trl_loss(logp, old, adv, mask, *, loss_type, level="token", eps_low=0.2, eps_high=0.2, max_len=None,
              beta=0.0, ref=None):
    entropies = torch.zeros_like(logp)
    stub = types.SimpleNamespace(
        _get_per_token_logps_and_entropies=lambda model, *a, **k: (logp, entropies, None),
        top_entropy_quantile=1.0,
        off_policy_mask_threshold=None,
        importance_sampling_level=level,
        beta=beta,
        loss_type=loss_type,
        epsilon_low=eps_low,
        epsilon_high=eps_high,
        args=types.SimpleNamespace(delta=None, use_bias_correction_kl=False, steps_per_generation=1),
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
