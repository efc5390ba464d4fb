"""The peer advantage estimators (REINFORCE++, REINFORCE++-baseline, ReMax, OPO, GPG, GDPO) and GRPO's scales.

- against verl's own estimators (``verl.trainer.ppo.core_algos.compute_*_outcome_advantage``, the real installed
  verl) on the same float64 tensors: the outcome reward on each response's last token, lmpo's sequence-level
  advantage broadcast over the response mask; max abs diff ≤ 1e-6;
- GRPO's ``scale`` against verl's ``norm_adv_by_std_in_grpo`` and TRL's ``scale_rewards`` (TRL computes its
  advantages inside ``GRPOTrainer._generate_and_score_completions``; its lines are transcribed with TRL's ``nanstd``);
- one case computed by hand per estimator;
- properties over generated inputs (hypothesis, derandomized): finite in → finite out, a group with equal rewards
  gets advantage 0 where the estimator promises it, relabelling and permuting the batch permutes the result;
- missing or malformed inputs raise InputError naming them.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from trl.trainer.utils import nanstd
from verl.trainer.config import AlgoConfig
from verl.trainer.ppo import core_algos as verl

from lmpo.errors import InputError
from lmpo.objectives.advantages import ADVANTAGE_ESTIMATORS, compute_advantages, make_estimator

TOL = dict(rtol=0.0, atol=1e-6)
NEW = ("reinforce_plus_plus", "reinforce_plus_plus_baseline", "remax", "opo", "gpg", "gdpo")


def batch(seed: int, groups: int = 5, G: int = 4, T: int = 12, K: int = 3):
    """float64 rewards with one all-equal group, group ids shuffled, lengths 1…T, K reward components."""
    gen = torch.Generator().manual_seed(seed)
    B = groups * G
    group_ids = torch.arange(groups).repeat_interleave(G)
    comps = torch.randint(0, 4, (B, K), generator=gen).double() + torch.rand(B, K, generator=gen, dtype=torch.float64)
    comps[:G] = 1.0  # group 0: every reward function gives 1 → zero variance
    weights = torch.tensor([1.0, 0.5, 2.0][:K], dtype=torch.float64)
    rewards = comps @ weights
    lengths = torch.randint(1, T + 1, (B,), generator=gen)
    perm = torch.randperm(B, generator=gen)
    return dict(rewards=rewards[perm], group_ids=group_ids[perm] * 7 + 2, lengths=lengths[perm],
                comps=comps[perm], weights=weights, baseline=torch.randn(B, generator=gen, dtype=torch.float64),
                T=T)


def verl_tensors(b):
    """verl's (token_level_rewards, response_mask, index): the reward sits on the last response token."""
    B, T = b["rewards"].shape[0], b["T"]
    mask = (torch.arange(T).unsqueeze(0) < b["lengths"].unsqueeze(1)).double()
    tlr = torch.zeros(B, T, dtype=torch.float64)
    tlr[torch.arange(B), b["lengths"] - 1] = b["rewards"]
    return tlr, mask, b["group_ids"].numpy()


def broadcast(adv, mask):
    return adv.unsqueeze(-1) * mask


