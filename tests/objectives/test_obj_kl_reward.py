"""KL in the reward (``lmpo.objectives.kl_reward``) and its β controllers, against verl's own code in float64:

- ``kl_penalised_rewards`` against verl ``apply_kl_penalty`` (trainer/ppo/ray_trainer.py, the function's own
  source, executed with verl's ``core_algos``, ``masked_mean`` and ``DataProto``: the module itself imports the
  whole Ray trainer, which needs packages the CPU test environment lacks) summed over tokens, for every
  ``kl_penalty`` lmpo names, and end to end through verl's GRPO outcome advantage;
- the same summed over tokens against OpenRLHF's ``compute_reward`` / ``compute_approx_kl`` (transcribed, not
  installed; float32 as OpenRLHF casts);
- the controllers against verl ``AdaptiveKLController`` / ``FixedKLController`` on one sequence of KL values;
- hand-computed cases and hypothesis properties (finite in → finite out, β = 0 and π = π_ref change nothing).
"""

from __future__ import annotations

import ast
import math

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from verl import DataProto
from verl.trainer.ppo import core_algos
from verl.utils.torch_functional import masked_mean

from lmpo.objectives.advantages import compute_advantages
from lmpo.objectives.kl_reward import (
    AdaptiveKLController,
    FixedKLController,
    kl_penalised_rewards,
    make_kl_controller,
)

TOL = dict(rtol=0.0, atol=1e-6)
#: lmpo estimator → verl kl_penalty name (verl's ``k3`` is lmpo's ``low_var_kl``)
VERL_NAMES = {"k1": "kl", "abs": "abs", "k2": "mse", "low_var_kl": "low_var_kl"}


def _verl_apply_kl_penalty():
    """verl's ``apply_kl_penalty``, compiled from its own source file with the names it uses."""
    import importlib.util

    path = importlib.util.find_spec("verl.trainer.ppo").submodule_search_locations[0] + "/ray_trainer.py"
    tree = ast.parse(open(path, encoding="utf-8").read())
    node = next(n for n in tree.body if isinstance(n, ast.FunctionDef) and n.name == "apply_kl_penalty")
    namespace = {"DataProto": DataProto, "core_algos": core_algos, "masked_mean": masked_mean, "torch": torch}
    exec(compile(ast.Module(body=[node], type_ignores=[]), path, "exec"), namespace)
    return namespace["apply_kl_penalty"]


def _batch(seed: int, B: int = 6, T: int = 7):
    g = torch.Generator().manual_seed(seed)
    logp = -torch.rand(B, T, generator=g, dtype=torch.float64) * 3
    ref = logp + 0.5 * torch.randn(B, T, generator=g, dtype=torch.float64)
    lengths = torch.tensor([T, 1, 3, 0, T - 2, 5])[:B]
    mask = (torch.arange(T)[None, :] < lengths[:, None]).to(torch.float64)
    rewards = torch.randn(B, generator=g, dtype=torch.float64)
    return rewards, logp, ref, mask


@pytest.mark.parametrize("estimator", sorted(VERL_NAMES))
def test_kl_in_reward_equals_verl_apply_kl_penalty(estimator):
    apply_kl_penalty = _verl_apply_kl_penalty()
    rewards, logp, ref, mask = _batch(1)
    B, T = logp.shape
    # verl's outcome rewards sit on the last valid token of the response
    last = (mask.sum(-1) - 1).clamp_min(0).long()
    scores = torch.zeros(B, T, dtype=torch.float64)
    scores[torch.arange(B), last] = torch.where(mask.sum(-1) > 0, rewards, torch.zeros_like(rewards))
    data = DataProto.from_dict(tensors={"response_mask": mask, "token_level_scores": scores,
                                        "old_log_probs": logp, "ref_log_prob": ref})
    verl_ctrl = core_algos.FixedKLController(kl_coef=0.3)
    data, metrics = apply_kl_penalty(data, kl_ctrl=verl_ctrl, kl_penalty=VERL_NAMES[estimator])
    verl_seq_rewards = data.batch["token_level_rewards"].sum(-1)

    ours, stats = kl_penalised_rewards(torch.where(mask.sum(-1) > 0, rewards, torch.zeros_like(rewards)), logp, ref,
                                       mask, coef=0.3, estimator=estimator)
    torch.testing.assert_close(ours, verl_seq_rewards, **TOL)
    assert abs(float(stats["kl/reward_kl"]) - metrics["actor/reward_kl_penalty"]) <= 1e-6
    # verl's GRPO outcome estimator sums the token-level rewards: the same advantages
    index = np.array([0, 0, 0, 1, 1, 1])
    verl_adv, _ = core_algos.compute_grpo_outcome_advantage(data.batch["token_level_rewards"], mask, index,
                                                            norm_adv_by_std_in_grpo=False)
    ours_adv, _ = compute_advantages("grpo", ours, torch.as_tensor(index), scale="none")
    valid = mask.sum(-1) > 0
    torch.testing.assert_close(verl_adv[:, 0][valid], ours_adv[valid], **TOL)


