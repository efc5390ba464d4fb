"""End-to-end behaviour of the training loop on a very small model: presets, resume, NaN handling."""

from __future__ import annotations

import math

import pytest
import torch
from trainer_helpers import make_trainer, set_loss_hook, small_model, train_killed_in_step

from lmpo.generation import RolloutBatch
from lmpo.trainer import NonFiniteError
from lmpo.trainer.run import build
from lmpo.trainer.run.metrics import read_jsonl
from lmpo.trainer.run.state import latest_checkpoint, list_checkpoints, load_checkpoint
from lmpo.trainer.step import stages

# per-step numbers that depend on wall time are excluded from exact comparisons
_TIMING = ("time/", "perf/")


def _weights(model) -> dict[str, torch.Tensor]:
    return {k: v.detach().clone() for k, v in model.state_dict().items()}


def _deterministic(rows):
    return [{k: v for k, v in r.items() if not k.startswith(_TIMING)} for r in rows]


@pytest.mark.parametrize("preset, extra", [
    ("grpo", {}),
    ("dapo", {}),
    ("gspo", {}),
    ("ema", {}),
    ("grad_adaptive", {}),
    ("grad_adaptive", {"objective": {"overrides": {"grad_norm_mode": "exact"}}}),
    ("grad_adaptive", {"objective": {"overrides": {"grad_norm_mode": "logits"}}}),
    ("clip_cov", {}),
    ("adaptive_entropy", {}),
    ("grpo", {"objective": {"overrides": {"kl_coef": 0.1}},
              "loop": {"epochs_per_step": 2, "minibatches_per_step": 2}}),
])
def test_short_run_changes_weights_and_logs_finite_metrics(tmp_path, preset, extra):
    trainer = make_trainer(tmp_path / preset, preset, **extra)
    before = _weights(trainer.model)
    result = trainer.train()
    after = _weights(trainer.model)
    changed = sum(not torch.equal(before[k], after[k]) for k in before)
    assert changed > 0, f"{preset}: no parameter changed"
    assert result.steps_done == 2 and len(result.history) == 2
    for row in result.history:
        for key in ("reward/mean", "loss/total", "optim/grad_norm", "optim/lr", "adv/zero_var_frac",
                    "completion/length_mean", "time/generate_s", "time/train_s"):
            assert key in row, f"{preset}: missing {key}"
            assert math.isfinite(row[key]), f"{preset}: {key}={row[key]}"
        assert row["optim/grad_norm"] > 0
    if preset == "adaptive_entropy":
        assert "entropy/coef" in result.history[-1] and "entropy/mean" in result.history[-1]
    if extra.get("loop"):
        # 2 epochs x 2 minibatches = 4 optimizer steps per RL step, and the policy moved off the behaviour one
        assert trainer.schedule.step_index == 4 * 2
        assert "kl/ref" in result.history[-1] or any(k.startswith("kl/") for k in result.history[-1])
    rows = read_jsonl(tmp_path / preset / "metrics.jsonl")
    assert [r["step"] for r in rows if r["kind"] == "train"] == [1, 2]
    assert (tmp_path / preset / "config.yaml").exists()


def test_resume_equals_uninterrupted_run(tmp_path):
    sections = {"loop": {"steps": 4}, "checkpoint": {"every_steps": 2, "keep_last": 0},
                "objective": {"overrides": {}}, "eval": {"every_steps": 2}}
    full = make_trainer(tmp_path / "full", "adaptive_entropy", **sections)
    full.train()
    w_full = _weights(full.model)

    # the same run "killed" after step 2: stop early, then resume in a fresh process-like Trainer
    part = make_trainer(tmp_path / "part", "adaptive_entropy", loop={"steps": 4},
                        checkpoint={"every_steps": 2, "keep_last": 0}, eval={"every_steps": 2})
    train_killed_in_step(part, 3)
    assert [p.name for p in list_checkpoints(tmp_path / "part")] == ["step_00000002"]

    resumed = make_trainer(tmp_path / "part", "adaptive_entropy", seed=123,  # different init: weights come from the checkpoint
                           loop={"steps": 4}, checkpoint={"every_steps": 2, "keep_last": 0}, eval={"every_steps": 2})
    resumed.train(resume="auto")
    w_res = _weights(resumed.model)
    for k in w_full:
        torch.testing.assert_close(w_res[k], w_full[k], rtol=0, atol=0, msg=f"weight {k} differs after resume")
    assert resumed.controller.state_dict() == full.controller.state_dict()
    assert _deterministic(read_jsonl(tmp_path / "part" / "metrics.jsonl")) == \
        _deterministic(read_jsonl(tmp_path / "full" / "metrics.jsonl"))


