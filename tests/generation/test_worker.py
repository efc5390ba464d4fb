"""AsyncRollout on the tiny model: staleness 0 equals HFRollout bit for bit; staleness k follows the schedule
(step t on weights version t − k) whatever the timing; a SIGKILLed worker is restarted and the run's output is
unchanged; a stopped (hung) worker is reported; close / with / Ctrl-C leave no worker process behind."""

from __future__ import annotations

import functools
import os
import signal
import subprocess
import sys
import textwrap
import time

import pytest
import torch

from lmpo.errors import RunError
from lmpo.generation import HFRollout, Rollout, RolloutEngine
from lmpo.generation.worker import AsyncRollout, model_tensors
from lmpo.models import load_model_and_tokenizer

PROMPTS = ["12+34=", "5+6=", "rev abc="]
G = 2
OPTIONS = dict(max_new_tokens=8, temperature=1.0, record_logprobs=True)
FACTORY = functools.partial(load_model_and_tokenizer, "tiny", seed=1)  # other initial weights: the push must win
STEPS = 4


def _perturb(model, version: int) -> None:
    """The 'optimizer step' that makes weights version ``version`` (deterministic)."""
    gen = torch.Generator().manual_seed(1000 + version)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(torch.randn(p.shape, generator=gen) * 0.05)


def _seed(step: int) -> int:
    return 77 + step


def _prompts(step: int) -> list[str]:
    return PROMPTS[step % 3:] + PROMPTS[: step % 3]


def _assert_same(a: Rollout, b: Rollout) -> None:
    for name in ("prompt_ids", "prompt_mask", "completion_ids", "completion_mask", "group_ids", "truncated",
                 "logprobs"):
        x, y = getattr(a, name), getattr(b, name)
        assert (x is None) == (y is None), name
        if x is not None:
            assert x.dtype == y.dtype and torch.equal(x.cpu(), y.cpu()), name
    assert a.prompts == b.prompts and a.completions == b.completions


