"""RLVCR advantages: a hand-computed batch, invariances, and the w = 0 / w = 1 limits."""

from __future__ import annotations

import math

import pytest
import torch

from lmpo.objectives.advantages import compute_advantages
from lmpo.rlvcr.advantages import group_normalized_advantages, rlvcr_advantages
from lmpo.rlvcr.config import RLVCRConfig

S3 = math.sqrt(1.0 / 3.0)  # unbiased std of {1, 0, 1} and of {1, 0, 0}


def hand_batch():
    """Two prompts × 3 originals; successful originals 0, 2 (prompt 0) and 3 (prompt 1), four levels.

    rows 0-5: originals, rewards p0 [1, 0, 1], p1 [1, 0, 0]; rows 6-14: 3 expansions per thinking group.
    """
    rewards = torch.tensor([1.0, 0.0, 1.0, 1.0, 0.0, 0.0] + [1.0] * 9)
    group_ids = torch.tensor([0, 0, 0, 1, 1, 1] + [0, 0, 0, 0, 0, 0, 1, 1, 1])
    is_original = torch.tensor([True] * 6 + [False] * 9)
    thinking_group_id = torch.tensor([0, -1, 1, 2, -1, -1] + [0, 0, 0, 1, 1, 1, 2, 2, 2])
    thinking_rewards = torch.tensor(
        [0.8, 99.0, 0.5, 0.7, -99.0, 0.0]  # values outside groups (rows 1, 4, 5) must be ignored
        + [0.2, 0.6, 0.4]  # group 0: {0.8, 0.2, 0.6, 0.4}, mean 0.5
        + [0.5, 0.9, 0.1]  # group 1: {0.5, 0.5, 0.9, 0.1}, mean 0.5
        + [0.3, 0.7, 0.3]  # group 2: {0.7, 0.3, 0.7, 0.3}, mean 0.5
    )
    return rewards, group_ids, is_original, thinking_group_id, thinking_rewards


def test_hand_computed_batch():
    r, g, o, tg, tr = hand_batch()
    adv, parts = rlvcr_advantages(r, g, o, tg, tr, thinking_weight=0.5, eps=0.0)
    # Action: p0 mean 2/3, std √(1/3): 1 -> (1/3)/√(1/3) = √(1/3) = 0.57735, 0 -> −2√(1/3) = −1.15470.
    #         p1 mean 1/3, std √(1/3): 1 -> 2√(1/3) = 1.15470, 0 -> −√(1/3) = −0.57735.
    # Expanded rows copy their original's: group 0 and 1 -> 0.57735, group 2 -> 1.15470.
    action = [S3, -2 * S3, S3, 2 * S3, -S3, -S3] + [S3] * 3 + [S3] * 3 + [2 * S3] * 3
    # Thinking: reward − group mean (0.5 in every group); 0 outside groups.
    thinking = [0.3, 0.0, 0.0, 0.2, 0.0, 0.0] + [-0.3, 0.1, -0.1] + [0.0, 0.4, -0.4] + [-0.2, 0.2, -0.2]
    # Final = 0.5·action + 0.5·thinking, e.g. row 0: 0.5·0.57735 + 0.5·0.3 = 0.43868,
    # row 14: 0.5·1.15470 − 0.5·0.2 = 0.47735, row 1 (failed original): 0.5·(−1.15470) = −0.57735.
    final = [0.5 * a + 0.5 * t for a, t in zip(action, thinking)]
    torch.testing.assert_close(parts["action"], torch.tensor(action), atol=1e-6, rtol=0)
    torch.testing.assert_close(parts["thinking"], torch.tensor(thinking), atol=1e-6, rtol=0)
    torch.testing.assert_close(adv, torch.tensor(final), atol=1e-6, rtol=0)
    assert adv[0].item() == pytest.approx(0.438675, abs=1e-6)
    assert adv[14].item() == pytest.approx(0.477350, abs=1e-6)
    assert adv[1].item() == pytest.approx(-0.577350, abs=1e-6)
    assert int(parts["rlvcr/thinking_groups"]) == 3
    assert int(parts["rlvcr/expanded_samples"]) == 9