def test_kl_in_reward_hand_case():
    # one sequence, two valid tokens, one padded: logp = (−1, −2, pad), ref = (−1.5, −1, pad), β = 0.5
    logp = torch.tensor([[-1.0, -2.0, 0.0]], dtype=torch.float64)
    ref = torch.tensor([[-1.5, -1.0, -9.0]], dtype=torch.float64)
    mask = torch.tensor([[1, 1, 0]])
    r = torch.tensor([1.0], dtype=torch.float64)
    # k1: (0.5) + (−1) = −0.5  →  r' = 1 − 0.5·(−0.5) = 1.25; token-mean KL −0.25, penalty −0.25
    out, stats = kl_penalised_rewards(r, logp, ref, mask, 0.5, "k1")
    assert float(out) == pytest.approx(1.25, abs=1e-12)
    assert float(stats["kl/reward_kl"]) == pytest.approx(-0.25, abs=1e-12)
    assert float(stats["kl/reward_penalty"]) == pytest.approx(-0.25, abs=1e-12)
    # k2: ½(0.25) + ½(1) = 0.625  →  r' = 1 − 0.3125 = 0.6875
    out, _ = kl_penalised_rewards(r, logp, ref, mask, 0.5, "k2")
    assert float(out) == pytest.approx(0.6875, abs=1e-12)
    # k3 with x = ref − logp = (−0.5, 1): (e^−0.5 + 0.5 − 1) + (e − 1 − 1)
    k3 = (math.exp(-0.5) - 0.5) + (math.e - 2.0)
    out, _ = kl_penalised_rewards(r, logp, ref, mask, 0.5, "k3")
    assert float(out) == pytest.approx(1.0 - 0.5 * k3, abs=1e-12)
    # abs: 0.5 + 1 = 1.5  →  r' = 0.25
    out, _ = kl_penalised_rewards(r, logp, ref, mask, 0.5, "abs")
    assert float(out) == pytest.approx(0.25, abs=1e-12)


def test_kl_in_reward_ignores_padding_garbage_and_keeps_dtype():
    rewards, logp, ref, mask = _batch(2)
    want, _ = kl_penalised_rewards(rewards, logp, ref, mask, 0.2, "k3")
    garbage_logp = torch.where(mask.bool(), logp, torch.full_like(logp, float("-inf")))
    garbage_ref = torch.where(mask.bool(), ref, torch.full_like(ref, float("nan")))
    got, stats = kl_penalised_rewards(rewards, garbage_logp, garbage_ref, mask, 0.2, "k3")
    torch.testing.assert_close(got, want, rtol=0, atol=0)
    assert all(torch.isfinite(v) for v in stats.values())
    out32, _ = kl_penalised_rewards(rewards.float(), logp.float(), ref.float(), mask.bool(), 0.2, "k1")
    assert out32.dtype == torch.float32
    with pytest.raises(ValueError, match="unknown KL estimator"):
        kl_penalised_rewards(rewards, logp, ref, mask, 0.2, "kl")


finite = st.floats(min_value=-30.0, max_value=0.0, allow_nan=False)


@settings(max_examples=25, deadline=None, derandomize=True)
@given(logp=st.lists(finite, min_size=12, max_size=12), ref=st.lists(finite, min_size=12, max_size=12),
       rewards=st.lists(st.floats(-1e3, 1e3), min_size=3, max_size=3),
       lengths=st.lists(st.integers(0, 4), min_size=3, max_size=3), coef=st.floats(0.0, 10.0),
       estimator=st.sampled_from(["k1", "abs", "k2", "k3", "low_var_kl"]))
def test_kl_in_reward_properties(logp, ref, rewards, lengths, coef, estimator):
    lp = torch.tensor(logp, dtype=torch.float64).view(3, 4)
    rf = torch.tensor(ref, dtype=torch.float64).view(3, 4)
    r = torch.tensor(rewards, dtype=torch.float64)
    mask = torch.arange(4)[None, :] < torch.tensor(lengths)[:, None]
    out, stats = kl_penalised_rewards(r, lp, rf, mask, coef, estimator)
    assert torch.isfinite(out).all() and all(torch.isfinite(v) for v in stats.values())
    # β = 0 leaves the rewards unchanged (to the bit)
    same, _ = kl_penalised_rewards(r, lp, rf, mask, 0.0, estimator)
    assert torch.equal(same, r)
    # identical policy and reference: no penalty
    none, stats0 = kl_penalised_rewards(r, lp, lp.clone(), mask, coef, estimator)
    assert torch.equal(none, r) and float(stats0["kl/reward_penalty"]) == 0.0
    # the penalty is linear in β
    twice, _ = kl_penalised_rewards(r, lp, rf, mask, 2 * coef, estimator)
    torch.testing.assert_close(r - twice, 2 * (r - out), rtol=1e-9, atol=1e-9)


