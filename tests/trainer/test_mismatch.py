"""The trainer half of rollout corrections: the sampler's log-probs reach the objective, and the sampler/trainer
mismatch is logged (``mismatch/*``, verl's ``compute_offpolicy_metrics``)."""

from __future__ import annotations

import math

import pytest
import torch
from trainer_helpers import make_trainer, small_config, small_model

from lmpo.errors import RunError
from lmpo.generation import HFRollout
from lmpo.trainer import Trainer
from lmpo.trainer.run.metrics import METRIC_DOCS
from lmpo.trainer.step.mismatch import mismatch_metrics

verl_helper = pytest.importorskip("verl.trainer.ppo.rollout_corr_helper")

_VERL_KEYS = ("kl", "k3_kl", "training_ppl", "rollout_ppl", "log_ppl_diff", "log_ppl_abs_diff", "ppl_ratio",
              "chi2_token", "chi2_seq")


def _batch(seed: int, B: int = 6, T: int = 7, scale: float = 0.3):
    g = torch.Generator().manual_seed(seed)
    train = -torch.rand(B, T, generator=g) * 3.0
    rollout = train + scale * torch.randn(B, T, generator=g)
    lengths = torch.randint(1, T + 1, (B,), generator=g)
    mask = (torch.arange(T)[None, :] < lengths[:, None]).float()
    return train, rollout, mask


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_mismatch_metrics_equal_verls_compute_offpolicy_metrics(seed):
    train, rollout, mask = _batch(seed)
    ours = mismatch_metrics(train, rollout, mask)
    theirs = verl_helper.compute_offpolicy_metrics(train, rollout, mask)
    for key in _VERL_KEYS:
        assert ours[f"mismatch/{key}"].item() == pytest.approx(theirs[key], rel=1e-5, abs=1e-6), key
    assert set(ours) <= set(METRIC_DOCS)


def test_mismatch_metrics_by_hand_and_invariant_to_masked_garbage():
    # one sequence, two valid tokens: train log-probs (-1, -2), rollout (-1.5, -2); Δ = (0.5, 0)
    train = torch.tensor([[-1.0, -2.0, 7.0]])
    rollout = torch.tensor([[-1.5, -2.0, -9.0]])  # position 2 is padding: garbage there must change nothing
    mask = torch.tensor([[1.0, 1.0, 0.0]])
    m = {k: v.item() for k, v in mismatch_metrics(train, rollout, mask).items()}
    assert m["mismatch/kl"] == pytest.approx(-0.25)  # mean(rollout - train) = (-0.5 + 0) / 2
    assert m["mismatch/k3_kl"] == pytest.approx((math.exp(0.5) - 0.5 - 1.0) / 2)
    assert m["mismatch/abs_logp_diff_max"] == pytest.approx(0.5)
    assert m["mismatch/abs_logp_diff_mean"] == pytest.approx(0.25)
    assert m["mismatch/training_ppl"] == pytest.approx(math.exp(1.5))
    assert m["mismatch/rollout_ppl"] == pytest.approx(math.exp(1.75))
    assert m["mismatch/log_ppl_diff"] == pytest.approx(-0.25)
    assert m["mismatch/ppl_ratio"] == pytest.approx(math.exp(-0.25))
    assert m["mismatch/chi2_token"] == pytest.approx((math.exp(1.0) + 1.0) / 2 - 1.0)
    assert m["mismatch/chi2_seq"] == pytest.approx(math.exp(1.0) - 1.0)
    same = {k: v.item() for k, v in mismatch_metrics(train, train, mask).items()}  # no mismatch: the zero points
    assert same.pop("mismatch/ppl_ratio") == 1.0
    assert same.pop("mismatch/training_ppl") == same.pop("mismatch/rollout_ppl") == pytest.approx(math.exp(1.5))
    assert all(v == 0.0 for v in same.values()), same
    assert mismatch_metrics(train, rollout, torch.zeros_like(mask)) == {}


def _engine_trainer(tmp_path, name, temperature, **sections):
    """A trainer whose sampler is ``HFRollout`` at ``temperature`` on the training model itself, while the
    trainer's log-probs are taken at ``rollout.temperature`` = 1 of the config."""
    model, tok = small_model(0)
    cfg = small_config(tmp_path / name, "grpo", **sections)
    engine = HFRollout(model, tok, max_new_tokens=cfg.rollout.max_new_tokens, temperature=temperature,
                       record_logprobs=True)
    return Trainer(cfg, model=model, tokenizer=tok, rollout_engine=engine, log=lambda msg: None)