def test_nan_loss_is_skipped_and_counted(tmp_path):
    trainer = make_trainer(tmp_path / "nan", loop={"steps": 3})
    set_loss_hook(trainer, lambda step, loss: loss * float("nan") if step == 2 else loss)
    w0 = _weights(trainer.model)
    result = trainer.train()
    assert result.nonfinite_skipped == 1
    assert [r["optim/nonfinite_skipped"] for r in result.history] == [0.0, 1.0, 1.0]
    assert math.isnan(result.history[1]["optim/grad_norm"])  # no optimizer step at step 2
    assert trainer.schedule.step_index == 2  # steps 1 and 3 stepped the optimizer
    w = _weights(trainer.model)
    assert all(torch.isfinite(v).all() for v in w.values())
    assert any(not torch.equal(w0[k], w[k]) for k in w0)


def test_nan_in_a_row_stops_with_clear_message_and_keeps_checkpoints(tmp_path):
    trainer = make_trainer(tmp_path / "stop", loop={"steps": 8, "max_nonfinite_steps": 3},
                           checkpoint={"every_steps": 1, "keep_last": 0})
    set_loss_hook(trainer, lambda step, loss: loss * float("nan") if step >= 3 else loss)
    with pytest.raises(NonFiniteError, match=r"3 consecutive .*max_nonfinite_steps=3.*stopping at RL step 5"):
        trainer.train()
    ckpts = list_checkpoints(tmp_path / "stop")
    assert [p.name for p in ckpts] == ["step_00000001", "step_00000002", "step_00000003", "step_00000004"]
    model, _ = small_model(seed=5)
    state = load_checkpoint(latest_checkpoint(tmp_path / "stop"), model)
    assert state["nonfinite"]["in_row"] == 2 and state["step"] == 4
    assert all(torch.isfinite(v).all() for v in model.state_dict().values())


def test_zero_variance_filter_reports_statistic(tmp_path):
    trainer = make_trainer(tmp_path / "zv", objective={"filter_zero_variance": True}, loop={"steps": 1})
    result = trainer.train()
    row = result.history[0]
    # kept sequences are exactly the groups with reward variance: kept = 1 - zero_var_frac (equal group sizes)
    assert row["adv/kept_frac"] == pytest.approx(1.0 - row["adv/zero_var_frac"])


def test_lora_trains_only_the_adapters(tmp_path):
    trainer = make_trainer(tmp_path / "lora", model={"lora": {"enabled": True, "r": 4, "alpha": 8,
                                                              "target_modules": ["q_proj", "v_proj"]}},
                           checkpoint={"at_end": True})
    before = _weights(trainer.model)
    trainer.train()
    after = _weights(trainer.model)
    changed = {k for k in before if not torch.equal(before[k], after[k])}
    assert changed and all("lora_" in k for k in changed), sorted(changed)[:5]
    assert latest_checkpoint(tmp_path / "lora").name == "step_00000002"


def test_shared_prompt_prefix_gives_the_plain_forward_logprobs_and_gradients(tmp_path):
    from lmpo.generation import HFRollout

    trainer = make_trainer(tmp_path / "share", rollout={"completions_per_prompt": 3, "max_new_tokens": 4})
    model, tok = trainer.model, trainer.tokenizer
    ro = HFRollout(model, tok, max_new_tokens=4).generate(["7+8=", "12+3=", "1+1="], 3, seed=0)  # ragged prompts
    batch = RolloutBatch.from_rollout(ro)
    rows = torch.arange(9)
    T = ro.completion_ids.shape[1]
    mask = ro.completion_mask.bool()

    def logp_and_grads(share: bool):
        object.__setattr__(trainer.cfg.loop, "share_prompt_prefix", share)
        model.zero_grad()
        logp = stages.logprobs(model, batch, rows, settings=build.logprob_settings(trainer.cfg), with_grad=True).logp
        (logp * mask).sum().backward()
        return logp.detach(), {n: p.grad.clone() for n, p in model.named_parameters()}

    calls = []
    handle = model.register_forward_pre_hook(lambda mod, args, kw: calls.append(kw["input_ids"].shape),
                                             with_kwargs=True)
    shared, g_shared = logp_and_grads(True)
    assert calls == [torch.Size([3, ro.prompt_ids.shape[1]]), torch.Size([9, T - 1])]  # 3 prompts once, then 9 completions
    plain, g_plain = logp_and_grads(False)
    handle.remove()
    torch.testing.assert_close(shared[mask], plain[mask], rtol=1e-5, atol=1e-5)
    for n in g_plain:
        torch.testing.assert_close(g_shared[n], g_plain[n], rtol=1e-4, atol=1e-6, msg=n)


