"""DAPO complete in the trainer (Yu et al. 2025, arXiv:2503.14476): dynamic sampling, the soft overlong
punishment and the masking of truncated completions, each by hand, against its peer, and in a trainer run."""

from __future__ import annotations

import math
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest
import torch
from trainer_helpers import make_trainer

from lmpo.config import ConfigError
from lmpo.errors import RunError
from lmpo.generation import Rollout, concat_rollouts
from lmpo.objectives import Objective
from lmpo.rewards import REWARDS
from lmpo.rewards.overlong import overlong_penalty
from lmpo.trainer.config import load_config
from lmpo.trainer.step.sampling import ScoredRollout, dynamic_sample, informative_groups, mask_truncated

ROOT = Path(__file__).resolve().parents[2]


# ---------------------------------------------------------------- overlong reward shaping
def test_overlong_penalty_by_hand_at_the_boundaries():
    # L_max = 10, L_cache = 4: free up to 6 tokens, then -1/4 per token, -1 at 10 and the floor beyond
    lengths = torch.tensor([0, 5, 6, 7, 8, 9, 10, 11])
    expected = torch.tensor([0.0, 0.0, 0.0, -0.25, -0.5, -0.75, -1.0, -1.0])
    torch.testing.assert_close(overlong_penalty(lengths, 10, 4), expected)
    torch.testing.assert_close(overlong_penalty(lengths, 10, 4, penalty_factor=0.5), expected * 0.5)
    # the whole budget as buffer: linear from 0 tokens
    torch.testing.assert_close(overlong_penalty(torch.tensor([0, 1, 2]), 2, 2), torch.tensor([0.0, -0.5, -1.0]))
    for bad in (0, 11):
        with pytest.raises(ValueError, match="buffer_tokens"):
            overlong_penalty(lengths, 10, bad)


def test_overlong_penalty_equals_verls_dapo_reward_manager():
    from verl import DataProto
    from verl.workers.reward_manager.dapo import DAPORewardManager

    class Tok:  # the manager decodes responses only to pass them to compute_score
        eos_token = "</s>"

        def decode(self, ids, skip_special_tokens=True):
            return "x" * len(ids)

    L_max, buf, factor = 12, 5, 0.7
    lengths = torch.arange(1, L_max + 1)
    B, P = lengths.numel(), 3
    attention = torch.zeros(B, P + L_max, dtype=torch.long)
    attention[:, :P] = 1
    attention[:, P:] = (torch.arange(L_max)[None, :] < lengths[:, None]).long()
    data = DataProto.from_dict(
        tensors={"prompts": torch.ones(B, P, dtype=torch.long), "responses": torch.ones(B, L_max, dtype=torch.long),
                 "attention_mask": attention},
        non_tensors={"reward_model": np.array([{"ground_truth": "1"}] * B, dtype=object),
                     "data_source": np.array(["t"] * B, dtype=object)})
    manager = DAPORewardManager(Tok(), 0, compute_score=lambda **kw: 0.0, max_resp_len=L_max,
                                overlong_buffer_cfg=SimpleNamespace(enable=True, len=buf, penalty_factor=factor,
                                                                    log=False))
    theirs = manager(data).sum(-1)  # the score (0 here) plus the penalty, at the last response token
    torch.testing.assert_close(overlong_penalty(lengths, L_max, buf, factor), theirs)


def test_overlong_penalty_equals_trls_soft_overlong_punishment():
    from trl.rewards import get_soft_overlong_punishment

    L_max, buf = 12, 5
    lengths = list(range(0, L_max + 4))  # TRL scores lengths beyond L_max too: the -1 floor
    theirs = torch.tensor(get_soft_overlong_punishment(L_max, buf)([[1] * n for n in lengths]))
    torch.testing.assert_close(overlong_penalty(torch.tensor(lengths), L_max, buf), theirs.float())


# ---------------------------------------------------------------- dynamic sampling (pure)
def _scored(group_rewards: list[list[float]], tag: str, prompt_width: int, logprobs: bool = True) -> ScoredRollout:
    """A draw whose group i has rewards ``group_rewards[i]``; completion strings name draw, group and row."""
    N, G = len(group_rewards), len(group_rewards[0])
    B = N * G
    T = 2 + prompt_width % 2  # widths differ between draws: concatenation must re-pad
    ro = Rollout(
        prompt_ids=torch.full((B, prompt_width), 7), prompt_mask=torch.ones(B, prompt_width, dtype=torch.long),
        completion_ids=torch.full((B, T), 5), completion_mask=torch.ones(B, T, dtype=torch.long),
        group_ids=torch.arange(N).repeat_interleave(G), prompts=[f"{tag}p{i // G}" for i in range(B)],
        completions=[f"{tag}g{i // G}r{i % G}" for i in range(B)], truncated=torch.zeros(B, dtype=torch.bool),
        logprobs=-torch.rand(B, T) if logprobs else None)
    rewards = torch.tensor([r for g in group_rewards for r in g])
    return ScoredRollout(examples=[f"{tag}e{i}" for i in range(N)], rollout=ro, rewards=rewards,
                         per_fn={"fn": rewards * 2}, correct=(rewards > 0.5).float())


