"""The trainer's KL in the reward (adaptive β, checkpointed) and TR-DPO reference sync, on the tiny model.

- a run with ``objective.kl_in_reward`` and the adaptive controller logs ``kl/coef`` moving as the controller
  says, and a killed-and-resumed run restores β and ends equal to the uninterrupted one;
- ``sync_reference`` equals TRL's own ``SyncRefModelCallback._sync_target_model`` (to the bit) and a hand mix;
- with ``objective.ref_sync_steps`` the reference after the run is the hand-computed chain of mixes of the
  policy after each due optimizer step, and it is saved in checkpoints and restored on resume;
- the default run computes nothing extra (no reference model, no KL metrics).
"""

from __future__ import annotations

import copy

import pytest
import torch
from trainer_helpers import make_trainer, small_config, small_model
from trl.trainer.callbacks import SyncRefModelCallback

from lmpo.checkpoints import list_checkpoints, load_state
from lmpo.config import ConfigError
from lmpo.errors import InputError
from lmpo.objectives.kl_reward import AdaptiveKLController
from lmpo.trainer.run.metrics import METRIC_DOCS, read_jsonl
from lmpo.trainer.step import update
from lmpo.trainer.step.ref_sync import check_sync_compatible, sync_reference

KL_ON = {"kl_in_reward": True, "kl_reward_estimator": "k3", "kl_reward_coef": 0.05, "kl_ctrl_type": "adaptive",
         "kl_ctrl_target": 1e-4, "kl_ctrl_horizon": 24}


def _weights(model):
    return {k: v.detach().clone() for k, v in model.state_dict().items()}


def _train_rows(run_dir):
    return [r for r in read_jsonl(run_dir / "metrics.jsonl") if r["kind"] == "train"]


def _crash_at(step_to_crash):
    import lmpo.trainer.run.loop as loop_mod

    real_step = loop_mod.Trainer.rl_step

    def crashing(self, step):
        if step == step_to_crash:
            raise KeyboardInterrupt(f"simulated kill during step {step}")
        return real_step(self, step)

    return loop_mod, real_step, crashing


def _killed_then_resumed(run_dir, objective, steps=3, crash=3):
    sections = dict(loop={"steps": steps}, checkpoint={"every_steps": 1, "keep_last": 0}, objective=objective)
    part = make_trainer(run_dir, **sections)
    loop_mod, real_step, crashing = _crash_at(crash)
    loop_mod.Trainer.rl_step = crashing
    try:
        with pytest.raises(KeyboardInterrupt):
            part.train()
    finally:
        loop_mod.Trainer.rl_step = real_step
    resumed = make_trainer(run_dir, seed=123, **sections)  # different init: everything comes from the checkpoint
    resumed.train(resume="auto")
    return part, resumed


def test_kl_in_reward_adaptive_beta_moves_and_resume_restores_it(tmp_path):
    full = make_trainer(tmp_path / "full", loop={"steps": 3}, checkpoint={"every_steps": 1, "keep_last": 0},
                        objective=KL_ON)
    full.train()
    assert full.ref_model is not None  # built for the KL in the reward although the objective has kl_coef = 0
    rows = _train_rows(tmp_path / "full")
    coefs = [r["kl/coef"] for r in rows]
    # the controller's own rule replayed on the logged KL values: β_{s+1} = β_s·(1 + clip(KL/target − 1)·B/horizon)
    replay = AdaptiveKLController(0.05, 1e-4, 24)
    want = []
    for r in rows:
        want.append(replay.value)
        replay.update(r["kl/reward_kl"], 12)  # B = 3 prompts × 4 completions
    assert coefs == pytest.approx(want, rel=1e-6)
    assert coefs[0] == 0.05 and coefs[1] != coefs[0] and coefs[2] != coefs[1]
    assert full.kl_ctrl.value == pytest.approx(replay.value, rel=1e-6)
    assert rows[0]["kl/reward_kl"] == pytest.approx(0.0, abs=1e-6)  # step 1: policy = reference
    assert rows[1]["kl/reward_kl"] > 0
    assert rows[0]["kl/reward_penalty"] == 0.0 and rows[1]["kl/reward_penalty"] > 0  # k3 ≥ 0, β > 0
    assert {"kl/coef", "kl/reward_kl", "kl/reward_penalty"} <= set(METRIC_DOCS)

    # the checkpoint's state.json carries β (plain JSON through lmpo.checkpoints, no pickle)
    last = list_checkpoints(tmp_path / "full")[-1]
    assert load_state(last, "state")["kl_controller"] == full.kl_ctrl.state_dict()

    part, resumed = _killed_then_resumed(tmp_path / "part", KL_ON)
    assert [p.name for p in list_checkpoints(tmp_path / "part")][:2] == ["step_00000001", "step_00000002"]
    assert resumed.kl_ctrl.state_dict() == full.kl_ctrl.state_dict()
    w_full, w_res = _weights(full.model), _weights(resumed.model)
    for k in w_full:
        torch.testing.assert_close(w_res[k], w_full[k], rtol=0, atol=0, msg=f"weight {k} differs after resume")
    assert [r["kl/coef"] for r in _train_rows(tmp_path / "part")] == coefs