# ----------------------------------------------------------------------------------------------- verl cross-checks
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_reinforce_plus_plus_equals_verl(seed):
    b = batch(seed)
    tlr, mask, _ = verl_tensors(b)
    theirs, _ = verl.compute_reinforce_plus_plus_outcome_advantage(tlr.clone(), mask, config=AlgoConfig(gamma=1.0))
    ours, _ = compute_advantages("reinforce_plus_plus", b["rewards"], b["group_ids"], lengths=b["lengths"])
    torch.testing.assert_close(broadcast(ours, mask), theirs, **TOL)
    assert theirs.abs().sum() > 0


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_reinforce_plus_plus_baseline_equals_verl(seed):
    b = batch(seed)
    tlr, mask, index = verl_tensors(b)
    theirs, _ = verl.compute_reinforce_plus_plus_baseline_outcome_advantage(tlr.clone(), mask, index)
    ours, _ = compute_advantages("reinforce_plus_plus_baseline", b["rewards"], b["group_ids"], lengths=b["lengths"])
    torch.testing.assert_close(broadcast(ours, mask), theirs, **TOL)
    assert theirs.abs().sum() > 0


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_remax_equals_verl(seed):
    b = batch(seed)
    tlr, mask, _ = verl_tensors(b)
    theirs, _ = verl.compute_remax_outcome_advantage(tlr.clone(), b["baseline"], mask)
    ours, stats = compute_advantages("remax", b["rewards"], b["group_ids"], baseline_rewards=b["baseline"])
    torch.testing.assert_close(broadcast(ours, mask), theirs, **TOL)
    assert stats["adv/baseline_mean"].item() == pytest.approx(b["baseline"].mean().item())


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_opo_equals_verl(seed):
    b = batch(seed)
    tlr, mask, index = verl_tensors(b)
    theirs, _ = verl.compute_opo_outcome_advantage(tlr.clone(), mask, index)
    ours, _ = compute_advantages("opo", b["rewards"], b["group_ids"], lengths=b["lengths"])
    torch.testing.assert_close(broadcast(ours, mask), theirs, **TOL)
    assert theirs.abs().sum() > 0


@pytest.mark.parametrize("seed", [0, 1, 2])
@pytest.mark.parametrize("f_norm", [1.0, 2.5])
def test_gpg_equals_verl(seed, f_norm):
    b = batch(seed)
    b["rewards"][::3] = 0.0  # some zero rewards: verl's B_valid counts the non-zero ones
    tlr, mask, index = verl_tensors(b)
    theirs, _ = verl.compute_gpg_outcome_advantage(tlr.clone(), mask, index, f_norm=f_norm)
    ours, stats = compute_advantages("gpg", b["rewards"], b["group_ids"], f_norm=f_norm)
    torch.testing.assert_close(broadcast(ours, mask), theirs, **TOL)
    B = b["rewards"].numel()
    assert stats["adv/gpg_alpha"].item() == pytest.approx(B / int((b["rewards"] != 0).sum()))


def _verl_gdpo(b, tlr, mask, index, norm_by_std, keys_given=True):
    B, T = tlr.shape
    P = 3  # prompt length: verl finds each response's last token from the attention mask after the prompt
    attention = torch.cat([torch.ones(B, P, dtype=torch.long), mask.long()], dim=1)
    keys = [f"r{k}" for k in range(b["comps"].shape[1])]
    cfg = AlgoConfig(gdpo_reward_keys=keys, gdpo_reward_weights=b["weights"].tolist())
    comps = {key: b["comps"][:, k].numpy() for k, key in enumerate(keys)}
    theirs, _ = verl.compute_gdpo_outcome_advantage(
        tlr.clone(), mask, index, epsilon=1e-6, norm_adv_by_std_in_grpo=norm_by_std, config=cfg,
        non_tensor_batch=comps, batch={"prompts": torch.zeros(B, P, dtype=torch.long), "attention_mask": attention})
    return theirs


@pytest.mark.parametrize("seed", [0, 1, 2])
@pytest.mark.parametrize("scale,norm_by_std", [("group", True), ("none", False)])
def test_gdpo_equals_verl(seed, scale, norm_by_std):
    b = batch(seed)
    # verl reads the reward components into float32; values a float32 holds exactly keep the comparison at 1e-6
    b["comps"] = (b["comps"] * 8).round() / 8
    tlr, mask, index = verl_tensors(b)
    theirs = _verl_gdpo(b, tlr, mask, index, norm_by_std)
    ours, _ = compute_advantages("gdpo", b["rewards"], b["group_ids"], lengths=b["lengths"],
                                 reward_components=b["comps"], reward_weights=b["weights"], scale=scale)
    torch.testing.assert_close(broadcast(ours, mask), theirs, **TOL)
    assert theirs.abs().sum() > 0


@pytest.mark.parametrize("seed", [0, 1])
def test_gdpo_single_reward_equals_verl_fallback(seed):
    """Without per-function keys verl normalises the summed reward (float64 throughout): K = 1."""
    b = batch(seed)
    tlr, mask, index = verl_tensors(b)
    theirs, _ = verl.compute_gdpo_outcome_advantage(tlr.clone(), mask, index, epsilon=1e-6)
    ours, _ = compute_advantages("gdpo", b["rewards"], b["group_ids"], lengths=b["lengths"],
                                 reward_components=b["rewards"].unsqueeze(1))
    torch.testing.assert_close(broadcast(ours, mask), theirs, **TOL)