def test_informative_groups():
    values = torch.tensor([1.0, 1.0, 0.0, 1.0, 0.0, 0.0])
    assert informative_groups(values, 2).tolist() == [False, True, False]


def test_dynamic_sampling_keeps_only_informative_groups_in_draw_order_and_counts_draws():
    draws = [
        _scored([[0, 0], [1, 0], [1, 1]], "a", 3),  # one informative group (g1)
        _scored([[0, 0], [0, 0], [0, 0]], "b", 4),  # none
        _scored([[2, 1], [0, 0], [0, 3]], "c", 2),  # two: g0 and g2, g2 is surplus when 2 are wanted
    ]
    calls = []

    def draw(k):
        calls.append(k)
        return draws[k]

    for i, d in enumerate(draws):
        d.reward_errors = float(i + 1)
    batch, stats = dynamic_sample(draw, 2, 2, max_draws=5, pad_token_id=0)
    assert calls == [0, 1, 2]
    assert batch.reward_errors == 1 + 2 + 3  # skipped reward calls of every draw, the dropped one's too
    assert stats == {"rollout/draws": 3.0, "rollout/groups_kept": 2.0, "rollout/groups_dropped": 6.0,
                     "rollout/groups_surplus": 1.0, "rollout/zero_var_frac": 6 / 9}
    assert batch.rollout.completions == ["ag1r0", "ag1r1", "cg0r0", "cg0r1"]
    assert batch.examples == ["ae1", "ce0"]
    assert batch.rewards.tolist() == [1.0, 0.0, 2.0, 1.0]
    assert batch.per_fn["fn"].tolist() == [2.0, 0.0, 4.0, 2.0]
    assert batch.rollout.group_ids.tolist() == [0, 0, 1, 1]
    assert not informative_groups(batch.rewards, 2).logical_not().any()
    # rows keep their tokens: prompts left-padded (with mask 0), completions right-padded (log-prob 0)
    assert batch.rollout.prompt_ids.shape[1] == 3 and batch.rollout.completion_ids.shape[1] == 3
    assert batch.rollout.prompt_mask.sum(-1).tolist() == [3, 3, 2, 2]
    assert batch.rollout.completion_mask.sum(-1).tolist() == [3, 3, 2, 2]
    torch.testing.assert_close(batch.rollout.logprobs[2:, :2], draws[2].rollout.logprobs[:2])
    assert batch.rollout.logprobs[2:, 2].abs().sum() == 0


def test_dynamic_sampling_on_accuracy_and_its_draw_cap():
    draws = [_scored([[0.2, 0.3], [0.9, 0.1]], "a", 2), _scored([[0.9, 0.8], [0.6, 0.0]], "b", 2)]
    # rewards vary in every group, accuracies (reward > 0.5) only in a's g1 and b's g1
    batch, stats = dynamic_sample(lambda k: draws[k], 2, 2, metric="accuracy")
    assert batch.rollout.completions == ["ag1r0", "ag1r1", "bg1r0", "bg1r1"]
    assert stats["rollout/draws"] == 2.0 and stats["rollout/groups_dropped"] == 2.0
    flat = _scored([[1, 1], [0, 0]], "z", 2)
    calls = []
    with pytest.raises(RunError, match=r"`rollout.dynamic_sampling_max_draws` = 3"):
        dynamic_sample(lambda k: calls.append(k) or flat, 1, 2, max_draws=3)
    assert calls == [0, 1, 2]  # verl: max_num_gen_batches draws, then the error
    # 0 = no limit: the tenth draw finally brings an informative group
    good = _scored([[1, 0], [0, 0]], "g", 2)
    batch, stats = dynamic_sample(lambda k: good if k == 9 else flat, 1, 2, max_draws=0)
    assert stats["rollout/draws"] == 10.0 and batch.examples == ["ge0"]


