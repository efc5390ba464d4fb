"""Fault injection: SIGKILL at seeded points of a trainer run, of a trainer run with a rollout worker
(``rollout.async_staleness: 1``), of a multi-turn environment run and of a SAC run, then ``--resume``, reproduces
the uninterrupted run's final weights and metrics exactly (CPU).

Each run executes ``lmpo.cli.main`` in a child forked from this (already imported) process. In the child,
every point where a kill can hurt calls ``tick``: each file write of a checkpoint or of the run's config is
split in two halves with a tick between them (a torn file), every metrics line likewise, every rename and
directory removal (publishing or pruning a checkpoint) is preceded and followed by one, and so is every RL
step / environment lock-step / environment turn; every weight push to the rollout worker is split in two halves
too (a torn version in shared memory). A counting run of the uninterrupted job lists the ticks; a seeded draw picks
kill points among them — some inside checkpoint writes, some inside metrics writes, some inside weight pushes
(the asynchronous job), the rest anywhere — and
the child SIGKILLs itself at its chosen tick. The run is then resumed (``--resume``; when the kill came before
the first checkpoint the command refuses with exit status 2 and the run is started again with
``--overwrite``, as a user would), in a few tries killed again during the resume, and finally compared with
the uninterrupted run: the final checkpoint's weights bit for bit and every metrics row except wall-clock
timings.
"""

from __future__ import annotations

import json
import os
import random
import signal
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import pytest
import torch
import yaml
from safetensors.torch import load_file

import lmpo.checkpoints as ckmod
import lmpo.runs as runsmod
from lmpo.cli import main
from lmpo.models.presets import MODEL_PRESETS, ModelPreset
from sac_helpers import SMALL_CORPUS_ARGS

#: kills per job by where the tick is (label prefix; "other": any tick no prefix claims), drawn in this order, plus
#: DOUBLE_KILLS tries whose resume is killed once more
KILLS = {
    "trainer": {"ckpt-": 8, "metrics-": 6, "other": 6},
    "sac": {"ckpt-": 8, "metrics-": 6, "other": 6},
    "async": {"ckpt-": 6, "metrics-": 4, "push-": 6, "other": 4},
    "multiturn": {"ckpt-": 8, "metrics-": 6, "other": 6},
}
DOUBLE_KILLS = 2
TIMING_KEYS = ("time/", "perf/", "step/seconds", "step/updates_per_s")


# ----------------------------------------------------------------------------------------------------
# Forked children with kill points
# ----------------------------------------------------------------------------------------------------