@pytest.fixture(scope="module")
def versions():
    """Weights versions 0 … STEPS (state dicts) and the in-process HFRollout output of step t on version v, for
    the (v, t) that staleness 0 and 1 use, on one torch thread as the worker (a module fixture is set up before
    the function-scoped one-thread fixture; two threads round the log-probs differently)."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        return _versions()
    finally:
        torch.set_num_threads(threads)


def _versions():
    model, tok = load_model_and_tokenizer("tiny", seed=0)
    states = []
    for v in range(STEPS + 1):
        if v:
            _perturb(model, v)
        states.append({k: t.clone() for k, t in model.state_dict().items()})
    expected = {}
    engine = HFRollout(model, tok, **OPTIONS)
    for v, state in enumerate(states):
        model.load_state_dict(state)
        for t in (v, v + 1):  # staleness 0 and 1: step t on version t or t − 1
            if t < STEPS:
                expected[v, t] = engine.generate(_prompts(t), G, seed=_seed(t))
    # the versions differ where it shows: the schedule below cannot pass with the wrong version
    assert not torch.equal(expected[0, 1].logprobs, expected[1, 1].logprobs)
    return states, expected


def _run(staleness: int, versions, kill_at: tuple[int, ...] = (), log=None, by_hand: bool = True) -> list[Rollout]:
    """The training loop's use of the engine: prefetch k + 1 steps, then result → 'step' → push → submit
    (``by_hand``), or ``rollout_for`` → 'step' → push."""
    states, _ = versions
    model, _ = load_model_and_tokenizer("tiny", seed=0)
    model.load_state_dict(states[0])
    out = []
    with AsyncRollout(FACTORY, model, staleness=staleness, log=log, timeout_s=120, **OPTIONS) as engine:
        if by_hand:
            for t in range(min(staleness + 1, STEPS)):
                engine.submit(t, _prompts(t), G, seed=_seed(t))
        for t in range(STEPS):
            if t in kill_at:  # the worker may be anywhere: generating, waiting for weights, between requests
                os.kill(engine.pid, signal.SIGKILL)
            if by_hand:
                out.append(engine.result(t))
            else:
                out.append(engine.rollout_for(t, lambda s: (_prompts(s), G, _seed(s)), last_step=STEPS - 1))
            model.load_state_dict(states[t + 1])
            assert engine.push_weights(model) == t + 1
            if by_hand and t + 1 + staleness < STEPS:
                engine.submit(t + 1 + staleness, _prompts(t + 1 + staleness), G, seed=_seed(t + 1 + staleness))
        assert not engine._step_rid  # every submitted step collected, none beyond the last
        pid = engine.pid
    assert _gone(pid, within_s=0.0)  # leaving the with block stopped and reaped the worker
    return out


def test_staleness_0_equals_hfrollout_bit_for_bit(versions):
    _, expected = versions
    out = _run(0, versions)
    for t, ro in enumerate(out):
        assert ro.logprobs is not None  # the behaviour log-probs come from the worker
        _assert_same(ro, expected[t, t])


def test_sigkill_restart_gives_the_uninterrupted_output(versions):
    """Staleness 1 in the training loop's order (through ``rollout_for``), the worker SIGKILLed twice: every step equals the in-process
    generation with weights version t − 1, which an uninterrupted run also gives (test below, by timing)."""
    _, expected = versions
    messages = []
    out = _run(1, versions, kill_at=(1, 3), log=messages.append, by_hand=False)
    for t, ro in enumerate(out):
        _assert_same(ro, expected[max(0, t - 1), t])
    assert len(messages) == 2 and all("killed by signal 9" in m and "restarted as pid" in m for m in messages)


def test_timing_does_not_change_the_schedule(versions):
    """Every request submitted before the weights it needs exist (the worker waits for them), more requests
    than slots (each push waits until the version it overwrites is no longer needed; the worker is SIGKILLed
    just before such a push, so it is restarted inside it), and a generate() call with a generator, which
    advances it as the in-process engine does."""
    states, expected = versions
    model, tok = load_model_and_tokenizer("tiny", seed=0)
    model.load_state_dict(states[0])
    messages = []
    with AsyncRollout(FACTORY, model, staleness=1, queue_size=STEPS + 1, log=messages.append, **OPTIONS) as engine:
        assert isinstance(engine, RolloutEngine)
        for t in range(STEPS):
            engine.submit(t, _prompts(t), G, seed=_seed(t))
        for v in range(1, STEPS):
            model.load_state_dict(states[v])
            if v == 2:  # overwrites version 0 in slot 0: waits for steps 0 and 1
                os.kill(engine.pid, signal.SIGKILL)
            engine.push_weights(model)
            time.sleep(0.05 * v)
        assert len(messages) == 1 and "from weights version 1 held in shared memory" in messages[0]
        for t in range(STEPS):
            _assert_same(engine.result(t), expected[max(0, t - 1), t])
        gen, gen_here = torch.Generator().manual_seed(5), torch.Generator().manual_seed(5)
        ro = engine.generate(PROMPTS, 3, generator=gen)
        here = HFRollout(model, tok, **OPTIONS).generate(PROMPTS, 3, generator=gen_here)
        _assert_same(ro, here)
        assert torch.equal(gen.get_state(), gen_here.get_state())


def _gone(pid: int, within_s: float = 10.0) -> bool:
    """Whether process ``pid`` has exited within ``within_s`` (a zombie not yet reaped by its parent counts)."""
    deadline = time.monotonic() + within_s
    while True:
        try:
            with open(f"/proc/{pid}/stat") as f:
                if f.read().rsplit(")", 1)[-1].split()[0] == "Z":
                    return True
        except (FileNotFoundError, ProcessLookupError):
            return True
        if time.monotonic() > deadline:
            return False
        time.sleep(0.1)


@pytest.mark.slow
def test_hung_worker_is_reported_and_stopped(versions):
    states, _ = versions
    model, _ = load_model_and_tokenizer("tiny", seed=0)
    engine = AsyncRollout(FACTORY, model, staleness=0, timeout_s=2.0, **OPTIONS)
    engine.generate(PROMPTS, 1, seed=0)  # started and answering
    pid = engine.pid
    os.kill(pid, signal.SIGSTOP)  # a hung worker: alive, silent
    engine.submit(0, PROMPTS, G, seed=0)
    t0 = time.monotonic()
    with pytest.raises(RunError, match=rf"pid {pid}\) is hung: no message for .* timeout_s=2"):
        engine.result(0)
    assert time.monotonic() - t0 < 30
    assert _gone(pid)
    with pytest.raises(RunError, match="closed"):
        engine.submit(1, PROMPTS, G)
    engine.close()  # idempotent


def test_bad_requests_and_a_worker_that_cannot_start():
    model, _ = load_model_and_tokenizer("tiny", seed=0)
    with pytest.raises(ValueError, match="staleness=-1"):
        AsyncRollout(FACTORY, model, staleness=-1)
    wide = functools.partial(load_model_and_tokenizer, "tiny-wide")
    engine = AsyncRollout(wide, model, staleness=1, **OPTIONS)
    pid = engine.pid
    with pytest.raises(ValueError, match="step 3 was not submitted"):
        engine.result(3)
    engine.submit(2, PROMPTS, G)
    with pytest.raises(ValueError, match="served in order"):
        engine.submit(0, PROMPTS, G)
    with pytest.raises(ValueError, match="push the weights of the steps before it first"):
        engine.result(2)  # needs version 1, only 0 is pushed: waiting would never end
    with pytest.raises(ValueError, match="another model"):
        engine.push_weights(load_model_and_tokenizer("tiny-wide")[0])
    engine.push_weights(model)
    with pytest.raises(RunError, match=r"(?s)could not start.*does not match the pushed one: model.embed_tokens.weight is \[100, 128\]"):
        engine.result(2)
    assert _gone(pid)


_SCRIPT = textwrap.dedent("""
    import functools, signal, sys, time
    # Ctrl-C as in a terminal, whatever this pytest worker passed down (an ignored or blocked SIGINT is inherited
    # through exec); what was inherited goes to stderr, which the test prints if the process does not exit
    print("inherited SIGINT:", signal.getsignal(signal.SIGINT), signal.pthread_sigmask(signal.SIG_BLOCK, []),
          file=sys.stderr, flush=True)
    signal.signal(signal.SIGINT, signal.default_int_handler)
    signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGINT})
    import torch
    torch.set_num_threads(1)
    from lmpo.generation.worker import AsyncRollout
    from lmpo.models import load_model_and_tokenizer
    model, _ = load_model_and_tokenizer("tiny", seed=0)
    engine = AsyncRollout(functools.partial(load_model_and_tokenizer, "tiny"), model, max_new_tokens=4)
    engine.generate(["1+1="], 1, seed=0)
    print(engine.pid, flush=True)
    time.sleep(600)