def test_concat_rollouts_without_logprobs_in_one_part_drops_them():
    a, b = _scored([[0, 1]], "a", 2).rollout, _scored([[0, 1]], "b", 3, logprobs=False).rollout
    both = concat_rollouts([a, b], pad_token_id=0)
    assert both.logprobs is None and both.group_ids.tolist() == [0, 0, 1, 1]
    assert both.input_ids.shape == (4, 3 + 3)


# ---------------------------------------------------------------- dynamic sampling in the trainer
def _odd_answers_only(prompts, completions, answer, **kwargs):
    """A reward with all-equal groups: 0 for every completion of a prompt whose answer is even, and a
    completion-dependent value otherwise."""
    return [0.0 if int(a) % 2 == 0 else float(sum(map(ord, c)) % 7) for c, a in zip(completions, answer)]


def test_trainer_dynamic_sampling_trains_on_informative_groups_only(tmp_path, monkeypatch):
    monkeypatch.setitem(REWARDS, "odd_answers_only", _odd_answers_only)
    rewards = {"functions": ["odd_answers_only"], "weights": [1.0]}
    plain = make_trainer(tmp_path / "plain", rewards=rewards, loop={"steps": 3}).train().history
    assert max(row["adv/zero_var_frac"] for row in plain) > 0  # without it, some groups carry no signal

    trainer = make_trainer(tmp_path / "ds", rewards=rewards, loop={"steps": 3},
                           rollout={"dynamic_sampling": True, "dynamic_sampling_max_draws": 20})
    rows = trainer.train().history
    P = trainer.cfg.loop.prompts_per_step
    for row in rows:
        assert row["adv/zero_var_frac"] == 0.0 and row["rollout/groups_kept"] == P
        assert row["rollout/groups_dropped"] > 0 or row["rollout/draws"] == 1
        assert row["rollout/groups_kept"] + row["rollout/groups_dropped"] + row["rollout/groups_surplus"] == \
            row["rollout/draws"] * P
        assert math.isfinite(row["loss/total"]) and row["optim/grad_norm"] > 0
    assert sum(row["rollout/draws"] for row in rows) > len(rows)  # it had to draw again at least once
    # every draw took prompts_per_step prompts from the data order
    assert trainer.prompts.epoch * len(trainer.train_examples) + trainer.prompts.pos == \
        sum(row["rollout/draws"] for row in rows) * P


def test_trainer_dynamic_sampling_stops_at_the_cap(tmp_path):
    trainer = make_trainer(tmp_path / "flat", rewards={"functions": ["exact_match"], "weights": [0.0]},
                           rollout={"dynamic_sampling": True, "dynamic_sampling_max_draws": 3})
    with pytest.raises(RunError, match="dynamic_sampling_max_draws"):
        trainer.train()
    assert trainer.prompts.pos == 3 * trainer.cfg.loop.prompts_per_step


# ---------------------------------------------------------------- truncated completions
def test_mask_truncated_zeroes_rows():
    mask = torch.ones(3, 4, dtype=torch.bool)
    mask[1, 2:] = False
    out, frac = mask_truncated(mask, torch.tensor([False, True, True]))
    assert out.sum(-1).tolist() == [4, 0, 0] and frac.item() == pytest.approx(2 / 3)


def test_masked_rows_contribute_nothing_to_a_token_mean_loss():
    g = torch.Generator().manual_seed(0)
    B, T = 5, 6
    logp = (-torch.rand(B, T, generator=g)).requires_grad_()
    old = logp.detach() + 0.1 * torch.randn(B, T, generator=g)
    adv = torch.randn(B, generator=g)
    mask = torch.ones(B, T, dtype=torch.bool)
    truncated = torch.tensor([False, True, False, True, False])
    masked, _ = mask_truncated(mask, truncated)
    obj = Objective.preset("dapo")
    loss, _ = obj(logp, old, adv, masked)
    loss.backward()
    assert logp.grad[truncated].abs().sum() == 0  # no gradient through truncated completions
    keep = ~truncated
    alone, _ = obj(logp.detach()[keep], old[keep], adv[keep], mask[keep])
    torch.testing.assert_close(loss.detach(), alone)  # the same loss as without those rows at all


