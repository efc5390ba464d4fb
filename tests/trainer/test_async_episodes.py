"""``rollout.async_staleness`` on an environment run (``env.id``): the rollout worker plays the episodes.

One module fixture trains four short runs of ``TickingGuess-v0`` (``GuessNumber-v0`` from a user's module named
in ``env.import``, which counts its calls in the worker): in process (the synchronous loop), through the worker
with staleness 0, with staleness 1, and with staleness 1 while the worker is SIGKILLed 20 times at seeded calls
(10 inside generation, 10 inside environment calls). The tests compare them."""

from __future__ import annotations

import dataclasses
import functools
import os
import random
import re
import signal

import pytest
import torch
from trainer_helpers import set_loss_hook

import worker_env
from lmpo.envs import make_env
from lmpo.errors import Interrupted
from lmpo.generation.worker import AsyncRollout
from lmpo.trainer import Trainer, build
from lmpo.trainer.config import config_from_dict
from lmpo.trainer.step.multiturn import make_runner
from lmpo.trainer.step.sampling import seed_for
from worker_env import points, ticking_model

STEPS, KILLS = 4, 20
ENV = "TickingGuess-v0"


class Recording(Trainer):
    """Keeps each step's starting weights (W_t−1), episodes and the worker's pids and restarts."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.weights, self.played, self.pids, self.restarts = {}, {}, set(), 0

    def rl_step(self, step):
        self.weights[step - 1] = {k: v.detach().clone() for k, v in self.model.state_dict().items()}
        return super().rl_step(step)

    def sample(self, step):
        got = super().sample(step)
        self.played[step] = got.played.episodes
        if self.pipeline is not None:
            self.pids.add(self.pipeline.engine.pid)
            self.restarts = self.pipeline.engine.restarts
        return got


class WorkerAtStaleness0(Recording):
    """The trainer with the rollout worker at k = 0 (a config asks for k >= 1; k = 0 is the in-process loop): the
    pipeline of ``build.build_async_pipeline`` started before step 1, pushed by ``rl_step`` after each update."""

    def sample(self, step):
        if self.pipeline is None:
            cfg = dataclasses.replace(self.cfg, rollout=dataclasses.replace(self.cfg.rollout, async_staleness=0))
            self.pipeline = build.build_async_pipeline(cfg, self.model, self.model_factory, self.prompts,
                                                       start_step=step - 1, held=None, device=self.device,
                                                       log=self.log, tokenizer=self.tokenizer)
            self.rollout_engine = self.pipeline.engine
        return super().sample(step)


def _config(run_dir, k: int, ticks=None, kill_env=(), checkpoint_every: int = 0):
    options = {} if ticks is None else {"ticks": str(ticks), "kill_at": list(kill_env), "main_pid": os.getpid()}
    return config_from_dict({
        "env": {"id": ENV, "import": [os.path.abspath(worker_env.__file__)], "options": options,
                "budget": {"max_turns": 3, "max_total_tokens": 200, "max_new_tokens_per_turn": 24}},
        "task": {"eval_examples": 2},
        "rollout": {"completions_per_prompt": 2, "async_staleness": k},
        "objective": {"preset": "grpo", "overrides": {"entropy_coef": 0.01}},  # the weights move at every step
        "optim": {"lr": 1e-2},
        "loop": {"steps": STEPS, "prompts_per_step": 2, "seqs_per_microbatch": 4, "seed": 0, "device": "cpu"},
        "eval": {"at_start": False}, "checkpoint": {"at_end": False, "every_steps": checkpoint_every},
        "logging": {"run_dir": str(run_dir), "progress_bar": False, "tensorboard": False, "plots": False},
    })


def _train(cls, cfg, factory=None, log=None) -> tuple[Trainer, list[dict]]:
    model, tok = worker_env.chat_model(0)
    tr = cls(cfg, model=model, tokenizer=tok, model_factory=factory, log=log or (lambda msg: None))
    return tr, tr.train().history


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    root = tmp_path_factory.mktemp("async-env")
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    out = {"sync": _train(Recording, _config(root / "sync", 0)),
           "k0": _train(WorkerAtStaleness0, _config(root / "k0", 0), ticking_model)}
    counted = root / "ticks"
    counted.mkdir()
    out["k1"] = _train(Recording, _config(root / "k1", 1, counted), functools.partial(ticking_model, str(counted)))
    rng = random.Random(0)  # the kill points: seeded points of the uninterrupted run (worker_env.tick)
    kill_env = rng.sample(range(1, points(counted, "env") + 1), KILLS // 2)
    kill_forward = rng.sample(range(1, points(counted, "forward") + 1), KILLS // 2)
    killed = root / "kill-ticks"
    killed.mkdir()
    mp = pytest.MonkeyPatch()
    mp.setattr(build, "AsyncRollout", functools.partial(AsyncRollout, max_restarts=KILLS + 5))
    messages = []
    try:
        out["killed"] = _train(Recording, _config(root / "killed", 1, killed, kill_env),
                               functools.partial(ticking_model, str(killed), kill_forward), log=messages.append)
    finally:
        mp.undo()
        torch.set_num_threads(threads)
    out["messages"] = messages
    return out


def _rows(history):
    return [{k: v for k, v in row.items() if not k.startswith(("time/", "perf/"))} for row in history]


def _same_weights(a: Trainer, b: Trainer) -> None:
    got = b.model.state_dict()
    for name, value in a.model.state_dict().items():
        assert torch.equal(value, got[name]), name


def _gone(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[-1].split()[0] == "Z"
    except OSError:
        return True


@pytest.mark.slow
def test_staleness_0_in_the_worker_is_the_in_process_run(runs):
    """Same episodes (tokens, log-probs, rewards, messages) at every step, same metrics, same final weights."""
    (sync, sync_rows), (k0, k0_rows) = runs["sync"], runs["k0"]
    assert k0.pids and all(_gone(pid) for pid in k0.pids)
    for step in range(1, STEPS + 1):
        assert k0.played[step] == sync.played[step], step
    assert _rows(k0_rows) == _rows(sync_rows)
    _same_weights(sync, k0)


@pytest.mark.slow
def test_staleness_1_plays_step_t_on_the_weights_of_step_t_minus_2(runs):
    """Each step's episodes equal the in-process runner's with W_max(0, t−2), the step's examples and seeds; the
    environment ran in the worker (its calls were counted there, none in this process)."""
    tr, history = runs["k1"]
    assert len(history) == STEPS and len(tr.pids) == 1
    model, tok = worker_env.chat_model(0)
    runner = make_runner(model, tok, tr.cfg.env, temperature=1.0)
    for step in range(1, STEPS + 1):
        model.load_state_dict(tr.weights[max(0, step - 2)])
        examples = [e.example for e in tr.played[step][::2]]
        seed = seed_for(0, step, 1)
        expected = runner.run(lambda: make_env(ENV), examples, 2, seed=seed % 2**31,
                              generator=torch.Generator().manual_seed(seed))
        assert tr.played[step] == expected, step
    assert history[0]["mismatch/abs_logp_diff_max"] < 1e-4  # step 1: W_0 on both sides
    assert any(row["mismatch/abs_logp_diff_max"] > 1e-3 for row in history[2:])  # later: staleness shows
    assert any(e.num_turns >= 2 for eps in tr.played.values() for e in eps)  # the environment answered


@pytest.mark.slow
def test_twenty_seeded_worker_kills_change_nothing(runs):
    """SIGKILLs of the worker at 20 seeded calls (10 of the model's forward, inside generation; 10 of the
    environment's reset/step): each is restarted on the weights held in shared memory and replays its requests;
    every step's episodes, the metrics and the final weights equal the uninterrupted run's; no worker is left."""
    (full, full_rows), (killed, killed_rows) = runs["k1"], runs["killed"]
    restarted = [m for m in runs["messages"] if "killed by signal 9" in m]
    assert killed.restarts == len(restarted) == KILLS
    workers = {int(pid) for m in restarted for pid in re.findall(r"pid (\d+)", m)}
    for step in range(1, STEPS + 1):
        assert killed.played[step] == full.played[step], step
    assert _rows(killed_rows) == _rows(full_rows)
    _same_weights(full, killed)
    assert len(workers) == KILLS + 1 and all(_gone(pid) for pid in workers | full.pids)


@pytest.mark.slow
def test_a_ctrl_c_checkpoint_resumes_to_the_uninterrupted_run(runs, tmp_path):
    """Ctrl-C during step 2 (step 3's episodes already in the worker): the checkpoint keeps W_1 and the data position
    before step 3; the resumed run plays steps 3 and 4 as the uninterrupted run did, to the same weights."""
    full, full_rows = runs["k1"]
    model, tok = worker_env.chat_model(0)
    cut = Recording(_config(tmp_path / "run", 1, checkpoint_every=1), model=model, tokenizer=tok,
                    model_factory=ticking_model, log=lambda msg: None)
    sent = []

    def ctrl_c(step, loss):
        if step == 2 and not sent:
            sent.append(step)
            os.kill(os.getpid(), signal.SIGINT)
        return loss

    set_loss_hook(cut, ctrl_c)
    with pytest.raises(Interrupted) as info:
        cut.train()
    assert info.value.checkpoint.name == "step_00000002" and all(_gone(pid) for pid in cut.pids)
    model, tok = worker_env.chat_model(0)
    resumed = Recording(_config(tmp_path / "run", 1, checkpoint_every=1), model=model, tokenizer=tok,
                        model_factory=ticking_model, log=lambda msg: None)
    rows = resumed.train(resume="auto").history
    assert _rows(rows) == _rows(full_rows[2:])
    for step in (3, 4):
        assert resumed.played[step] == full.played[step], step
    _same_weights(full, resumed)