KL_SEQUENCE = [0.0, 0.05, 0.1, 0.12, 0.5, 3.0, 0.09, 0.101, 0.0, 0.2, 0.15, 0.08]


@pytest.mark.parametrize("target,horizon,n", [(0.1, 10000, 256), (0.1, 50, 12), (0.02, 7, 3)])
def test_adaptive_controller_equals_verl(target, horizon, n):
    ours = AdaptiveKLController(0.05, target, horizon)
    theirs = core_algos.AdaptiveKLController(init_kl_coef=0.05, target_kl=target, horizon=horizon)
    for kl in KL_SEQUENCE:
        ours.update(kl, n)
        theirs.update(current_kl=kl, n_steps=n)
        assert abs(ours.value - float(theirs.value)) <= 1e-12
    assert ours.updates == len(KL_SEQUENCE)
    fixed, verl_fixed = FixedKLController(0.05), core_algos.FixedKLController(kl_coef=0.05)
    for kl in KL_SEQUENCE:
        fixed.update(kl, n)
        verl_fixed.update(current_kl=kl, n_steps=n)
    assert fixed.value == verl_fixed.value == 0.05


def test_adaptive_controller_hand_case_and_state_round_trip():
    c = make_kl_controller("adaptive", 0.1, target=0.1, horizon=100)
    c.update(0.15, 10)  # e = 0.5 → clipped 0.2: β = 0.1·(1 + 0.2·10/100) = 0.102
    assert c.value == pytest.approx(0.102, abs=1e-15)
    c.update(0.09, 10)  # e = −0.1: β = 0.102·(1 − 0.01) = 0.10098
    assert c.value == pytest.approx(0.10098, abs=1e-15)
    c.update(0.1, 10)  # on target: unchanged
    assert c.value == pytest.approx(0.10098, abs=1e-15)
    fresh = make_kl_controller("adaptive", 0.1, target=0.1, horizon=100)
    fresh.load_state_dict(c.state_dict())
    assert fresh.value == c.value and fresh.updates == 3
    fixed = make_kl_controller("fixed", 0.3)
    fixed.update(5.0, 100)
    assert fixed.value == 0.3 and fixed.state_dict() == {"type": "fixed", "value": 0.3}
    with pytest.raises(ValueError, match="target"):
        AdaptiveKLController(0.1, 0.0, 10)
    with pytest.raises(ValueError, match="horizon"):
        AdaptiveKLController(0.1, 0.1, 0)
    with pytest.raises(ValueError, match="unknown KL controller"):
        make_kl_controller("pid", 0.1)



# OpenRLHF is not installed: a transcription of openrlhf/models/utils.py @ 02a2605 (``compute_approx_kl`` lines
# 7-40, ``compute_reward`` lines 43-71). Its per-token rewards put r on the last valid token and −β·kl on every
# token; the experience maker passes kl already multiplied by the action mask.
def openrlhf_compute_approx_kl(log_probs, log_probs_base, kl_estimator="k1"):
    if kl_estimator == "k1":
        log_ratio = log_probs.float() - log_probs_base.float()
    if kl_estimator == "k2":
        log_ratio = log_probs.float() - log_probs_base.float()
        log_ratio = log_ratio**2 / 2.0
    if kl_estimator == "k3":
        log_ratio = log_probs.float() - log_probs_base.float()
        log_ratio = -log_ratio
        log_ratio = log_ratio.exp() - 1 - log_ratio
    return log_ratio


def openrlhf_compute_reward(r, kl_coef, kl, action_mask):
    if kl_coef <= 0.0:
        kl_coef = 0.0
    kl_reward = -kl_coef * kl
    eos_indices = action_mask.size(1) - 1 - action_mask.long().fliplr().argmax(dim=1, keepdim=True)
    last_reward = torch.zeros_like(kl).scatter_(dim=1, index=eos_indices, src=r.unsqueeze(1).to(kl.dtype))
    return last_reward + kl_reward


@pytest.mark.parametrize("estimator", ["k1", "k2", "k3"])
def test_kl_in_reward_equals_openrlhf_compute_reward_summed(estimator):
    rewards, logp, ref, mask = _batch(3)
    keep = mask.sum(-1) > 0  # OpenRLHF never sees an empty response (its action mask keeps the first token)
    rewards, logp, ref, mask = rewards[keep], logp[keep], ref[keep], mask[keep]
    # .float() in OpenRLHF's estimator: compare in float32 with float32 inputs
    logp32, ref32 = logp.float(), ref.float()
    kl = openrlhf_compute_approx_kl(logp32, ref32, estimator) * mask.float()
    theirs = openrlhf_compute_reward(rewards.float(), 0.2, kl, mask.float()).sum(-1)
    ours, _ = kl_penalised_rewards(rewards.float(), logp32, ref32, mask, 0.2, estimator)
    torch.testing.assert_close(ours, theirs, rtol=0.0, atol=1e-5)