def test_trainer_masks_truncated_completions(tmp_path):
    T = 2
    trainer = make_trainer(tmp_path / "mask", rollout={"max_new_tokens": T},
                           objective={"mask_truncated_completions": True})
    rows = trainer.train().history
    B = trainer.cfg.seqs_per_step
    for row in rows:
        assert row["completion/truncated_masked_frac"] == pytest.approx(row["completion/truncated_frac"])
        # a truncated completion has exactly T tokens; the loss sees only the others'
        untruncated_tokens = row["completion/length_mean"] * B - row["completion/truncated_frac"] * B * T
        if row["completion/truncated_frac"] == 1.0:  # nothing left to train on: no optimizer step at all
            assert "loss/total" not in row and "tokens/valid" not in row
        else:
            assert row["tokens/valid"] == pytest.approx(untruncated_tokens)
    assert any(0 < row["completion/truncated_frac"] < 1 for row in rows)
    plain = make_trainer(tmp_path / "plain", rollout={"max_new_tokens": T}).train().history
    assert plain[0]["tokens/valid"] == pytest.approx(plain[0]["completion/length_mean"] * B)


# ---------------------------------------------------------------- config
@pytest.mark.parametrize("sections, field", [
    ({"rewards": {"overlong_buffer_len": 4}}, "rewards.overlong_buffer_len"),
    ({"objective": {"mask_truncated_completions": True}, "rollout": {"ignore_eos": True}},
     "objective.mask_truncated_completions"),
    ({"objective": {"overrides": {"correction": "tis"}}, "rlvcr": {"enabled": True}}, "objective.overrides"),
    ({"rollout": {"dynamic_sampling_metric": "variance"}}, "rollout.dynamic_sampling_metric"),
    ({"rollout": {"dynamic_sampling_max_draws": -1}}, "rollout.dynamic_sampling_max_draws"),
])
def test_bad_dapo_settings_name_the_field(tmp_path, sections, field):
    from trainer_helpers import small_config

    from lmpo.trainer.config import validate_config

    base = {"rollout": {"max_new_tokens": 3}, **sections}
    with pytest.raises(ConfigError, match=field.replace(".", r"\.")):
        validate_config(small_config(tmp_path, **base))


def test_dapo_full_recipe_trains_two_steps(tmp_path):
    # without the recipe's warm-up (seconds here) the policy is never right, so no group's accuracy varies: the
    # test keeps groups whose reward (exact match + overlong penalty) varies instead
    cfg = load_config(ROOT / "configs" / "dapo_full.yaml", overrides={
        "loop": {"steps": 2}, "sft": {"steps": 0}, "rollout": {"dynamic_sampling_metric": "reward"},
        "task": {"eval_examples": 8}, "eval": {"at_start": False}, "checkpoint": {"at_end": False},
        "logging": {"run_dir": str(tmp_path / "run"), "progress_bar": False, "tensorboard": False, "plots": False}})
    assert cfg.objective.preset == "dapo" and cfg.rollout.dynamic_sampling
    assert cfg.rewards.overlong_buffer_len > 0 and cfg.objective.mask_truncated_completions
    from lmpo.trainer import Trainer

    result = Trainer(cfg, log=lambda msg: None).train()
    assert result.steps_done == 2
    for row in result.history:
        assert math.isfinite(row["loss/total"]) and row["rollout/draws"] >= 1
        assert row["reward/overlong/mean"] <= 0 and "completion/truncated_masked_frac" in row




def test_dapo_run_resumes_bit_for_bit(tmp_path, monkeypatch):
    """Dynamic sampling consumes a varying number of prompts per step; the data position in the checkpoint keeps a
    resumed run on the uninterrupted one's draws."""
    monkeypatch.setitem(REWARDS, "odd_answers_only", _odd_answers_only)
    sections = {"rewards": {"functions": ["odd_answers_only"], "weights": [1.0], "overlong_buffer_len": 1},
                "rollout": {"dynamic_sampling": True, "dynamic_sampling_max_draws": 20},
                "objective": {"preset": "dapo", "mask_truncated_completions": True,
                              "overrides": {"correction": "tis"}}}
    full = make_trainer(tmp_path / "full", loop={"steps": 4}, **sections)
    full_rows = full.train().history
    part = make_trainer(tmp_path / "part", loop={"steps": 2}, checkpoint={"at_end": True}, **sections)
    part.train()
    resumed = make_trainer(tmp_path / "part", seed=7, loop={"steps": 4}, checkpoint={"at_end": True}, **sections)
    resumed_rows = resumed.train(resume="auto").history
    for (k, v), w in zip(full.model.state_dict().items(), resumed.model.state_dict().values()):
        assert torch.equal(v, w), k
    timing = ("time/", "perf/")
    assert [{k: v for k, v in r.items() if not k.startswith(timing)} for r in full_rows[2:]] == \
        [{k: v for k, v in r.items() if not k.startswith(timing)} for r in resumed_rows]
    assert sum(r["rollout/draws"] for r in full_rows) > 4