def random_batch(seed: int, prompts: int = 4, G: int = 4, L: int = 4, p_success: float = 0.5):
    gen = torch.Generator().manual_seed(seed)
    n = prompts * G
    rewards = (torch.rand(n, generator=gen) < p_success).float() + 0.1 * torch.rand(n, generator=gen)
    group_ids = torch.arange(prompts).repeat_interleave(G) * 7 + 3  # arbitrary (non-contiguous) ids
    is_original = torch.ones(n, dtype=torch.bool)
    tg = torch.full((n,), -1, dtype=torch.long)
    extra_r, extra_g, extra_tg = [], [], []
    next_id = 100
    for i in range(n):
        if rewards[i] > 0.5:
            tg[i] = next_id
            extra_r += [float(rewards[i])] * (L - 1)
            extra_g += [int(group_ids[i])] * (L - 1)
            extra_tg += [next_id] * (L - 1)
            next_id += 5
    m = len(extra_r)
    rewards = torch.cat([rewards, torch.tensor(extra_r)])
    group_ids = torch.cat([group_ids, torch.tensor(extra_g, dtype=torch.long)])
    is_original = torch.cat([is_original, torch.zeros(m, dtype=torch.bool)])
    tg = torch.cat([tg, torch.tensor(extra_tg, dtype=torch.long)])
    thinking_rewards = torch.rand(n + m, generator=gen)
    perm = torch.randperm(n + m, generator=gen)  # the function must not depend on row order
    return rewards[perm], group_ids[perm], is_original[perm], tg[perm], thinking_rewards[perm]


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_action_advantages_ignore_expanded_samples(seed):
    r, g, o, tg, tr = random_batch(seed)
    assert (~o).sum() > 0
    _, with_exp = rlvcr_advantages(r, g, o, tg, tr)
    # Remove every expanded sample (their originals become singletons outside groups).
    keep = o
    _, without = rlvcr_advantages(r[keep], g[keep], o[keep], torch.full_like(tg[keep], -1), tr[keep])
    torch.testing.assert_close(with_exp["action"][o], without["action"], rtol=0, atol=0)
    # Expanded rows carry exactly their original's action advantage.
    for i in (~o).nonzero().squeeze(-1).tolist():
        j = ((tg == tg[i]) & o).nonzero().item()
        assert with_exp["action"][i] == with_exp["action"][j]


@pytest.mark.parametrize("seed", [0, 1, 2, 3])
def test_thinking_advantages_sum_to_zero_per_group(seed):
    r, g, o, tg, tr = random_batch(seed)
    _, parts = rlvcr_advantages(r, g, o, tg, tr)
    th = parts["thinking"]
    for gid in tg[tg >= 0].unique().tolist():
        members = tg == gid
        assert members.sum() == 4
        assert abs(th[members].sum().item()) < 1e-6
        torch.testing.assert_close(th[members], tr[members] - tr[members].mean(), rtol=0, atol=1e-6)
    assert (th[tg < 0] == 0).all()


@pytest.mark.parametrize("scale", ["group", "batch", "none"])
def test_weight_zero_is_plain_grpo_and_weight_one_is_thinking_only(scale):
    r, g, o, tg, tr = random_batch(5)
    adv0, parts = rlvcr_advantages(r, g, o, tg, tr, thinking_weight=0.0, scale=scale)
    plain, _ = compute_advantages("grpo", r[o], g[o], scale=scale)  # what the trainer computes without RLVCR
    assert torch.equal(adv0[o], plain)  # bit for bit on the rollout's samples
    torch.testing.assert_close(adv0, parts["action"], rtol=0, atol=0)
    adv1, parts1 = rlvcr_advantages(r, g, o, tg, tr, thinking_weight=1.0, scale=scale)
    torch.testing.assert_close(adv1, parts1["thinking"], rtol=0, atol=0)
    assert (adv1[tg < 0] == 0).all()


def test_no_expansion_with_any_weight_scales_grpo():
    r, g = torch.tensor([1.0, 0.0, 0.5, 2.0]), torch.tensor([0, 0, 1, 1])
    o, tg = torch.ones(4, dtype=torch.bool), torch.full((4,), -1)
    adv, _ = rlvcr_advantages(r, g, o, tg, torch.zeros(4), thinking_weight=0.25, eps=0.0)
    # Each pair has unbiased std |a−b|/√2, so GRPO gives ±1/√2 = ±0.70711; final = 0.75·that.
    torch.testing.assert_close(adv, 0.75 * torch.tensor([1, -1, -1, 1]) / math.sqrt(2), rtol=0, atol=1e-6)


@pytest.mark.parametrize("seed", [0, 1])
@pytest.mark.parametrize("scale", ["group", "batch", "none"])
def test_group_normalized_matches_slow_loop(seed, scale):
    gen = torch.Generator().manual_seed(seed)
    r = torch.randint(0, 3, (24,), generator=gen).float() * 0.5
    g = torch.randint(0, 6, (24,), generator=gen) * 3
    g[0] = 100  # a singleton group
    r[g == 3] = 0.25  # a zero-variance group (if present)
    got = group_normalized_advantages(r, g, 1e-6, scale)
    expect = torch.zeros(24)
    for gid in g.unique():
        m = g == gid
        x = r[m]
        if m.sum() < 2 or bool((x == x[0]).all()):
            continue
        denom = {"group": x.std() + 1e-6, "batch": r.std() + 1e-6, "none": 1.0}[scale]
        expect[m] = (x - x.mean()) / denom
    torch.testing.assert_close(got, expect, rtol=1e-5, atol=1e-6)


