"""Episodes in the rollout worker (``AsyncRollout(..., episodes=EpisodeSpec(...))``): at staleness 0 the worker plays
the in-process runner's episodes bit for bit, with the user's environment module imported there (``env.import``)
and the training tokenizer's chat template carried over; an environment's error reaches the caller as the same
``EnvError``; the Python jail of an environment's tool runs in the worker and dies with it, and with the training
process (the worker leaves mid-call); an id the worker cannot register is refused naming ``env.import``."""

from __future__ import annotations

import functools
import os
import signal
import time

import pytest
import torch

import worker_env
from lmpo.envs import EnvError, EpisodeBudget, make_env, make_env_task
from lmpo.errors import InputError
from lmpo.generation import worker as worker_module
from lmpo.generation.episodes import EpisodeRunner, HFTurnSampler
from lmpo.generation.worker import AsyncRollout, EpisodeSpec
from lmpo.models import CHATML_TEMPLATE
from lmpo.tasks.base import Example
from worker_env import chat_model, count, ticking_model

ENV_FILE = os.path.abspath(worker_env.__file__)
BUDGET = EpisodeBudget(max_turns=3, max_total_tokens=200, max_new_tokens_per_turn=24)
G = 2


def _perturb(model, version: int) -> None:
    gen = torch.Generator().manual_seed(1000 + version)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(torch.randn(p.shape, generator=gen) * 0.05)


@pytest.mark.slow  # a worker start and 3 steps: ~10-20 s on 2 shared cores
def test_staleness_0_plays_the_in_process_episodes(tmp_path):
    """Three steps, the weights changed between them: each step's episodes (tokens, masks, log-probs, rewards,
    messages, end reasons) equal ``EpisodeRunner``'s in this process on the same weights and seeds. The worker's
    factory builds a tokenizer without a chat template (the spec carries the training tokenizer's), and the
    environment is registered by a file the worker imports; it counts its calls, in the worker only."""
    model, tok = chat_model(0)
    examples = make_env_task("TickingGuess-v0").train_examples()[:6]
    options = {"ticks": str(tmp_path), "main_pid": os.getpid()}
    spec = EpisodeSpec("TickingGuess-v0", env_options=options, imports=(ENV_FILE,), budget=BUDGET,
                       tokenizer_chat_template=CHATML_TEMPLATE, step_timeout_s=60.0)
    here = EpisodeRunner(HFTurnSampler(model, tok), tok, BUDGET, step_timeout_s=60.0)
    factory = functools.partial(ticking_model, template=False)
    played = []
    with AsyncRollout(factory, model, staleness=0, episodes=spec) as engine:
        for step in range(3):
            batch = examples[2 * step: 2 * step + 2]
            engine.submit_episodes(step, batch, G, seed=10 + step, generator_seed=77 + step)
            got = engine.result(step)
            want = here.run(lambda: make_env("TickingGuess-v0", **options), batch, G, seed=10 + step,
                            generator=torch.Generator().manual_seed(77 + step))
            assert got == want, step
            played += got
            _perturb(model, step + 1)
            engine.push_weights(model)
        # an environment that fails is reported as in process: the same EnvError, naming it and where
        engine.submit_episodes(3, [Example(prompt="no secret", answer="")], 1, seed=0, generator_seed=0)
        with pytest.raises(EnvError, match=r"TickingGuess-v0 failed at reset of episode 0 .*env.on_env_error"):
            engine.result(3)
    assert any(e.num_turns >= 2 for e in played)  # the environment answered and the episodes went on
    assert count(tmp_path, "env") == sum(1 + len(e.rewards) for e in played) + 1  # + the failed reset


def _descendants(pid: int) -> set[int]:
    children: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/stat") as f:
                    ppid = int(f.read().rsplit(")", 1)[1].split()[1])
            except (OSError, IndexError, ValueError):
                continue
            children.setdefault(ppid, []).append(int(entry))
    found, todo = set(), [pid]
    while todo:
        for child in children.get(todo.pop(), []):
            found.add(child)
            todo.append(child)
    return found


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[-1].split()[0] != "Z"
    except OSError:
        return False


