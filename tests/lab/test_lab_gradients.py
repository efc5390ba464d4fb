"""The gradient study: importance weights per level against their formulas, and paired batches."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from lab_helpers import smoke_config

from lmpo.lab import lab_config_from_dict, plan_jobs
from lmpo.lab.gradients import gradient_study, importance_weights, weight_variance
from lmpo.objectives import Objective


def _inputs(seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    logp = -torch.rand(3, 5, generator=g) * 2
    old = logp + 0.3 * torch.randn(3, 5, generator=g)
    mask = torch.tensor([[1, 1, 1, 1, 1], [1, 1, 1, 0, 0], [1, 0, 0, 0, 0]], dtype=torch.bool)
    adv = torch.tensor([1.0, -0.5, 0.2])
    return logp, old, mask, adv


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_importance_weights_follow_each_level_formula(seed):
    logp, old, mask, adv = _inputs(seed)
    m = mask.float()
    w = torch.exp(logp - old)
    token = importance_weights(Objective.preset("grpo"), logp, old, mask, adv)
    torch.testing.assert_close(token[mask], w[mask])
    seq = importance_weights(Objective.preset("gspo"), logp, old, mask, adv)
    geo = torch.exp(((logp - old) * m).sum(-1) / m.sum(-1))  # (B,) geometric mean of the token ratios
    torch.testing.assert_close(seq[mask], geo.unsqueeze(-1).expand_as(m)[mask])
    arith = importance_weights(Objective.preset("amic"), logp, old, mask, adv)
    mean = (w * m).sum(-1) / m.sum(-1)
    torch.testing.assert_close(arith[mask], mean.unsqueeze(-1).expand_as(m)[mask])
    # an EMA with β = 1 is the token level
    ema1 = importance_weights(Objective.preset("ema", ema_beta=1.0), logp, old, mask, adv)
    torch.testing.assert_close(ema1[mask], w[mask])
    # β = 0.5 by hand on the first row: w'_t = 0.5 w'_{t−1} + 0.5 w_t from w'_0 = 1
    ema = importance_weights(Objective.preset("ema", ema_beta=0.5), logp, old, mask, adv)
    state, expected = 1.0, []
    for t in range(5):
        state = 0.5 * state + 0.5 * float(w[0, t])
        expected.append(state)
    torch.testing.assert_close(ema[0], torch.tensor(expected))


def test_weight_variance_by_hand():
    w = torch.tensor([[1.0, 2.0, 3.0], [5.0, 9.0, 9.0]])
    mask = torch.tensor([[1, 1, 1], [1, 0, 0]], dtype=torch.bool)
    assert weight_variance(w, mask) == pytest.approx(np.var([1.0, 2.0, 3.0, 5.0], ddof=1))


def test_every_objective_sees_the_same_batches(tmp_path, small_model_dir):
    """Two entries with the same objective give identical gradients, and the study is deterministic."""
    sections = {"grid": {"objectives": ["grpo", {"label": "grpo_again", "preset": "grpo"}, "gspo"], "seeds": [0]},
                "train": {**smoke_config(tmp_path, small_model_dir)["train"], "sft": {"steps": 0}},
                "gradients": {"batches": 3, "onpolicy_batches": 2, "snapshots": [0.0]}}
    cfg = lab_config_from_dict(smoke_config(tmp_path, small_model_dir, **sections))
    job = next(j for j in plan_jobs(cfg) if j.kind == "gradients")
    out = gradient_study(job.spec, log=lambda msg: None)
    a, b, c = (out["objectives"][k] for k in ("grpo", "grpo_again", "gspo"))
    assert a["gram"] == b["gram"] and a["dots"] == b["dots"] and a["per_batch"] == b["per_batch"]
    assert a["gram"] != c["gram"]
    gram = np.asarray(a["gram"])
    assert gram.shape == (3, 3)
    np.testing.assert_allclose(np.sqrt(np.diag(gram)), a["per_batch"]["grad_norm"])
    assert out["kl_behaviour"] > 0  # k = 1 update from the snapshot: the ratios are not 1
    again = gradient_study(job.spec, log=lambda msg: None)
    assert again["objectives"]["gspo"]["gram"] == c["gram"]



@pytest.mark.parametrize("estimator", ["remax", "gdpo"])
def test_gradient_study_gives_the_estimator_its_inputs(tmp_path, small_model_dir, estimator, monkeypatch):
    """The study's batches carry what the run's advantage estimator needs (ReMax: the rewards of greedy completions
    decoded from the sampling model; GDPO: each reward function's values and the lengths), as the trainer
    computes them, and its advantages are the estimator's on them."""
    from lmpo.lab import gradients

    seen = []
    plain = gradients._advantages
    monkeypatch.setattr(gradients, "_advantages", lambda trainer, batch, scale: seen.append(
        (batch, plain(trainer, batch, scale))) or seen[-1][1])
    train = {**smoke_config(tmp_path, small_model_dir)["train"], "sft": {"steps": 0},
             "objective": {"advantage_estimator": estimator}}
    sections = {"grid": {"objectives": ["grpo"], "seeds": [0]}, "train": train,
                "gradients": {"batches": 2, "onpolicy_batches": 1, "snapshots": [0.0]}}
    job = next(j for j in plan_jobs(lab_config_from_dict(smoke_config(tmp_path, small_model_dir, **sections)))
               if j.kind == "gradients")
    out = gradient_study(job.spec, log=lambda msg: None)
    assert np.isfinite(np.asarray(out["objectives"]["grpo"]["gram"])).all()
    assert seen
    for batch, adv in seen:
        inputs = batch["adv_inputs"]
        if estimator == "remax":
            assert set(inputs) == {"baseline_rewards"}
            torch.testing.assert_close(adv, batch["rewards"] - inputs["baseline_rewards"])
        else:
            assert set(inputs) == {"reward_components", "reward_weights", "lengths"}
            torch.testing.assert_close(inputs["reward_components"].sum(1), batch["rewards"])
            torch.testing.assert_close(inputs["lengths"], batch["mask"].sum(-1))


def _driver(preset, **over):
    from lmpo.objectives import ObjectiveDriver

    return ObjectiveDriver(Objective.preset(preset, check_finite=False, **over))


def test_token_gradient_weights_by_hand_and_against_a_slow_loop():
    from lmpo.lab.gradients import token_gradient_weights

    logp, old, mask, adv = _inputs(0)
    # on-policy GRPO (seq_mean_token_mean, ratio 1, no clip): ∂loss/∂logp_t = −A_i / (|y_i|·B).
    # Row 1 has |y| = 3, A = −0.5, B = 3 → +0.5/9 = 0.05556 on its three tokens.
    w = token_gradient_weights(_driver("grpo"), logp, logp.detach(), adv, mask, seed=0)
    expect = -(adv / mask.sum(-1)).unsqueeze(-1).expand_as(logp) / 3
    torch.testing.assert_close(w, torch.where(mask, expect, 0.0))
    assert float(w[1, 0]) == pytest.approx(0.5 / 9)
    # off-policy, against central differences of the objective token by token (slow loop, float64)
    logp, old, adv = logp.double(), old.double(), adv.double()
    driver = _driver("dapo")
    fast = token_gradient_weights(driver, logp, old, adv, mask, seed=0)
    for i in range(3):
        for t in range(5):
            if not mask[i, t]:
                assert fast[i, t] == 0
                continue
            h = 1e-6
            up, down = logp.clone(), logp.clone()
            up[i, t] += h
            down[i, t] -= h
            n = mask.sum()
            lu = driver.loss(up, old, adv, mask, num_tokens=n, num_seqs=3)
            ld = driver.loss(down, old, adv, mask, num_tokens=n, num_seqs=3)
            assert float(fast[i, t]) == pytest.approx(float((lu - ld) / (2 * h)), abs=1e-7)


def test_weight_diff_frac_counts_tokens_the_variant_moves_differently():
    from lmpo.lab.gradients import token_gradient_weights, weight_diff_frac

    logp, old, mask, adv = _inputs(1)
    grpo = token_gradient_weights(_driver("grpo"), logp, old, adv, mask, seed=0)
    assert weight_diff_frac(grpo, grpo, mask) == 0.0
    # an objective that equals GRPO: same weights, inactive
    same = token_gradient_weights(_driver("grpo", eps_low=0.2), logp, old, adv, mask, seed=0)
    assert weight_diff_frac(same, grpo, mask) == 0.0
    # GSPO: rows 0 and 1 (ratios far from 1) are clipped whole by its ε = 3e-4, so their 5 tokens that GRPO
    # moves differ; row 2 has one token (sequence ratio = token ratio) and GRPO's clipped tokens of row 0 are
    # zero in both → 5 of 9 valid tokens
    gspo = token_gradient_weights(_driver("gspo"), logp, old, adv, mask, seed=0)
    assert weight_diff_frac(gspo, grpo, mask) == pytest.approx(5 / 9)
    # by hand: weights 1.0 vs 1.005 (0.5%) and 1.0 vs 1.02 (2%) on two valid tokens → one of two differs
    m = torch.tensor([[True, True, False]])
    assert weight_diff_frac(torch.tensor([[1.005, 1.02, 9.0]]), torch.tensor([[1.0, 1.0, 0.0]]), m) == 0.5