@pytest.mark.parametrize("seed", [0, 1, 2])
@pytest.mark.parametrize("scale,norm_by_std", [("group", True), ("none", False)])
def test_grpo_scale_equals_verl_norm_adv_by_std(seed, scale, norm_by_std):
    b = batch(seed)
    tlr, mask, index = verl_tensors(b)
    theirs, _ = verl.compute_grpo_outcome_advantage(tlr.clone(), mask, index, epsilon=1e-6,
                                                    norm_adv_by_std_in_grpo=norm_by_std)
    ours, _ = compute_advantages("grpo", b["rewards"], b["group_ids"], scale=scale, eps=1e-6)
    torch.testing.assert_close(broadcast(ours, mask), theirs, **TOL)


def _trl_advantages(rewards: torch.Tensor, G: int, scale_rewards: str) -> torch.Tensor:
    """TRL 1.x ``GRPOTrainer._generate_and_score_completions``, ``multi_objective_aggregation="sum_then_normalize"``,
    one reward function (groups contiguous, G completions each), with TRL's own ``nanstd``."""
    mean_grouped_rewards = torch.nanmean(rewards.view(-1, G), dim=1).repeat_interleave(G, dim=0)
    if scale_rewards in ["group", "none"]:
        std_rewards = nanstd(rewards.view(-1, G), dim=1).repeat_interleave(G, dim=0)
    else:
        std_rewards = nanstd(rewards).expand_as(rewards)
    advantages = rewards - mean_grouped_rewards
    if scale_rewards != "none":
        advantages = advantages / (std_rewards + 1e-4)
    return advantages


@pytest.mark.parametrize("seed", [0, 1, 2])
@pytest.mark.parametrize("scale", ["group", "batch", "none"])
def test_grpo_scale_equals_trl_scale_rewards(seed, scale):
    b = batch(seed)
    order = torch.argsort(b["group_ids"], stable=True)  # TRL's groups are contiguous
    r, g = b["rewards"][order], b["group_ids"][order]
    ours, _ = compute_advantages("grpo", r, g, scale=scale)
    torch.testing.assert_close(ours, _trl_advantages(r, 4, scale), **TOL)


# ----------------------------------------------------------------------------------------------- hand cases
def test_reinforce_plus_plus_hand_case():
    r, g = torch.tensor([1.0, 3.0], dtype=torch.float64), torch.tensor([0, 1])
    # sequences: μ = 2, σ² = (1 + 1)/(2 − 1) = 2 → ∓1/√2
    adv, _ = compute_advantages("reinforce_plus_plus", r, g, whiten="sequences", eps=0.0)
    torch.testing.assert_close(adv, torch.tensor([-1.0, 1.0], dtype=torch.float64) / math.sqrt(2))
    # tokens, lengths [3, 1]: μ = (3·1 + 1·3)/4 = 1.5, σ² = (3·0.25 + 1·2.25)/(4 − 1) = 1 → [−0.5, 1.5]
    adv, _ = compute_advantages("reinforce_plus_plus", r, g, lengths=torch.tensor([3, 1]), eps=0.0)
    torch.testing.assert_close(adv, torch.tensor([-0.5, 1.5], dtype=torch.float64))


