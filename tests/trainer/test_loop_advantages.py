"""The trainer with each advantage estimator: it computes exactly the inputs the estimator asks for (completion
lengths, per-function rewards, ReMax's greedy baseline), and a step trains on the estimator's advantages."""

from __future__ import annotations

import math

import pytest
import torch
from trainer_helpers import make_trainer

from lmpo.generation import HFRollout
from lmpo.rewards.scorer import reward_arguments


class Spy:
    """Wraps the trainer's estimator and records each call's rewards, group ids, inputs and advantages."""

    def __init__(self, inner):
        self.inner, self.calls = inner, []

    def required_inputs(self):
        return self.inner.required_inputs()

    def __call__(self, rewards, group_ids, **inputs):
        adv, stats = self.inner(rewards, group_ids, **inputs)
        self.calls.append({"rewards": rewards, "group_ids": group_ids, "inputs": inputs, "adv": adv})
        return adv, stats


class RecordingRollout(HFRollout):
    """Records every generate call: (number of prompts, completions per prompt, greedy, the rollout)."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.calls = []

    def generate(self, prompts, completions_per_prompt=1, seed=None, generator=None, greedy=False):
        ro = super().generate(prompts, completions_per_prompt, seed=seed, generator=generator, greedy=greedy)
        self.calls.append((len(prompts), completions_per_prompt, greedy, ro))
        return ro


def _weights(model):
    return {k: v.detach().clone() for k, v in model.state_dict().items()}


def test_remax_trainer_step_uses_the_greedy_completions_reward_as_baseline(tmp_path):
    trainer = make_trainer(tmp_path / "remax", objective={"advantage_estimator": "remax"}, loop={"steps": 1})
    trainer.estimator = spy = Spy(trainer.estimator)
    trainer.rollout_engine = engine = RecordingRollout(trainer.model, trainer.tokenizer, max_new_tokens=3,
                                                       temperature=1.0)
    before = _weights(trainer.model)
    result = trainer.train()
    # one sampled rollout (P = 3 prompts × G = 4), then one greedy completion per prompt; no other generation
    sampled = [c for c in engine.calls if not c[2]]
    greedy = [c for c in engine.calls if c[2]]
    assert [(n, g) for n, g, _, _ in sampled] == [(3, 4)] and [(n, g) for n, g, _, _ in greedy] == [(3, 1)]
    (call,) = spy.calls
    assert set(call["inputs"]) == {"baseline_rewards"}
    # the baseline is the trainer's own scorer on the greedy texts, repeated over each prompt's G completions
    ro, greedy_ro = sampled[0][3], greedy[0][3]
    examples = [e for e in trainer.train_examples if e.prompt in greedy_ro.prompts]
    by_prompt = {e.prompt: e for e in examples}
    prompts, completions, answers, columns = reward_arguments([by_prompt[p] for p in greedy_ro.prompts],
                                                              greedy_ro.completions)
    greedy_rewards, _ = trainer.scorer.score(prompts, completions, answers, **columns)
    expected = greedy_rewards[ro.group_ids]
    torch.testing.assert_close(call["inputs"]["baseline_rewards"], expected)
    torch.testing.assert_close(call["adv"], call["rewards"] - expected)
    assert call["adv"].abs().sum() > 0
    row = result.history[0]
    assert row["adv/baseline_mean"] == pytest.approx(float(greedy_rewards.mean()), abs=1e-6)
    assert math.isfinite(row["loss/total"]) and row["optim/grad_norm"] > 0
    after = _weights(trainer.model)
    assert any(not torch.equal(before[k], after[k]) for k in before)


@pytest.mark.parametrize("name, options, expected_inputs", [
    ("reinforce_plus_plus", {}, {"lengths"}),
    ("reinforce_plus_plus", {"whiten": "sequences"}, set()),
    ("reinforce_plus_plus_baseline", {}, {"lengths"}),
    ("opo", {}, {"lengths"}),
    ("gpg", {"valid": "group_signal"}, set()),
    ("gdpo", {}, {"reward_components", "reward_weights", "lengths"}),
    ("gdpo", {"whiten": "none"}, {"reward_components", "reward_weights"}),
])
def test_trainer_gives_each_estimator_its_inputs_and_trains(tmp_path, name, options, expected_inputs):
    trainer = make_trainer(tmp_path / name, objective={"advantage_estimator": name, "advantage_options": options},
                           loop={"steps": 1})
    trainer.estimator = spy = Spy(trainer.estimator)
    before = _weights(trainer.model)
    result = trainer.train()
    (call,) = spy.calls
    assert set(call["inputs"]) == expected_inputs
    inputs = call["inputs"]
    if "lengths" in inputs:
        assert inputs["lengths"].shape == call["rewards"].shape and (inputs["lengths"] >= 1).all()
    if "reward_components" in inputs:
        # exact_match and length_penalty, weights 1 and 1: the components add up to the total reward
        assert inputs["reward_components"].shape == (call["rewards"].numel(), 2)
        torch.testing.assert_close(inputs["reward_weights"], torch.tensor([1.0, 1.0]))
        torch.testing.assert_close(inputs["reward_components"].sum(1), call["rewards"])
    assert torch.isfinite(call["adv"]).all() and call["adv"].abs().sum() > 0
    assert all(math.isfinite(v) for k, v in result.history[0].items() if k.startswith(("adv/", "loss/")))
    after = _weights(trainer.model)
    assert any(not torch.equal(before[k], after[k]) for k in before)