def test_a_tools_jail_runs_in_the_worker_and_dies_with_it(tmp_path):
    """``SandboxOpening-v0`` runs the example's program in the Python sandbox at reset. In the worker the jail works
    (the opening shows what it printed); a worker SIGKILLed while a jailed program sleeps takes the whole jail
    (supervisor, init, program) with it."""
    from lmpo.envs.tools.sandbox import isolation

    if isolation().mode != "jail":
        pytest.skip(f"no jail on this machine: {isolation()}")
    model, _ = chat_model(0)
    spec = EpisodeSpec("SandboxOpening-v0", env_options={"ticks": str(tmp_path)}, imports=(ENV_FILE,),
                       sandbox_require="jail", budget=BUDGET, step_timeout_s=200.0)
    engine = AsyncRollout(ticking_model, model, staleness=0, episodes=spec)
    try:
        engine.submit_episodes(0, [Example(prompt="print(6 * 7)", answer="")], 1, seed=0, generator_seed=0)
        assert engine.result(0)[0].messages[0]["content"] == "The program printed: 42"
        engine.push_weights(model)  # step 1's weights
        engine.submit_episodes(1, [Example(prompt="import time\ntime.sleep(120)", answer="")], 1, seed=0, generator_seed=0)
        worker, deadline = engine.pid, time.monotonic() + 60
        tree: set[int] = set()
        while time.monotonic() < deadline and len(tree) < 3:  # the supervisor, the jail's init, the program
            if count(tmp_path, "sandbox") == 2:
                tree = _descendants(worker)
            time.sleep(0.05)
        assert len(tree) >= 3, tree
        os.kill(worker, signal.SIGKILL)
    finally:
        engine.close()
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline and any(_alive(p) for p in tree):
        time.sleep(0.05)
    assert not [p for p in tree if _alive(p)]


def test_an_environment_the_worker_cannot_register_is_refused_naming_env_import():
    """An id registered here by code the worker does not run (no module to import) stops the worker's start with
    the InputError that says to name a module in ``env.import``."""
    from lmpo.envs.base import ENVS, register_env

    register_env("OnlyInThisProcess-v0")(worker_env.SandboxOpening)
    model, _ = chat_model(0)
    try:
        engine = AsyncRollout(ticking_model, model, episodes=EpisodeSpec("OnlyInThisProcess-v0", budget=BUDGET))
        with pytest.raises(InputError, match=r"OnlyInThisProcess-v0' is not registered in the rollout worker .*"
                                             r"name it in `env.import`"):
            engine.generate(["x"], 1, seed=0)
        assert engine.pid is None  # stopped
    finally:
        del ENVS["OnlyInThisProcess-v0"]


def test_a_worker_whose_training_process_dies_leaves_mid_call_with_its_jail(tmp_path):
    """The training process (a forked copy of this one) SIGKILLed while its worker's environment waits on a jailed
    program: the worker does not wait for the call to end (its watchdog sees the parent go) and takes the jail
    with it. Without the watchdog it would live until the program's 120 s were over."""
    from lmpo.envs.tools.sandbox import isolation

    if isolation().mode != "jail":
        pytest.skip(f"no jail on this machine: {isolation()}")
    read, write = os.pipe()
    main = os.fork()
    if main == 0:  # the training process: never returns into pytest
        try:
            os.close(read)
            torch.set_num_threads(1)
            # this copy cannot use the test process's forkserver (not its child): its worker starts by fork
            worker_module.worker_context = lambda method: torch.multiprocessing.get_context("fork")
            spec = EpisodeSpec("SandboxOpening-v0", env_options={"ticks": str(tmp_path)}, imports=(ENV_FILE,),
                               budget=BUDGET, step_timeout_s=200.0)
            engine = AsyncRollout(ticking_model, chat_model(0)[0], staleness=0, episodes=spec)
            engine.submit_episodes(0, [Example(prompt="import time\ntime.sleep(120)", answer="")], 1, seed=0,
                                   generator_seed=0)
            os.write(write, f"{engine.pid}\n".encode())
            time.sleep(300)
        finally:
            os._exit(0)
    os.close(write)
    try:
        worker = int(os.read(read, 64))
        deadline, tree = time.monotonic() + 60, set()
        while time.monotonic() < deadline and len(tree) < 3:
            if count(tmp_path, "sandbox") == 1:
                tree = _descendants(worker)
            time.sleep(0.05)
        assert len(tree) >= 3, tree
    finally:
        os.kill(main, signal.SIGKILL)
        os.waitpid(main, 0)
        os.close(read)
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline and any(_alive(p) for p in tree | {worker}):
        time.sleep(0.05)
    survivors = [p for p in tree | {worker} if _alive(p)]
    for pid in survivors:  # a failed test leaves nothing behind (a forked worker holds this session's pipes)
        os.kill(pid, signal.SIGKILL)
    assert not survivors