def test_permuting_rows_permutes_result():
    r, g, o, tg, tr = random_batch(7)
    adv, _ = rlvcr_advantages(r, g, o, tg, tr)
    perm = torch.randperm(len(r), generator=torch.Generator().manual_seed(0))
    adv_p, _ = rlvcr_advantages(r[perm], g[perm], o[perm], tg[perm], tr[perm])
    torch.testing.assert_close(adv_p, adv[perm], rtol=0, atol=1e-6)


def test_inputs_are_not_mutated_and_dtype_kept():
    r, g, o, tg, tr = hand_batch()
    copies = [t.clone() for t in (r, g, o, tg, tr)]
    adv, _ = rlvcr_advantages(r.double(), g, o, tg, tr.double())
    assert adv.dtype == torch.float64
    for a, b in zip((r, g, o, tg, tr), copies):
        assert torch.equal(a, b)


def test_validation_errors_name_the_field():
    r, g, o, tg, tr = hand_batch()
    with pytest.raises(ValueError, match="thinking_weight"):
        rlvcr_advantages(r, g, o, tg, tr, thinking_weight=1.5)
    with pytest.raises(ValueError, match="group_ids"):
        rlvcr_advantages(r, g[:-1], o, tg, tr)
    with pytest.raises(ValueError, match="is_original"):
        rlvcr_advantages(r, g, o.long(), tg, tr)
    with pytest.raises(ValueError, match="scale"):
        rlvcr_advantages(r, g, o, tg, tr, scale="std")
    bad = tg.clone()
    bad[6] = -1  # an expanded sample outside any group
    with pytest.raises(ValueError, match="thinking_group_id = -1"):
        rlvcr_advantages(r, g, o, bad, tr)
    two = o.clone()
    two[6] = True  # group 0 now has two originals
    with pytest.raises(ValueError, match="exactly one original"):
        rlvcr_advantages(r, g, two, tg, tr)
    mixed = g.clone()
    mixed[7] = 1  # a member of thinking group 0 (prompt 0) claims prompt 1
    with pytest.raises(ValueError, match="mixes prompt groups"):
        rlvcr_advantages(r, mixed, o, tg, tr)
    nan = tr.clone()
    nan[6] = float("nan")
    with pytest.raises(ValueError, match="not finite"):
        rlvcr_advantages(r, g, o, tg, nan)


def test_split_family_action_by_hand():
    # One prompt, rewards [1, 0, 0, 0]: mean 0.25, unbiased std 0.5 → A = [1.5, −0.5, −0.5, −0.5] (ε = 0).
    # The success (row 0) is expanded into a family of 4 (rows 0, 4, 5, 6).
    # copy: every member carries 1.5, so the batch's action advantages sum to 1.5·4 − 1.5 = 4.5;
    # split: every member carries 1.5 / 4 = 0.375, the family weighs 1.5 like the one sampled completion and the
    # batch sums to 0 again. This is what stops the small-scale collapse (docs/rlvcr.md, "Collapse at small scale").
    r = torch.tensor([1.0, 0.0, 0.0, 0.0, 1.0, 1.0, 1.0])
    g = torch.zeros(7, dtype=torch.long)
    o = torch.tensor([True, True, True, True, False, False, False])
    tg = torch.tensor([0, -1, -1, -1, 0, 0, 0])
    tr = torch.tensor([0.9, 0.0, 0.0, 0.0, 0.1, 0.5, 0.3])  # mean 0.45 → thinking [0.45, 0, 0, 0, −0.35, 0.05, −0.15]
    _, copy = rlvcr_advantages(r, g, o, tg, tr, thinking_weight=0.0, eps=0.0)
    adv, split = rlvcr_advantages(r, g, o, tg, tr, thinking_weight=0.5, eps=0.0, family_action="split")
    torch.testing.assert_close(copy["action"], torch.tensor([1.5, -0.5, -0.5, -0.5, 1.5, 1.5, 1.5]))
    assert float(copy["action"].sum()) == pytest.approx(4.5)
    torch.testing.assert_close(split["action"], torch.tensor([0.375, -0.5, -0.5, -0.5, 0.375, 0.375, 0.375]))
    assert float(split["action"].sum()) == pytest.approx(0.0, abs=1e-6)
    # final = 0.5·action + 0.5·thinking: the worst-thinking expansion (row 4) now has a negative advantage
    torch.testing.assert_close(adv, torch.tensor([0.4125, -0.25, -0.25, -0.25, 0.0125, 0.2125, 0.1125]))
    with_copy, _ = rlvcr_advantages(r, g, o, tg, tr, thinking_weight=0.5, eps=0.0)
    assert float(with_copy[4]) == pytest.approx(0.5 * 1.5 - 0.5 * 0.35)  # 0.575: copy rewards broken thinking


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_split_keeps_the_batch_centred_and_each_family_at_its_originals_weight(seed):
    gen = torch.Generator().manual_seed(seed)
    B = 12
    r = (torch.rand(B, generator=gen) > 0.5).float()
    g = torch.arange(B) // 4
    succ = (r > 0).nonzero().squeeze(-1).tolist()
    L = 4
    rows_r, rows_g, rows_tg = [], [], []
    tg = torch.full((B,), -1, dtype=torch.long)
    for k, i in enumerate(succ):
        tg[i] = k
        rows_r += [1.0] * (L - 1)
        rows_g += [int(g[i])] * (L - 1)
        rows_tg += [k] * (L - 1)
    r_all = torch.cat([r, torch.tensor(rows_r)])
    g_all = torch.cat([g, torch.tensor(rows_g, dtype=torch.long)])
    o_all = torch.tensor([True] * B + [False] * len(rows_r))
    tg_all = torch.cat([tg, torch.tensor(rows_tg, dtype=torch.long)])
    tr = torch.rand(len(r_all), generator=gen)
    _, parts = rlvcr_advantages(r_all, g_all, o_all, tg_all, tr, thinking_weight=0.3, family_action="split")
    plain = group_normalized_advantages(r, g)
    assert float(parts["action"].sum()) == pytest.approx(float(plain.sum()), abs=1e-5)
    for k, i in enumerate(succ):
        assert float(parts["action"][tg_all == k].sum()) == pytest.approx(float(plain[i]), abs=1e-5)