""")


@pytest.mark.slow  # ~10-30 s each
@pytest.mark.parametrize("how", ["sigint", "sigkill"])
def test_no_orphaned_worker(how, tmp_path):
    """Ctrl-C in the main process (KeyboardInterrupt, then the exit handler closes the engine), or the main
    process SIGKILLed (nothing of it runs; the worker sees its request pipe close): the worker goes."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([os.path.abspath("src"), os.environ.get("PYTHONPATH", "")])}
    # stderr to a file, not a pipe nobody reads: the traceback of the KeyboardInterrupt and whatever the worker
    # (which shares it) writes must never block either process on a full pipe
    log = tmp_path / "stderr.log"
    with open(log, "w") as err:
        proc = subprocess.Popen([sys.executable, "-c", _SCRIPT], stdout=subprocess.PIPE, stderr=err, text=True,
                                env=env)
    try:
        pid = int(proc.stdout.readline())
        assert not _gone(pid, within_s=0.2)
        proc.send_signal(signal.SIGINT if how == "sigint" else signal.SIGKILL)
        try:
            proc.wait(120)  # a generous limit: on a loaded 2-core machine the exit handler's steps take seconds
        except subprocess.TimeoutExpired:
            raise AssertionError(f"the main process did not exit; its stderr:\n{log.read_text()[-3000:]}") from None
        assert _gone(pid, within_s=30), log.read_text()[-3000:]
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def test_push_carries_tied_weights_once():
    model, _ = load_model_and_tokenizer("tiny", seed=0)
    names = [n for n, _ in model_tensors(model)]
    assert "lm_head.weight" not in names and "model.embed_tokens.weight" in names  # tied: one tensor
    assert len(names) == len({id(p) for p in model.parameters()})


@pytest.mark.slow  # 20 worker restarts: ~1-2 min on 2 shared cores
def test_twenty_seeded_kills_change_nothing():
    """A thread SIGKILLs the worker 20 times at seeded random delays (so inside generation, inside a weight load,
    while a push waits, during start-up: wherever it falls); every step still equals the in-process generation
    on weights version t − 1."""
    import random
    import threading

    model, tok = load_model_and_tokenizer("tiny", seed=0)
    states = [{k: t.clone() for k, t in model.state_dict().items()}]
    kills, rng, done = [], random.Random(0), threading.Event()
    out = []
    with AsyncRollout(FACTORY, model, staleness=1, max_restarts=100, log=lambda m: None, **OPTIONS) as engine:

        def killer():
            while len(kills) < 20 and not done.is_set():
                time.sleep(rng.uniform(0.05, 1.0))  # a worker starts and generates a step well within 1 s
                try:
                    pid = engine.pid
                except ValueError:  # between two workers
                    continue
                if pid is not None and pid not in kills:  # once per worker
                    os.kill(pid, signal.SIGKILL)
                    kills.append(pid)

        thread = threading.Thread(target=killer, daemon=True)
        thread.start()
        t = 0
        try:
            while thread.is_alive() or t < 4:
                out.append(engine.rollout_for(t, lambda s: (_prompts(s), G, _seed(s))))
                _perturb(model, t + 1)
                states.append({k: v.clone() for k, v in model.state_dict().items()})
                engine.push_weights(model)
                t += 1
        finally:
            done.set()
            thread.join()
        assert len(kills) == 20 and engine.restarts >= 19  # (the last kill may land after the last request)
    engine_here = HFRollout(model, tok, **OPTIONS)
    for step, ro in enumerate(out):
        model.load_state_dict(states[max(0, step - 1)])
        _assert_same(ro, engine_here.generate(_prompts(step), G, seed=_seed(step)))


def test_start_methods():
    from lmpo.generation import worker

    assert worker.START_METHOD == "forkserver"  # this suite's (tests/conftest.py); programs get "spawn"
    assert worker.worker_context("spawn").get_start_method() == "spawn"
    with pytest.raises(ValueError, match="START_METHOD='fork' must be 'spawn' or 'forkserver'"):
        worker.worker_context("fork")