def _grpo_loss_and_grads(trainer, batch, adv):
    """The on-policy GRPO loss of ``batch`` through the trainer's own forward, and every parameter's gradient."""
    model = trainer.model
    model.train()
    model.zero_grad()
    fwd = stages.logprobs(trainer.policy(), batch, settings=trainer.logprob_settings, with_grad=True)
    loss, _ = trainer.objective(fwd.logp, fwd.logp.detach(), adv, batch.loss_mask)
    # the GRPO loss at ratio 1 does not depend on the log-prob values; this term makes the check see them
    loss = loss - 0.1 * (fwd.logp * batch.loss_mask).sum() / batch.loss_mask.sum()
    loss.backward()
    return fwd.logp.detach(), loss.detach(), torch.cat([p.grad.flatten() for p in model.parameters()])


@pytest.mark.parametrize("option", ["gradient_checkpointing", "autocast", "compile"])
def test_gradient_checkpointing_bf16_autocast_and_compile_match_the_plain_path(tmp_path, option, monkeypatch):
    from lmpo.generation import HFRollout

    if option == "compile":
        # lmpo's part is what goes through torch.compile (the training and log-prob forwards and their backward,
        # through Dynamo and AOT autograd): the aot_eager backend runs all of it except Inductor's code generation,
        # which costs ~50 CPU-s cold here (a fresh checkout's cache is always cold). Inductor itself runs in
        # tests/generation/test_hf.py's compiled decode step.
        real = torch.compile
        monkeypatch.setattr(torch, "compile", lambda fn, **kw: real(fn, **{"backend": "aot_eager", **kw}))

    rollout = {"completions_per_prompt": 3, "max_new_tokens": 5}
    plain = make_trainer(tmp_path / "plain", rollout=rollout)
    other = make_trainer(tmp_path / option, rollout=rollout, loop={option: True})
    assert getattr(other.model, "is_gradient_checkpointing", False) == (option == "gradient_checkpointing")
    ro = HFRollout(plain.model, plain.tokenizer, max_new_tokens=5).generate(["7+8=", "12+3=", "1+1="], 3, seed=0)
    batch = RolloutBatch.from_rollout(ro)
    adv = torch.linspace(-1.0, 1.0, 9)
    logp_p, loss_p, grad_p = _grpo_loss_and_grads(plain, batch, adv)
    logp_o, loss_o, grad_o = _grpo_loss_and_grads(other, batch, adv)
    mask = batch.loss_mask
    if option == "compile":  # the same arithmetic in generated kernels: float rounding differs
        assert isinstance(other.policy(), stages.CompiledCalls) and plain.policy() is plain.model
        torch.testing.assert_close(logp_o[mask], logp_p[mask], rtol=1e-5, atol=1e-5)
        torch.testing.assert_close(loss_o, loss_p, rtol=1e-5, atol=1e-6)
        torch.testing.assert_close(grad_o, grad_p, rtol=1e-4, atol=1e-6)
    elif option == "gradient_checkpointing":  # the same arithmetic, recomputed
        torch.testing.assert_close(logp_o[mask], logp_p[mask], rtol=1e-5, atol=1e-5)
        torch.testing.assert_close(loss_o, loss_p, rtol=1e-5, atol=1e-6)
        torch.testing.assert_close(grad_o, grad_p, rtol=1e-4, atol=1e-6)
    else:  # bfloat16 keeps 8 bits of mantissa: relative error ~ 2^-8 per operation
        torch.testing.assert_close(logp_o[mask], logp_p[mask], rtol=2e-2, atol=5e-2)
        torch.testing.assert_close(loss_o, loss_p, rtol=2e-2, atol=1e-2)
        assert float((grad_o - grad_p).norm() / grad_p.norm()) < 5e-2
        assert logp_o.dtype == torch.float32 and all(p.dtype == torch.float32 for p in other.model.parameters())


def test_engine_weights_synced_after_every_step(tmp_path):
    from lmpo.generation import HFRollout

    class Recording(HFRollout):
        synced: list = []

        def sync_weights(self, model):
            self.synced.append((model, sum(float(p.detach().abs().sum()) for p in model.parameters())))
            super().sync_weights(model)

    trainer = make_trainer(tmp_path / "sync")
    trainer.rollout_engine = Recording(trainer.model, trainer.tokenizer, max_new_tokens=3)
    trainer.train()
    assert len(Recording.synced) == 2 and all(m is trainer.model for m, _ in Recording.synced)
    assert Recording.synced[0][1] != Recording.synced[1][1]  # each sync saw the weights of its own step