def test_kl_in_reward_changes_the_advantages_not_the_reward_metrics(tmp_path):
    plain = make_trainer(tmp_path / "plain", loop={"steps": 1})
    plain.train()
    shaped = make_trainer(tmp_path / "shaped", loop={"steps": 1}, objective={"kl_in_reward": True, "kl_reward_coef": 1.0})
    shaped.train()
    a, b = _train_rows(tmp_path / "plain")[0], _train_rows(tmp_path / "shaped")[0]
    assert a["reward/mean"] == b["reward/mean"]  # the reward metrics stay the task's
    # at step 1 policy = reference: k1 is 0 token by token, so the advantages and the update are the same
    assert b["kl/reward_penalty"] == 0.0 and a["adv/abs_mean"] == b["adv/abs_mean"]
    assert "kl/coef" not in a and plain.ref_model is None and plain.kl_ctrl is None
    assert "kl_controller" not in plain.state_dict(1)  # default checkpoints hold what they always did


def test_sync_reference_equals_trl_sync_target_model_and_hand_mix():
    policy, _ = small_model(seed=1)
    ref, _ = small_model(seed=2)
    theirs = copy.deepcopy(ref)
    before = {k: v.clone() for k, v in ref.named_parameters()}
    sync_reference(ref, policy, 0.6)
    SyncRefModelCallback._sync_target_model(policy, theirs, 0.6)
    pol = dict(policy.named_parameters())
    for (name, p), (_, q) in zip(ref.named_parameters(), theirs.named_parameters(), strict=True):
        assert torch.equal(p, q), name  # the same operations: the same bits
        torch.testing.assert_close(p, 0.6 * pol[name] + 0.4 * before[name], rtol=1e-6, atol=1e-7)
    sync_reference(ref, policy, 1.0)  # α = 1: a copy
    for name, p in ref.named_parameters():
        assert torch.equal(p, pol[name])
    with pytest.raises(ValueError, match="alpha"):
        sync_reference(ref, policy, 1.5)
    other = torch.nn.Linear(2, 2)
    with pytest.raises(InputError, match="ref_sync_steps"):
        check_sync_compatible(other, policy)