def test_family_action_is_checked():
    r, g, o, tg, tr = hand_batch()
    with pytest.raises(ValueError, match="family_action"):
        rlvcr_advantages(r, g, o, tg, tr, family_action="share")


def test_original_family_action_by_hand():
    # The batch of test_split_family_action_by_hand with family_action = original: the success (row 0) keeps its
    # whole action advantage 1.5, its expansions (rows 4–6) get no action advantage, so their final advantage is
    # w·thinking alone. With split the worst expansions were still reinforced through their 1/4 share (row 6:
    # 0.1125 > 0 for thinking below its family's mean); here every expansion whose thinking reward is below
    # the family's mean gets a negative advantage (docs/rlvcr.md, "Collapse at small scale").
    r = torch.tensor([1.0, 0.0, 0.0, 0.0, 1.0, 1.0, 1.0])
    g = torch.zeros(7, dtype=torch.long)
    o = torch.tensor([True, True, True, True, False, False, False])
    tg = torch.tensor([0, -1, -1, -1, 0, 0, 0])
    tr = torch.tensor([0.9, 0.0, 0.0, 0.0, 0.1, 0.5, 0.3])  # thinking [0.45, 0, 0, 0, −0.35, 0.05, −0.15]
    adv, parts = rlvcr_advantages(r, g, o, tg, tr, thinking_weight=0.5, eps=0.0, family_action="original")
    torch.testing.assert_close(parts["action"], torch.tensor([1.5, -0.5, -0.5, -0.5, 0.0, 0.0, 0.0]))
    assert float(parts["action"].sum()) == pytest.approx(0.0, abs=1e-6)  # GRPO's: the originals' alone
    torch.testing.assert_close(adv, torch.tensor([0.975, -0.25, -0.25, -0.25, -0.175, 0.025, -0.075]))
    torch.testing.assert_close(adv[4:], 0.5 * parts["thinking"][4:])
    # w = 0: the expansions carry nothing and the originals are plain GRPO
    adv0, _ = rlvcr_advantages(r, g, o, tg, tr, thinking_weight=0.0, eps=0.0, family_action="original")
    torch.testing.assert_close(adv0, torch.tensor([1.5, -0.5, -0.5, -0.5, 0.0, 0.0, 0.0]))


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_original_family_action_gives_expansions_only_their_thinking_advantage(seed):
    r, g, o, tg, tr = random_batch(seed)
    adv, parts = rlvcr_advantages(r, g, o, tg, tr, thinking_weight=0.3, family_action="original")
    plain = group_normalized_advantages(r[o], g[o])
    torch.testing.assert_close(parts["action"][o], plain)
    assert bool((parts["action"][~o] == 0).all())
    torch.testing.assert_close(adv[~o], 0.3 * parts["thinking"][~o])
    with pytest.raises(ValueError, match="family_action"):
        RLVCRConfig(enabled=True, family_action="share")