def test_reinforce_plus_plus_baseline_hand_case():
    r, g = torch.tensor([1.0, 0.0, 2.0, 2.0], dtype=torch.float64), torch.tensor([0, 0, 1, 1])
    lengths = torch.tensor([1, 3, 2, 2])
    # centred [0.5, −0.5, 0, 0]; token weights [1, 3, 2, 2], Σ = 8: μ = (0.5 − 1.5)/8 = −0.125,
    # σ² = (1·0.625² + 3·0.375² + 4·0.125²)/7 = 0.875/7 = 0.125 → (c − μ)/0.353553 = [1.767767, −1.060660, 0.353553 ×2]
    adv, _ = compute_advantages("reinforce_plus_plus_baseline", r, g, lengths=lengths, eps=0.0)
    torch.testing.assert_close(adv, torch.tensor([1.7677669529663689, -1.0606601717798212, 0.3535533905932738,
                                                  0.3535533905932738], dtype=torch.float64))
    # sequences: μ = 0, σ² = (0.25 + 0.25)/3 = 1/6 → [±1.224745, 0, 0]: the equal group keeps 0
    adv, _ = compute_advantages("reinforce_plus_plus_baseline", r, g, whiten="sequences", eps=0.0)
    torch.testing.assert_close(adv, torch.tensor([1.224744871391589, -1.224744871391589, 0.0, 0.0],
                                                 dtype=torch.float64))


def test_remax_hand_case():
    # r − b: [1 − 0.5, 0 − 0.5, 0.5 − 0.5]
    adv, stats = compute_advantages("remax", torch.tensor([1.0, 0.0, 0.5]), torch.tensor([0, 1, 2]),
                                    baseline_rewards=torch.tensor([0.5, 0.5, 0.5]))
    torch.testing.assert_close(adv, torch.tensor([0.5, -0.5, 0.0]))
    assert stats["adv/baseline_mean"].item() == pytest.approx(0.5)


def test_opo_hand_case():
    r = torch.tensor([1.0, 0.0, 1.0, 0.0, 2.0], dtype=torch.float64)
    g = torch.tensor([0, 0, 0, 1, 1])
    lengths = torch.tensor([1, 2, 3, 3, 1])
    # group 0: b = (1·1 + 2·0 + 3·1)/6 = 2/3 → [1/3, −2/3, 1/3]; group 1: b = (3·0 + 1·2)/4 = 0.5 → [−0.5, 1.5]
    adv, _ = compute_advantages("opo", r, g, lengths=lengths)
    torch.testing.assert_close(adv, torch.tensor([1 / 3, -2 / 3, 1 / 3, -0.5, 1.5], dtype=torch.float64))


def test_gpg_hand_case():
    r = torch.tensor([1.0, 0.0, 0.0, 0.0, 1.0, 1.0])
    g = torch.tensor([0, 0, 0, 0, 1, 1])
    centred = torch.tensor([0.75, -0.25, -0.25, -0.25, 0.0, 0.0])  # group 0 mean 0.25; group 1 all equal → 0
    # verl's B_valid: 3 non-zero rewards of B = 6 → α = 2
    adv, stats = compute_advantages("gpg", r, g)
    torch.testing.assert_close(adv, 2.0 * centred)
    assert stats["adv/gpg_alpha"].item() == 2.0
    # group_signal: 4 completions in a group whose rewards differ → α = 1.5; F_norm = 2 halves it
    adv, _ = compute_advantages("gpg", r, g, valid="group_signal", f_norm=2.0)
    torch.testing.assert_close(adv, 0.75 * centred)


def test_gdpo_hand_case():
    g = torch.tensor([0, 0, 1, 1])
    comps = torch.tensor([[1.0, 0.0], [0.0, 2.0], [1.0, 3.0], [1.0, 1.0]], dtype=torch.float64)
    weights = torch.tensor([1.0, 2.0], dtype=torch.float64)
    r = comps @ weights
    # function 1: group 0 [1, 0] → ±0.5/√0.5 = [0.707107, −0.707107]; group 1 equal → [0, 0]
    # function 2: group 0 [0, 2] → [−0.707107, 0.707107]; group 1 [3, 1] → [0.707107, −0.707107]
    # 1·f1 + 2·f2 = [−0.707107, 0.707107, 1.414214, −1.414214]
    s = 1 / math.sqrt(2)
    total = torch.tensor([-s, s, 2 * s, -2 * s], dtype=torch.float64)
    adv, _ = compute_advantages("gdpo", r, g, reward_components=comps, reward_weights=weights, eps=0.0, whiten="none")
    torch.testing.assert_close(adv, total)
    # whitened per sequence: μ = 0, σ² = (0.5 + 0.5 + 2 + 2)/3 = 5/3 → total/1.290994 = [∓0.547723, ±1.095445]
    adv, _ = compute_advantages("gdpo", r, g, reward_components=comps, reward_weights=weights, eps=0.0,
                                whiten="sequences", whiten_eps=0.0)
    torch.testing.assert_close(adv, total / math.sqrt(5 / 3))
    # GDPO differs from GRPO on the sum: group 0's summed rewards [1, 4] would give ±0.707107 there
    grpo, _ = compute_advantages("grpo", r, g, eps=0.0)
    assert not torch.allclose(grpo, adv)


