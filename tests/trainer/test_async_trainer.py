"""``rollout.async_staleness`` = k >= 1 in the trainer (lmpo.trainer.step.pipeline): step t trains on the rollout the
in-process engine gives with the weights of step t − 1 − k, on the prompts and seed of the synchronous loop; a
Ctrl-C checkpoint resumes to the uninterrupted run bit for bit; the worker is stopped on Ctrl-C and on errors;
the combinations that cannot work are refused naming the field."""

from __future__ import annotations

import functools
import os
import signal

import pytest
import torch
from trainer_helpers import make_trainer, set_loss_hook, small_config, small_model

from lmpo.config import ConfigError
from lmpo.errors import InputError, Interrupted
from lmpo.generation import HFRollout
from lmpo.trainer import Trainer
from lmpo.trainer.config import validate_config
from lmpo.trainer.step.sampling import seed_for

FACTORY = functools.partial(small_model, 0)
STEPS = 4


class Recording(Trainer):
    """Keeps each step's starting weights (W_t−1), examples, rollout and the worker's pid."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.weights, self.draws, self.pids = {}, {}, set()

    def rl_step(self, step):
        self.weights[step - 1] = {k: v.detach().clone() for k, v in self.model.state_dict().items()}
        return super().rl_step(step)

    def sample(self, step):
        got = super().sample(step)
        self.draws[step] = got.scored
        if self.pipeline is not None:
            self.pids.add(self.pipeline.engine.pid)
        return got


def _trainer(run_dir, k, cls=Recording, **sections):
    model, tok = small_model(0)
    rollout = {"async_staleness": k, **sections.pop("rollout", {})}
    cfg = small_config(run_dir, rollout=rollout, **{"loop": {"steps": STEPS}, **sections})
    return cls(cfg, model=model, tokenizer=tok, model_factory=FACTORY if k else None, log=lambda msg: None)


def _gone(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    return False


def _rows(history):
    return [{k: v for k, v in row.items() if not k.startswith(("time/", "perf/"))} for row in history]


def test_step_t_trains_on_the_weights_of_step_t_minus_1_minus_k(tmp_path):
    k = 1
    sync = _trainer(tmp_path / "sync", 0)
    sync.train()
    tr = _trainer(tmp_path / "async", k)
    result = tr.train()
    assert result.steps_done == STEPS and len(tr.pids) == 1
    model, tok = small_model(0)
    engine = HFRollout(model, tok, max_new_tokens=3, temperature=1.0, record_logprobs=True)
    for step in range(1, STEPS + 1):
        # the prompts of the synchronous loop, in step order although drawn k steps early
        assert [e.prompt for e in tr.draws[step].examples] == [e.prompt for e in sync.draws[step].examples]
        model.load_state_dict(tr.weights[max(0, step - 1 - k)])
        expected = engine.generate([e.prompt for e in tr.draws[step].examples], 4, seed=seed_for(0, step, 1))
        got = tr.draws[step].rollout
        for name in ("completion_ids", "completion_mask", "logprobs"):
            assert torch.equal(getattr(got, name), getattr(expected, name)), (step, name)
    # the sampler/trainer mismatch is logged: rounding only at step 1 (both on W_0), staleness after it
    assert result.history[0]["mismatch/abs_logp_diff_max"] < 1e-4
    assert all(row["mismatch/abs_logp_diff_max"] > 1e-3 for row in result.history[1:])
    assert all(_gone(pid) for pid in tr.pids)


def test_ctrl_c_checkpoint_resumes_to_the_uninterrupted_run(tmp_path):
    k = 1
    full = _trainer(tmp_path / "full", k)
    full_history = full.train().history
    full_weights = full.model.state_dict()

    stopped = _trainer(tmp_path / "cut", k)
    # Ctrl-C during step 2: the step finishes (step 3 is already drawn and generating), a checkpoint is written
    sent = []

    def ctrl_c(step, loss):
        if step == 2 and not sent:  # once: a second Ctrl-C would stop at once
            sent.append(step)
            os.kill(os.getpid(), signal.SIGINT)
        return loss

    set_loss_hook(stopped, ctrl_c)
    with pytest.raises(Interrupted) as info:
        stopped.train()
    assert info.value.checkpoint.name == "step_00000002"
    assert stopped.pids and all(_gone(pid) for pid in stopped.pids)  # the worker was stopped

    resumed = _trainer(tmp_path / "cut", k)
    history = resumed.train(resume="auto").history
    assert _rows(history) == _rows(full_history[2:])
    for name, value in resumed.model.state_dict().items():
        assert torch.equal(value, full_weights[name]), name
    for step in (3, 4):
        assert torch.equal(resumed.draws[step].rollout.completion_ids, full.draws[step].rollout.completion_ids)


def test_an_error_in_a_step_stops_the_worker(tmp_path):
    tr = _trainer(tmp_path / "run", 2, rollout={"async_timeout_s": 500.0, "async_start_timeout_s": 900.0})
    timeouts = []

    def fail(step, loss):
        timeouts.append((tr.pipeline.engine.timeout_s, tr.pipeline.engine.start_timeout_s))
        if step == 2:
            raise RuntimeError("injected")
        return loss

    set_loss_hook(tr, fail)
    with pytest.raises(RuntimeError, match="injected"):
        tr.train()
    assert tr.pids and all(_gone(pid) for pid in tr.pids)
    assert tr.rollout_engine is None
    assert timeouts[0] == (500.0, 900.0)  # the config's timeouts reach the worker


@pytest.mark.parametrize("sections, field", [
    ({"rollout": {"dynamic_sampling": True}}, "rollout.dynamic_sampling"),
    ({"rlvcr": {"enabled": True}}, "rlvcr.enabled"),
    ({"objective": {"advantage_estimator": "remax"}}, "objective.advantage_estimator"),
    ({"rollout": {"engine": "vllm"}}, "rollout.engine"),
    ({"model": {"lora": {"enabled": True}}}, "model.lora.enabled"),
])
def test_combinations_that_cannot_work_are_refused(tmp_path, sections, field):
    rollout = {"async_staleness": 2, **sections.pop("rollout", {})}
    with pytest.raises(ConfigError) as info:
        validate_config(small_config(tmp_path, rollout=rollout, **sections))
    assert "`rollout.async_staleness` = 2" in str(info.value) and f"`{field}`" in str(info.value)


def test_a_model_object_needs_a_factory_and_idle_fields_are_refused(tmp_path):
    with pytest.raises(InputError, match="model_factory="):
        make_trainer(tmp_path, rollout={"async_staleness": 1})
    model, tok = small_model(0)
    with pytest.raises(InputError, match="rollout_engine"):
        Trainer(small_config(tmp_path, rollout={"async_staleness": 1}), model=model, tokenizer=tok,
                model_factory=FACTORY, rollout_engine=HFRollout(model, tok))
    with pytest.raises(ConfigError, match="`rollout.async_threads` = 2 has no effect"):
        validate_config(small_config(tmp_path, rollout={"async_threads": 2}))
    with pytest.raises(ConfigError, match="`rollout.async_start_timeout_s` = 60.0 has no effect"):
        validate_config(small_config(tmp_path, rollout={"async_start_timeout_s": 60.0}))