def _install_kill_points(kill_at: int | None, labels: list[str]) -> None:
    """Patch this (child) process so that the ``kill_at``-th tick SIGKILLs it; record every tick's label."""
    import shutil

    import lmpo.generation.episodes as episodes
    import lmpo.generation.worker as worker
    import lmpo.textagent.sac.train as sac_train
    import lmpo.trainer.run.loop as loop
    import lmpo.trainer.run.state as trainer_ckpt

    def tick(label: str) -> None:
        labels.append(label)
        if len(labels) == kill_at:
            os.kill(os.getpid(), signal.SIGKILL)

    def torn_write_bytes(path, data: bytes, sync: bool = True) -> None:
        name = Path(path).name
        with open(path, "wb") as fh:
            fh.write(data[: len(data) // 2])
            fh.flush()
            tick(f"ckpt-write-half {name}")
            fh.write(data[len(data) // 2:])
            fh.flush()
            if sync:
                os.fsync(fh.fileno())
        tick(f"ckpt-write-done {name}")

    def torn_append(self, record) -> None:
        line = json.dumps(record) + "\n"
        self._fh.write(line[: len(line) // 2])
        self._fh.flush()
        tick("metrics-write-half")
        self._fh.write(line[len(line) // 2:])
        self._fh.flush()
        self.rows += 1
        tick("metrics-write-done")

    def around(label: str, fn):
        def wrapped(*a, **k):
            tick(f"{label}-before")
            out = fn(*a, **k)
            tick(f"{label}-after")
            return out
        return wrapped

    real_push = worker.AsyncRollout.push_weights

    def torn_push(self, model):
        """``push_weights`` with a tick after half of the tensors are copied into the slot: a kill there leaves a
        version half written in shared memory (marked as being written) and a worker waiting for it."""
        views = self._slot_views

        class Halves:
            def __getitem__(_, slot):
                for i, view in enumerate(views[slot]):
                    if i == len(views[slot]) // 2:
                        tick("push-write-half")
                    yield view

        tick("push-before")
        self._slot_views = Halves()
        try:
            version = real_push(self, model)
        finally:
            self._slot_views = views
        tick("push-done")
        return version

    # fsync guards against power loss, not against a killed process (the page cache survives SIGKILL); it is
    # slow on shared disks, so the children skip it
    os.fsync = lambda fd: None
    ckmod.write_bytes = torn_write_bytes
    runsmod.JsonlAppender.append = torn_append
    trainer_ckpt.save_model = around("ckpt-save-model", trainer_ckpt.save_model)
    os.replace = around("ckpt-rename", os.replace)
    shutil.rmtree = around("ckpt-rmtree", shutil.rmtree)
    loop.Trainer.rl_step = around("rl-step", loop.Trainer.rl_step)
    sac_train.Trainer.collect = around("env-step", sac_train.Trainer.collect)
    worker.AsyncRollout.push_weights = torn_push
    episodes.EpisodeRunner._advance = around("env-turn", episodes.EpisodeRunner._advance)
    episodes._check_step_result = around("env-reply", episodes._check_step_result)


def run_child(argv: list[str], cwd: Path, kill_at: int | None = None, labels_file: Path | None = None,
              timeout_s: float = 300.0, prepare=None) -> int | str:
    """Run ``lmpo argv`` in a forked child; returns its exit status, or ``"killed"``. ``prepare()`` runs in the
    child first (to patch it)."""
    log = cwd / "child.log"
    pid = os.fork()
    if pid == 0:  # the child: never returns into pytest
        code = 70
        try:
            fd = os.open(log, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
            os.dup2(fd, 1)
            os.dup2(fd, 2)
            # pytest replaces sys.stdout/stderr by its own capture files: write to the log instead
            sys.stdout = open(1, "w", buffering=1, closefd=False)
            sys.stderr = open(2, "w", buffering=1, closefd=False)
            os.chdir(cwd)
            os.setpgid(0, 0)  # its own process group, which a rollout worker it starts joins (see below)
            torch.set_num_threads(1)
            labels: list[str] = []
            _install_kill_points(kill_at, labels)
            if prepare is not None:
                prepare()
            code = main(argv)
            if labels_file is not None:
                labels_file.write_text(json.dumps(labels))
        except BaseException:  # noqa: BLE001 - report and exit; the parent reads the log
            import traceback

            traceback.print_exc()
        finally:
            sys.stdout.flush()
            sys.stderr.flush()
            os._exit(code)
    deadline = time.monotonic() + timeout_s
    while True:
        done, status = os.waitpid(pid, os.WNOHANG)
        if done:
            break
        if time.monotonic() > deadline:
            os.kill(pid, signal.SIGKILL)
            os.waitpid(pid, 0)
            raise AssertionError(f"child `lmpo {' '.join(argv)}` hung; log:\n{log.read_text()[-3000:]}")
        time.sleep(0.01)
    if os.WIFSIGNALED(status):
        assert os.WTERMSIG(status) == signal.SIGKILL, log.read_text()[-3000:]
        # a rollout worker started by fork (_ForkContext) holds copies of the run's pipe ends and of its run-lock
        # file, so it neither sees the pipe close nor lets the resumed run take the lock; a spawned worker (what
        # lmpo starts) inherits neither and leaves by itself, as tests/generation checks. Kill the group.
        try:
            os.killpg(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        # SIGKILL is delivered asynchronously: until the worker has died (and been reaped), its copy of the lock
        # file holds the run directory, and a resume started at once is refused as a second writer
        gone_by = time.monotonic() + 60
        while time.monotonic() < gone_by:
            try:
                os.killpg(pid, 0)
            except ProcessLookupError:
                break
            time.sleep(0.01)
        else:
            raise AssertionError(f"the process group of the killed child {pid} is still alive after 60 s")
        return "killed"
    return os.WEXITSTATUS(status)


# ----------------------------------------------------------------------------------------------------
# The kill-and-resume driver
# ----------------------------------------------------------------------------------------------------


def _choose_kills(labels: list[str], seed: int, kills: dict[str, int]) -> list[int]:
    """The ticks (1-based) to kill at: ``kills[prefix]`` ticks whose label starts with ``prefix``, drawn in the
    order of ``kills``, and ``kills["other"]`` among the ticks no prefix claims."""
    rng = random.Random(seed)
    claimed: set[int] = set()
    picks = []
    for prefix, count in kills.items():
        if prefix == "other":
            continue
        pool = [i for i, lab in enumerate(labels, 1) if lab.startswith(prefix)]
        claimed |= set(pool)
        picks += rng.sample(pool, count)
    other = [i for i in range(1, len(labels) + 1) if i not in claimed]
    return sorted(picks + rng.sample(other, kills["other"]))


@dataclass
class Job:
    fresh: list[str]
    resume: list[str]
    ref: Path  # the uninterrupted run (its directory holds run/)
    labels: list[str]  # the ticks of the uninterrupted run
    weights: str  # the weights file of a checkpoint
    kills: dict[str, int]  # KILLS[job]


def _prepare_job(root: Path, fresh: list[str], resume: list[str], weights: str, kills: dict[str, int]) -> Job:
    warm = root / "warm-up"  # one run in this process first: every lazy import is done before the forks
    warm.mkdir()
    cwd = os.getcwd()
    os.chdir(warm)
    try:
        assert main(fresh) == 0
    finally:
        os.chdir(cwd)
    ref = root / "ref"
    ref.mkdir()
    labels_file = root / "labels.json"
    assert run_child(fresh, ref, labels_file=labels_file) == 0, (ref / "child.log").read_text()[-3000:]
    return Job(fresh, resume, ref, json.loads(labels_file.read_text()), weights, kills)


def _final_state(d: Path, job: Job) -> dict:
    ck = _newest_checkpoint(d / "run")
    return {"checkpoint": ck.name, "weights": load_file(ck / job.weights), "metrics": _metrics(d / "run")}


def _same_run(got: dict, want: dict, where: str) -> None:
    assert got["checkpoint"] == want["checkpoint"], where
    assert got["weights"].keys() == want["weights"].keys(), where
    for key in want["weights"]:
        assert torch.equal(got["weights"][key], want["weights"][key]), f"{where}: {key} differs"
    assert got["metrics"] == want["metrics"], f"{where}: metrics differ"


def _planned_tries(labels: list[str], seed: int, kills: dict[str, int]) -> list[tuple[int, int | None]]:
    """Every try of the job as (kill point, tick at which its first resume is killed again or None): the seeded
    kill points, and the seeded second kills of ``DOUBLE_KILLS`` of them, drawn in try order."""
    points = _choose_kills(labels, seed, kills)
    rng = random.Random(seed + 1)
    double = set(rng.sample(range(len(points)), DOUBLE_KILLS))
    return [(k, rng.randint(1, max(2, len(labels) // 2)) if n in double else None) for n, k in enumerate(points)]


def _kill_and_resume(tmp: Path, job: Job, seed: int, shard: int = 0, shards: int = 1) -> dict:
    """Once per seeded kill point (those of ``shard`` of ``shards``: every ``shards``-th try, so that the tries
    of one job run on several cores): kill the job there, resume until it completes, compare with the reference."""
    fresh, resume, labels = job.fresh, job.resume, job.labels
    reference = _final_state(job.ref, job)
    run = run_child
    planned = list(enumerate(_planned_tries(labels, seed, job.kills)))[shard::shards]
    t0 = time.perf_counter()
    report = {"ticks": len(labels), "tries": 0, "reproduced": 0, "restarted": 0, "resume_kills": 0,
              "where": [labels[k - 1] for _, (k, _) in planned]}
    for n, (k, resume_kill) in planned:
        d = tmp / f"try{n:02d}"
        d.mkdir()
        assert run(fresh, d, kill_at=k) == "killed", (d / "child.log").read_text()[-3000:]
        for attempt in range(4):  # resume (killed once more in a few tries) until the run completes
            kill_at = resume_kill if attempt == 0 else None
            code = run(resume, d, kill_at=kill_at)
            if code == "killed":
                report["resume_kills"] += 1
                continue
            last = (d / "child.log").read_text().strip().splitlines()[-1]
            if code == 2 and ("no checkpoint" in last or "holds no run" in last):
                report["restarted"] += 1  # killed before the first checkpoint: start again, as the message says
                code = run([*fresh, "--overwrite"], d)
            assert code == 0, (d / "child.log").read_text()[-3000:]
            break
        else:
            raise AssertionError(f"try {n}: the run did not complete after resuming")
        report["tries"] += 1
        _same_run(_final_state(d, job), reference, f"try {n} (kill at tick {k}: {labels[k - 1]})")
        report["reproduced"] += 1
    report["seconds_per_try"] = round((time.perf_counter() - t0) / max(1, report["tries"]), 2)
    return report


def _metrics(run: Path) -> list[dict]:
    rows = runsmod.read_jsonl(run / "metrics.jsonl", on_torn=None)
    return [{k: v for k, v in r.items() if not k.startswith(TIMING_KEYS)} for r in rows]


def _newest_checkpoint(run: Path) -> Path:
    found = ckmod.list_checkpoints(run)
    assert found, f"{run} has no checkpoint"
    ckmod.verify_checkpoint(found[-1])
    return found[-1]


# ----------------------------------------------------------------------------------------------------
# The jobs
# ----------------------------------------------------------------------------------------------------


TRAIN_CONFIG = {
    "model": {"name": "kill-tiny"},
    "task": {"name": "addition", "options": {"min_digits": 1, "max_digits": 1, "num_eval": 8, "num_train": 64},
             "eval_examples": 6},
    "rollout": {"completions_per_prompt": 3, "max_new_tokens": 3},
    "objective": {"preset": "adaptive_entropy", "overrides": {"kl_coef": 0.01}},  # controller + reference model
    "rewards": {"functions": ["exact_match", "length_penalty"], "weights": [1.0, 1.0],
                "kwargs": {"length_penalty": {"target_chars": 0, "scale_chars": 3.0}}},
    "optim": {"lr": 1e-2},
    "sft": {"steps": 2, "seqs_per_step": 4},
    "loop": {"steps": 6, "prompts_per_step": 2, "seqs_per_microbatch": 3, "device": "cpu", "seed": 0},
    "eval": {"at_start": True, "every_steps": 3, "seqs_per_batch": 6},
    "checkpoint": {"every_steps": 2, "keep_last": 2},
    "logging": {"run_dir": "run", "progress_bar": False, "tensorboard": False},
}

# The rollout worker's job: step t trains on completions of the weights of step t − 2, so a checkpoint holds an
# earlier weight version and every step pushes one. Smaller than TRAIN_CONFIG (no warm-up, no reference model, a
# checkpoint every step) to keep its 20 tries cheap; the length reward makes the weights move at every step.
ASYNC_CONFIG = {
    **TRAIN_CONFIG,
    "rollout": {"completions_per_prompt": 3, "max_new_tokens": 3, "async_staleness": 1},
    "objective": {"preset": "grpo"},
    "sft": {"steps": 0},
    "loop": {**TRAIN_CONFIG["loop"], "steps": 4},
    "eval": {"at_start": False, "every_steps": 2, "seqs_per_batch": 6},
    "checkpoint": {"every_steps": 1, "keep_last": 2},
}

# The multi-turn job: GuessNumber episodes of up to 3 turns. An untrained model ends a turn (samples <|im_end|>)
# within 24 tokens about one time in five, so some episodes reach the environment, whose reply is appended as the
# next turn's observation; a static entropy bonus makes the weights move even in steps without a reward.
MULTITURN_CONFIG = {
    "model": {"name": "MODEL_DIR"},
    "env": {"id": "GuessNumber-v0", "budget": {"max_turns": 3, "max_total_tokens": 200,
                                                 "max_new_tokens_per_turn": 24}},
    "task": {"eval_examples": 2, "options": {"num_train": 64}},  # (10,000 secrets by default: 0.1 s per run)
    "rollout": {"completions_per_prompt": 2},
    "objective": {"preset": "grpo", "overrides": {"entropy_coef": 0.01}},
    "optim": {"lr": 1e-2},
    "loop": {"steps": 4, "prompts_per_step": 2, "seqs_per_microbatch": 4, "device": "cpu", "seed": 0},
    "eval": {"at_start": True, "every_steps": 2},
    "checkpoint": {"every_steps": 1, "keep_last": 2},
    "logging": {"run_dir": "run", "progress_bar": False, "tensorboard": False},
}


class _ForkContext:
    """``lmpo.generation.worker``'s view of ``torch.multiprocessing`` with "fork" for "spawn": the rollout worker
    starts as a copy of the (already imported) run instead of a new interpreter that imports torch again — several
    CPU seconds per start, 40 and more starts here — and it knows the test's model preset. The start method is no
    part of what these tests check: the worker's inputs (pipes, shared memory, seeds) are the same."""

    def __init__(self, real) -> None:
        self._real = real

    def get_context(self, method=None):
        return self._real.get_context("fork")

    def __getattr__(self, name):
        return getattr(self._real, name)


def _chat_model_dir(path: Path) -> Path:
    """A model directory as a user's warm-up writes it: the tiny preset with the offline chat tokenizer."""
    from lmpo.models import build_chat_tokenizer, build_tiny_model

    tok = build_chat_tokenizer()
    model = build_tiny_model(tok, seed=0, hidden_size=16, num_layers=1, num_heads=2, intermediate_size=32)
    model.save_pretrained(path)
    tok.save_pretrained(path)
    return path


@pytest.fixture(scope="module")
def jobs(tmp_path_factory):
    """The jobs, each run once uninterrupted (the reference) with its ticks counted — on first use, so that a
    pytest-xdist worker prepares only the jobs its tests need."""
    import lmpo.generation.worker as worker
    import lmpo.textagent.sac.train as sac_train
    import lmpo.trainer.run.loop as loop
    from lmpo.textagent.env import sample_text_path

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    mp = pytest.MonkeyPatch()
    mp.setitem(MODEL_PRESETS, "kill-tiny", ModelPreset(hidden_size=16, num_layers=1, num_heads=2,
                                                        intermediate_size=32, description="kill test"))
    root = tmp_path_factory.mktemp("kill")
    mp.setenv("LMPO_CACHE_DIR", str(root / "cache"))
    mp.setattr(worker, "mp", _ForkContext(worker.mp))
    # no training-curve PNGs at the end of a run, here or in the forked children: ~2.5 CPU seconds of matplotlib
    # per completed run, drawn after the last checkpoint and metrics row from them (so no kill point and nothing
    # compared here); tests/textagent/sac and tests/trainer check the plots themselves
    for module in (loop, sac_train):
        mp.setattr(module, "plot_runs", lambda run_dirs, *a, **k: [])
    cfg, async_cfg, env_cfg = root / "train.yaml", root / "async.yaml", root / "multiturn.yaml"
    cfg.write_text(yaml.safe_dump(TRAIN_CONFIG))
    async_cfg.write_text(yaml.safe_dump(ASYNC_CONFIG))
    model_dir = str(_chat_model_dir(root / "chat-model"))
    env_cfg.write_text(yaml.safe_dump({**MULTITURN_CONFIG, "model": {"name": model_dir}}))
    sac = ["sac", "train", "--run-dir", "run", "--corpus", str(sample_text_path()), *SAC_ARGS]
    commands = {
        "trainer": (["train", str(cfg)], ["train", str(cfg), "--resume"], "model.safetensors"),
        "async": (["train", str(async_cfg)], ["train", str(async_cfg), "--resume"], "model.safetensors"),
        "multiturn": (["train", str(env_cfg)], ["train", str(env_cfg), "--resume"], "model.safetensors"),
        "sac": (sac, ["sac", "train", "--run-dir", "run", "--resume", "--quiet", "--no-eval"], "agent.safetensors"),
    }
    prepared: dict[str, Job] = {}

    def job(name: str) -> Job:
        if name not in prepared:
            (root / name).mkdir()
            prepared[name] = _prepare_job(root / name, *commands[name], KILLS[name])
        return prepared[name]

    yield job
    mp.undo()
    torch.set_num_threads(threads)


#: tries of each job's kill/resume test run in this many shards (separate tests: pytest-xdist spreads them over
#: the cores); together the shards cover every seeded kill point
KILL_SHARDS = {"trainer": 2, "sac": 4, "async": 2, "multiturn": 2}
SEEDS = {"trainer": 12, "sac": 4, "async": 7, "multiturn": 3}


@pytest.mark.slow
@pytest.mark.parametrize("name, shard", [(name, shard) for name in SEEDS for shard in range(KILL_SHARDS[name])])
def test_kill_anywhere_then_resume_reproduces_the_run(jobs, name, shard, tmp_path):
    shards = KILL_SHARDS[name]
    job = jobs(name)
    report = _kill_and_resume(tmp_path, job, SEEDS[name], shard, shards)
    print(f"\n{name} kill/resume, shard {shard + 1} of {shards}: {report}")
    assert report["reproduced"] == report["tries"] == len(range(shard, sum(KILLS[name].values()), shards))


def test_the_new_jobs_reach_the_code_they_are_meant_to_kill(jobs):
    """The asynchronous job pushes weights (and checkpoints the held ones), the multi-turn job plays turns
    that reach the environment: otherwise their kill points would test nothing new."""
    pushes = [lab for lab in jobs("async").labels if lab == "push-write-half"]
    assert len(pushes) >= ASYNC_CONFIG["loop"]["steps"], pushes
    replies = [lab for lab in jobs("multiturn").labels if lab == "env-reply-before"]
    assert replies, "no episode turn reached the environment"
    ref = _newest_checkpoint(jobs("async").ref / "run")
    assert '"async"' in (ref / "state.json").read_text(), "the checkpoint holds no earlier weight versions"


def test_the_kill_shards_cover_every_kill_point_once():
    for name, shards in KILL_SHARDS.items():
        tries = sum(KILLS[name].values())
        assert tries >= 20, f"{name}: {tries} kills"
        assert sorted(n for shard in range(shards) for n in range(tries)[shard::shards]) == list(range(tries))
    labels = [f"{kind}-{i}" for kind in ("ckpt", "metrics", "push", "step") for i in range(30)]
    for name, kills in KILLS.items():
        planned = _planned_tries(labels, 4, kills)
        assert len({k for k, _ in planned}) == len(planned) == sum(kills.values())
        assert sum(second is not None for _, second in planned) == DOUBLE_KILLS
        for prefix, count in kills.items():
            if prefix != "other":
                assert sum(labels[k - 1].startswith(prefix) for k, _ in planned) == count, (name, prefix)


SAC_ARGS = ["--quiet", "--no-eval", "--heldout_fraction", "0.25", "--num_envs", "2", "--total_env_steps", "56",
            "--learning_starts", "16", "--updates_per_iteration", "2", "--log_every_updates", "4",
            "--checkpoint_every_updates", "5", "--checkpoint_keep_last", "2", "--eval_every_updates", "8",
            "--eval_max_positions", "16", "--threads", "1", "--net.embed_dim", "8", "--net.gru_hidden", "8",
            "--net.policy_hidden", "8", "--net.q_hidden", "8", "--net.action_embed_dim", "8",
            "--replay.transitions_per_batch", "8", "--replay.teacher_anneal_env_steps", "40",
            "--env.window_chars", "4", "--env.max_steps", "8", "--env.nce_pretrain_steps", "2",
            "--env.use_jieba_lexicon", "false", *SMALL_CORPUS_ARGS]


def _ctrl_c_after(cls, method: str, calls: int):
    """Patch ``cls.method`` (in the child) so that its ``calls``-th call sends this process a SIGINT first."""
    def prepare():
        real, seen = getattr(cls, method), []

        def wrapped(self, *a, **k):
            seen.append(1)
            if len(seen) == calls:
                os.kill(os.getpid(), signal.SIGINT)
            return real(self, *a, **k)
        setattr(cls, method, wrapped)
    return prepare


@pytest.mark.parametrize("name", ["trainer", "sac"])
def test_ctrl_c_writes_a_checkpoint_prints_the_resume_command_and_resumes_exactly(jobs, name, tmp_path):
    import lmpo.textagent.sac.train as sac_train
    import lmpo.trainer.run.loop as loop

    job = jobs(name)
    (cls, method, calls), said = {
        "trainer": ((loop.Trainer, "rl_step", 3), "after RL step 3 of 6"),
        "sac": ((sac_train.Trainer, "collect", 14), "after 14 updates (28 env steps)"),
    }[name]
    assert run_child(job.fresh, tmp_path, prepare=_ctrl_c_after(cls, method, calls)) == 130
    last = (tmp_path / "child.log").read_text().strip().splitlines()[-1]
    assert f"stopped by Ctrl-C {said}" in last and "checkpoint written to run/checkpoints/step_" in last, last
    assert last.split("Continue with: ")[1] == "lmpo " + " ".join([*job.fresh, "--resume"]), last
    assert run_child([*job.fresh, "--resume"], tmp_path) == 0, (tmp_path / "child.log").read_text()[-2000:]
    _same_run(_final_state(tmp_path, job), _final_state(job.ref, job), f"{name} after Ctrl-C")