# ----------------------------------------------------------------------------------------------- properties
def _inputs(b):
    return dict(lengths=b["lengths"], baseline_rewards=b["baseline"], reward_components=b["comps"],
                reward_weights=b["weights"])


@st.composite
def draws(draw):
    groups, G, K = draw(st.integers(1, 4)), draw(st.integers(1, 4)), draw(st.integers(1, 3))
    B = groups * G

    def floats(n, low=-50.0, high=50.0):
        return torch.tensor(draw(st.lists(st.floats(low, high, allow_nan=False, width=64), min_size=n, max_size=n)),
                            dtype=torch.float64)

    comps = floats(B * K).view(B, K)
    equal = draw(st.integers(0, groups - 1))
    comps[equal * G:(equal + 1) * G] = comps[equal * G].clone()  # one group whose rewards are all equal
    weights = floats(K, 0.0, 3.0)
    return dict(rewards=comps @ weights, group_ids=torch.arange(groups).repeat_interleave(G), comps=comps,
                weights=weights, lengths=torch.tensor(draw(st.lists(st.integers(0, 20), min_size=B, max_size=B))),
                baseline=floats(B), equal=slice(equal * G, (equal + 1) * G))


SETTINGS = settings(max_examples=25, deadline=None, derandomize=True,
                    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
#: estimator options under which a group of equal rewards gets advantage exactly 0 (up to rounding)
ZERO_FOR_EQUAL_GROUP = {
    "grpo": {}, "rloo": {}, "opo": {}, "gpg": {}, "gpg_signal": {"valid": "group_signal"},
    "reinforce_plus_plus_baseline": {"whiten": "sequences"}, "gdpo": {"whiten": "sequences"},
    "gdpo_unwhitened": {"whiten": "none", "scale": "none"},
}


@pytest.mark.parametrize("name", sorted(ADVANTAGE_ESTIMATORS))
@SETTINGS
@given(b=draws())
def test_finite_in_finite_out(name, b):
    adv, stats = compute_advantages(name, b["rewards"], b["group_ids"], **_inputs(b))
    assert adv.shape == b["rewards"].shape and torch.isfinite(adv).all()
    assert all(torch.isfinite(v).all() for v in stats.values()), stats


@pytest.mark.parametrize("case", sorted(ZERO_FOR_EQUAL_GROUP))
@SETTINGS
@given(b=draws())
def test_group_with_equal_rewards_gets_zero(case, b):
    name = case.split("_signal")[0].split("_unwhitened")[0]
    adv, _ = compute_advantages(name, b["rewards"], b["group_ids"], **_inputs(b), **ZERO_FOR_EQUAL_GROUP[case])
    scale = 1.0 + adv.abs().max().item()
    assert adv[b["equal"]].abs().max().item() <= 1e-9 * scale


@SETTINGS
@given(b=draws())
def test_remax_zero_when_sample_equals_greedy_and_reinforce_pp_zero_for_equal_batch(b):
    adv, _ = compute_advantages("remax", b["rewards"], b["group_ids"], baseline_rewards=b["rewards"].clone())
    assert (adv == 0).all()
    same = torch.full_like(b["rewards"], b["rewards"][0].item())
    adv, _ = compute_advantages("reinforce_plus_plus", same, b["group_ids"], lengths=b["lengths"])
    assert adv.abs().max().item() <= 1e-6


@pytest.mark.parametrize("name", NEW)
def test_relabelling_and_permuting_the_batch_permutes_the_result(name):
    b = batch(4)
    adv, _ = compute_advantages(name, b["rewards"], b["group_ids"], **_inputs(b))
    perm = torch.randperm(adv.numel(), generator=torch.Generator().manual_seed(1))
    moved = {k: (v[perm] if k != "reward_weights" else v) for k, v in _inputs(b).items()}
    adv_p, _ = compute_advantages(name, b["rewards"][perm], b["group_ids"][perm] * 3 - 11, **moved)
    torch.testing.assert_close(adv_p, adv[perm])


# ----------------------------------------------------------------------------------------------- inputs and options
def test_required_inputs_follow_the_options():
    assert make_estimator("reinforce_plus_plus").required_inputs() == {"lengths"}
    assert make_estimator("reinforce_plus_plus", whiten="sequences").required_inputs() == set()
    assert make_estimator("gdpo").required_inputs() == {"reward_components", "lengths"}
    assert make_estimator("gdpo", whiten="none").required_inputs() == {"reward_components"}
    assert make_estimator("remax").required_inputs() == {"baseline_rewards"}
    assert make_estimator("grpo").required_inputs() == set()
    # the objective's scale fills the estimator's own scale, and nothing else
    assert make_estimator("gdpo", default_scale="none").scale == "none"
    assert make_estimator("gdpo", default_scale="none", scale="batch").scale == "batch"
    assert make_estimator("rloo", default_scale="group").scale == "group"
    assert make_estimator("opo", default_scale="group") == make_estimator("opo")


def test_missing_and_bad_inputs_raise_input_error():
    r, g = torch.tensor([1.0, 0.0, 0.5]), torch.tensor([0, 0, 1])
    with pytest.raises(InputError, match="'remax' needs the input.*`baseline_rewards`"):
        compute_advantages("remax", r, g)
    with pytest.raises(InputError, match="'opo' needs the input.*`lengths`"):
        compute_advantages("opo", r, g)
    with pytest.raises(InputError, match="'gdpo' needs the input.*`reward_components`"):
        compute_advantages("gdpo", r, g, lengths=torch.ones(3))
    with pytest.raises(InputError, match="`lengths` has shape \\(2,\\)"):
        compute_advantages("opo", r, g, lengths=torch.ones(2))
    with pytest.raises(InputError, match="`lengths` has a negative entry"):
        compute_advantages("opo", r, g, lengths=torch.tensor([1, -1, 2]))
    with pytest.raises(InputError, match="`baseline_rewards` holds non-finite"):
        compute_advantages("remax", r, g, baseline_rewards=torch.tensor([0.0, float("nan"), 1.0]))
    with pytest.raises(InputError, match="`reward_weights` has shape \\(3,\\).*K=2"):
        compute_advantages("gdpo", r, g, whiten="none", reward_components=torch.ones(3, 2),
                           reward_weights=torch.ones(3))
    with pytest.raises(InputError, match="unknown input.*'length'.*Did you mean 'lengths'"):
        make_estimator("opo")(r, g, length=torch.ones(3))
    with pytest.raises(ValueError, match="has no option 'whitten'.*Did you mean 'whiten'"):
        compute_advantages("reinforce_plus_plus", r, g, whitten="tokens")
    with pytest.raises(ValueError, match="whiten='bogus'"):
        make_estimator("gdpo", whiten="bogus")
    with pytest.raises(ValueError, match="f_norm=0"):
        make_estimator("gpg", f_norm=0)
    # an input an estimator does not use is ignored (a caller may pass everything it has)
    adv, _ = compute_advantages("grpo", r, g, lengths=torch.tensor([1, 2, 3]))
    torch.testing.assert_close(adv, compute_advantages("grpo", r, g)[0])


def test_verl_index_may_be_any_hashable():
    """verl's index is usually a numpy array of uid strings; lmpo's group ids are integers: same groups, same result."""
    b = batch(5)
    tlr, mask, _ = verl_tensors(b)
    uids = np.array([f"uid-{int(i)}" for i in b["group_ids"]], dtype=object)
    theirs, _ = verl.compute_opo_outcome_advantage(tlr.clone(), mask, uids)
    ours, _ = compute_advantages("opo", b["rewards"], b["group_ids"], lengths=b["lengths"])
    torch.testing.assert_close(broadcast(ours, mask), theirs, **TOL)