def test_mismatch_is_zero_for_the_plain_sampler_and_clearly_not_for_a_perturbed_one(tmp_path):
    plain = make_trainer(tmp_path / "plain", rollout={"record_logprobs": True}).train().history
    # the perturbed sampler draws and scores at temperature 0.25; the trainer scores the same tokens at 1
    hot = _engine_trainer(tmp_path, "perturbed", 0.25).train().history
    for row in plain:
        assert abs(row["mismatch/kl"]) < 1e-5 and row["mismatch/k3_kl"] < 1e-6
        assert row["mismatch/abs_logp_diff_max"] < 1e-4
        assert row["mismatch/ppl_ratio"] == pytest.approx(1.0, abs=1e-5)
    for row in hot:
        # sharpening raises the sampled tokens' log-probs: rollout > training on average
        assert row["mismatch/kl"] > 0.1 and row["mismatch/k3_kl"] > 0.05
        assert row["mismatch/abs_logp_diff_max"] > 0.5
        assert row["mismatch/ppl_ratio"] > 1.1


def test_recording_rollout_logprobs_changes_no_value(tmp_path):
    base = make_trainer(tmp_path / "base")
    assert base.driver.needs.rollout_logp is False
    rows = base.train().history
    logged = make_trainer(tmp_path / "logged", rollout={"record_logprobs": True})
    logged_rows = logged.train().history
    assert not any(k.startswith("mismatch/") for k in rows[-1])
    assert base.rollout_engine.record_logprobs is False  # nothing extra recorded by default
    for a, b in zip(rows, logged_rows):
        assert {k: v for k, v in a.items() if not k.startswith(("time/", "perf/"))} == \
               {k: v for k, v in b.items() if not k.startswith(("time/", "perf/", "mismatch/"))}
    for (k, v), w in zip(base.model.state_dict().items(), logged.model.state_dict().values()):
        assert torch.equal(v, w), k


@pytest.mark.parametrize("overrides, stat", [
    ({"correction": "tis"}, "rollout/truncated_frac"),
    ({"correction": "mis", "is_level": "sequence", "is_min": 0.5, "is_max": 2.0}, "rollout/masked_frac"),
    ({"rejection": "off_policy_seq"}, "rollout/rejected_frac"),
])
def test_rollout_corrections_train_in_the_trainer(tmp_path, overrides, stat):
    trainer = make_trainer(tmp_path / "run", objective={"preset": "grpo", "overrides": overrides})
    assert trainer.driver.needs.rollout_logp
    result = trainer.train()
    assert trainer.rollout_engine.record_logprobs  # switched on by the objective's need
    assert result.steps_done == 2
    for row in result.history:
        assert math.isfinite(row["loss/total"]) and row["optim/grad_norm"] > 0
        assert stat in row and math.isfinite(row[stat])
        assert "mismatch/kl" in row
        if "correction" in overrides:  # the sampler is the training model: weights 1, nothing truncated
            assert row["rollout/weight_mean"] == pytest.approx(1.0, abs=1e-5)
            assert row[stat] == 0.0


def test_a_correction_reweights_a_perturbed_sampler(tmp_path):
    rows = _engine_trainer(tmp_path, "tis", 0.25, objective={"overrides": {"correction": "tis", "is_max": 2.0}}
                           ).train().history
    for row in rows:
        assert row["rollout/kl_k3"] > 0.05  # the objective's own mismatch estimate sees the perturbation
        assert row["rollout/weight_mean"] < 0.95 and row["rollout/weight_max"] <= 2.0


def test_an_engine_without_logprobs_is_refused_when_a_correction_needs_them(tmp_path):
    model, tok = small_model(0)
    cfg = small_config(tmp_path / "run", "grpo", objective={"overrides": {"correction": "tis"}})
    engine = HFRollout(model, tok, max_new_tokens=3, record_logprobs=False)
    trainer = Trainer(cfg, model=model, tokenizer=tok, rollout_engine=engine, log=lambda msg: None)
    with pytest.raises(RunError, match="needs the sampler's log-probs"):
        trainer.train()