def test_ref_sync_mixes_every_n_optimizer_steps_and_resumes_equal(tmp_path, monkeypatch):
    """ref_sync_steps=2 with 2 minibatches per RL step: the reference mixes after optimizer steps 2, 4, 6
    (one per RL step), each time with the policy just after that optimizer step."""
    objective = {"overrides": {"kl_coef": 0.05}, "ref_sync_steps": 2, "ref_sync_alpha": 0.5}
    loop = {"steps": 3, "minibatches_per_step": 2}
    trainer = make_trainer(tmp_path / "full", loop=loop, objective=objective)
    initial = _weights(trainer.model)
    snapshots = []

    def record(ref, policy, alpha):  # the update stage calls it after each due optimizer step
        sync_reference(ref, policy, alpha)
        snapshots.append({k: v.detach().clone() for k, v in policy.named_parameters()})

    with monkeypatch.context() as patched:
        patched.setattr(update, "sync_reference", record)
        trainer.train()
    assert len(snapshots) == 3
    want = {k: initial[k].clone() for k, _ in trainer.model.named_parameters()}
    for snap in snapshots:  # the hand chain: ref ← ½·π + ½·ref after each due step
        want = {k: v.mul(0.5).add(snap[k], alpha=0.5) for k, v in want.items()}
    for name, p in trainer.ref_model.named_parameters():
        assert torch.equal(p, want[name]), name
        assert not torch.equal(p, initial[name])

    # checkpointed and restored: a killed-and-resumed run ends with the same reference and policy
    sections = dict(loop=loop, checkpoint={"every_steps": 1, "keep_last": 0}, objective=objective)
    full = make_trainer(tmp_path / "full2", **sections)
    full.train()
    for name, p in full.ref_model.named_parameters():
        assert torch.equal(p, want[name]), name  # the recording hook did not change the run
    part = make_trainer(tmp_path / "part", **sections)
    loop_mod, real_step, crashing = _crash_at(3)
    loop_mod.Trainer.rl_step = crashing
    try:
        with pytest.raises(KeyboardInterrupt):
            part.train()
    finally:
        loop_mod.Trainer.rl_step = real_step
    resumed = make_trainer(tmp_path / "part", seed=123, **sections)
    resumed.train(resume="auto")
    for name, p in resumed.ref_model.named_parameters():
        assert torch.equal(p, dict(full.ref_model.named_parameters())[name]), name
    for k, v in _weights(full.model).items():
        assert torch.equal(_weights(resumed.model)[k], v), k


@pytest.mark.parametrize("objective,match", [
    ({"kl_ctrl_type": "adaptive"}, "objective.kl_ctrl_type"),
    ({"kl_reward_coef": 0.1}, "objective.kl_reward_coef"),
    ({"kl_in_reward": True, "kl_ctrl_type": "adaptive", "kl_ctrl_target": 0.0}, "objective.kl_ctrl_target"),
    ({"kl_in_reward": True, "kl_ctrl_type": "adaptive", "kl_ctrl_horizon": 0}, "objective.kl_ctrl_horizon"),
    ({"kl_in_reward": True, "kl_ctrl_type": "adaptive", "kl_reward_coef": 0.0}, "objective.kl_reward_coef"),
    ({"ref_sync_steps": 4}, "objective.ref_sync_steps"),
    ({"ref_sync_alpha": 1.5}, "objective.ref_sync_alpha"),
    ({"kl_in_reward": True, "kl_reward_estimator": "kl"}, "objective.kl_reward_estimator"),
])
def test_bad_kl_settings_name_the_field(tmp_path, objective, match):
    from lmpo.trainer.config import validate_config

    with pytest.raises(ConfigError, match=match):
        validate_config(small_config(tmp_path, objective=objective))


def test_ref_sync_with_lora_and_kl_in_reward_with_rlvcr_are_refused(tmp_path):
    from lmpo.trainer.config import validate_config

    cfg = small_config(tmp_path, objective={"kl_in_reward": True, "ref_sync_steps": 2},
                       model={"lora": {"enabled": True}})
    with pytest.raises(ConfigError, match="model.lora.enabled"):
        validate_config(cfg)
    cfg = small_config(tmp_path, objective={"kl_in_reward": True}, rlvcr={"enabled": True})
    with pytest.raises(ConfigError, match="rlvcr.enabled"):
        validate_config(cfg)


def test_estimator_choices_are_the_kl_registry():
    from dataclasses import fields

    from lmpo.objectives.parts.kl import KL_ESTIMATORS
    from lmpo.trainer.config import ObjectiveConfig

    field = next(f for f in fields(ObjectiveConfig) if f.name == "kl_reward_estimator")
    assert tuple(field.metadata["choices"]) == tuple(KL_ESTIMATORS)
