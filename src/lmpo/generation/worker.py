"""``AsyncRollout``: generation in a worker process, overlapped with training, on weights at most k steps old.

One worker process (``torch.multiprocessing``, spawn) builds its own copy of the policy from a picklable model
factory, runs an ``HFRollout`` on it with its own torch threads, and answers generation requests in order::

    main process                                    worker process
      push_weights(model)  ── shared memory ──▶       weights of version v, copied in before a request needs them
      submit(step, prompts) ── request pipe ──▶       waits for version max(0, step − k), generates
      result(step)         ◀── result pipe ──         the Rollout (log-probs recorded by the worker)

Weights travel through shared memory, never a file: ``slots`` copies of the model's tensors, one flat buffer
per dtype each, written in place; version v goes to slot ``v % slots``. Each slot carries the version it holds
(−1 while it is being written), so the worker reads a version only once it is complete and checks after the
copy that it was not overwritten meanwhile. A push never overwrites a version that an unfinished request still
needs: it first waits for those results.

The schedule, not the timing, decides which weights a request sees: version v is the weights after v pushes
(version 0: the model given to the constructor), and step t's request is generated with version
``max(0, t − staleness)``, exactly. Whatever the two processes' speeds, the same seeds and pushes give the same
rollouts; with staleness 0 a request is generated after the push of its step's weights and equals
``HFRollout``'s in-process output bit for bit.

Episodes: given an ``EpisodeSpec`` (a registered environment, its options and the modules that register it, the
episode budgets, the sampler's settings), the worker builds the environment and an ``EpisodeRunner`` itself and
answers ``submit_episodes(step, examples, G, seed)`` with the played episodes (``lmpo.generation.episodes``): the
same schedule, the same faults, the environment's tools (a sandbox's processes included) in the worker process.

Faults: a worker that dies is started again (with a message) on the versions held in shared memory, and the
unfinished requests are sent to it again, so the results are those of an uninterrupted run; a worker that sends
nothing for ``timeout_s`` is reported as hung (``RunError``). ``close()`` (also on leaving a ``with`` block, at
interpreter exit and on Ctrl-C) stops the worker; the worker ignores SIGINT (the main process decides) and exits
by itself when the main process goes away.
"""

from __future__ import annotations

import atexit
import os
import signal
import sys
import threading
import time
import traceback
import weakref
from collections import OrderedDict
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch
import torch.multiprocessing as mp
from torch import nn

from lmpo.envs.base import EpisodeBudget
from lmpo.errors import InputError, LmpoError, RunError
from lmpo.generation.rollout import Rollout

# Seconds between two looks at the result pipe and at the worker's liveness while waiting.
_POLL_S = 0.02
# Seconds a stopping worker gets to leave by itself before it is terminated, then killed.
_STOP_GRACE_S = 5.0


def model_tensors(model: nn.Module) -> list[tuple[str, torch.Tensor]]:
    """The tensors a push carries: the parameters and persistent buffers of ``model``'s state dict, each once
    (tied weights are one tensor), in state-dict order. Non-persistent buffers (rotary frequencies) are rebuilt by
    the worker's own model."""
    seen: set[int] = set()
    out = []
    for name, tensor in model.state_dict(keep_vars=True).items():
        if id(tensor) in seen:
            continue
        seen.add(id(tensor))
        out.append((name, tensor))
    return out


@dataclass(frozen=True)
class _Layout:
    """Where each pushed tensor lives in a slot: its dtype's flat buffer and an offset in it."""

    names: tuple[str, ...]
    shapes: tuple[tuple[int, ...], ...]
    dtypes: tuple[torch.dtype, ...]
    offsets: tuple[int, ...]
    sizes: dict[torch.dtype, int]

    @classmethod
    def of(cls, tensors: Sequence[tuple[str, torch.Tensor]]) -> _Layout:
        sizes: dict[torch.dtype, int] = {}
        offsets = []
        for _, t in tensors:
            offsets.append(sizes.get(t.dtype, 0))
            sizes[t.dtype] = sizes.get(t.dtype, 0) + t.numel()
        return cls(names=tuple(n for n, _ in tensors), shapes=tuple(tuple(t.shape) for _, t in tensors),
                   dtypes=tuple(t.dtype for _, t in tensors), offsets=tuple(offsets), sizes=sizes)

    def mismatch(self, other: _Layout, mine: str, theirs: str) -> str | None:
        """A sentence naming the first difference between two layouts (this one of ``mine``, the other of
        ``theirs``), or None when they agree."""
        if self.names != other.names:
            diff = sorted(set(self.names) ^ set(other.names))[:5] or "(same names, other order)"
            return f"the tensors differ ({len(self.names)} vs {len(other.names)}; e.g. {diff})"
        for name, a, b, da, db in zip(self.names, self.shapes, other.shapes, self.dtypes, other.dtypes):
            if a != b or da != db:
                return f"{name} is {list(a)} {da} in {mine} and {list(b)} {db} in {theirs}"
        return None

    def views(self, flat: dict[torch.dtype, torch.Tensor]) -> list[torch.Tensor]:
        return [flat[d][o:o + int(np.prod(s, dtype=np.int64))].view(s)
                for s, d, o in zip(self.shapes, self.dtypes, self.offsets)]


def _pack(ro: Rollout) -> dict[str, Any]:
    """A rollout as plain arrays and strings: pickled by value through the pipe (no shared-memory handles that
    would die with a killed worker)."""
    out: dict[str, Any] = {"prompts": list(ro.prompts), "completions": list(ro.completions)}
    for name in ("prompt_ids", "prompt_mask", "completion_ids", "completion_mask", "group_ids", "truncated",
                 "logprobs"):
        value = getattr(ro, name)
        out[name] = None if value is None else value.detach().cpu().numpy()
    return out


def _unpack(packed: dict[str, Any]) -> Rollout:
    arrays = {k: None if v is None else torch.from_numpy(v) for k, v in packed.items()
              if k not in ("prompts", "completions")}
    return Rollout(prompts=packed["prompts"], completions=packed["completions"], **arrays)


@dataclass(frozen=True)
class EpisodeSpec:
    """What a worker needs to play a run's episodes itself (picklable; built in the training process).

    env_id, env_options: the registered environment and its constructor options (one fresh environment per
        episode, as ``make_env(env_id, **env_options)``).
    imports: modules or ``.py`` files (absolute paths: the worker may start elsewhere) imported first, which
        register ``env_id`` (``lmpo.envs.plugins.import_env_modules``; a training config's ``env.import``).
    sandbox_require: the weakest sandbox mode the environment's tools may run model-written code in (a config's
        ``env.sandbox.require``), checked when the worker starts.
    budget, chat_template, on_env_error, step_timeout_s: the ``EpisodeRunner``'s.
    tokenizer_chat_template: the template the training process's tokenizer carries (set on the worker's, whose
        factory may build one without it, such as a built-in preset's), or None to keep the worker's own.
    temperature, top_p, top_k: the ``HFTurnSampler``'s.
    """

    env_id: str
    env_options: dict = field(default_factory=dict)
    imports: tuple[str, ...] = ()
    sandbox_require: str | None = None
    budget: EpisodeBudget = field(default_factory=EpisodeBudget)
    chat_template: str | None = None
    tokenizer_chat_template: str | None = None
    on_env_error: str = "raise"
    step_timeout_s: float | None = None
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0

    def runner(self, model: nn.Module, tokenizer):
        """The ``EpisodeRunner`` of this spec over ``model``, after the imports and the sandbox check (what the
        worker plays with; the same runner the training process would build)."""
        from lmpo.envs.base import is_registered
        from lmpo.envs.plugins import import_env_modules
        from lmpo.envs.tools.sandbox import set_default_require
        from lmpo.generation.episodes import EpisodeRunner, HFTurnSampler

        if self.sandbox_require is not None:
            set_default_require(self.sandbox_require, key="env.sandbox.require")
        import_env_modules(self.imports)
        if not is_registered(self.env_id):
            raise InputError(f"`env.id` = {self.env_id!r} is not registered in the rollout worker "
                             "(`rollout.async_staleness`): the training process registered it by code the worker "
                             "does not run (a notebook cell, a function called before training). Put the "
                             "environment's class in a module or a .py file and name it in `env.import`, or use "
                             "rollout.async_staleness: 0.")
        if self.tokenizer_chat_template is not None:
            tokenizer.chat_template = self.tokenizer_chat_template
        sampler = HFTurnSampler(model, tokenizer, temperature=self.temperature, top_p=self.top_p, top_k=self.top_k)
        return EpisodeRunner(sampler, tokenizer, self.budget, chat_template=self.chat_template,
                             on_env_error=self.on_env_error, step_timeout_s=self.step_timeout_s)

    def env_factory(self):
        """A fresh environment per call."""
        from lmpo.envs import make_env

        return lambda: make_env(self.env_id, **self.env_options)


def _raised(e: BaseException) -> LmpoError | None:
    """An lmpo error raised in the worker, to raise again as it is in the training process (its message names the
    input and the fix), or None when it does not travel (another kind, or one that does not pickle)."""
    import pickle

    if not isinstance(e, LmpoError):
        return None
    try:
        return pickle.loads(pickle.dumps(e))
    except Exception:  # noqa: BLE001 - an exception with arguments of its own: reported as a traceback instead
        return None


class _MainGone(Exception):
    """The main process went away: the worker leaves."""


def _leave_with(parent) -> None:
    """Exit this (worker) process as soon as ``parent`` dies, whatever the worker is doing: a long environment
    call or generation would otherwise keep it alive, and with it the processes its tools started (a sandbox's
    jail dies with the thread that started it, by its parent-death signal)."""
    from multiprocessing.connection import wait

    wait([parent.sentinel])
    os._exit(0)


def _worker_main(model_factory, engine_options: dict, device: str, threads: int, layout: _Layout,
                 slots: list[dict[torch.dtype, torch.Tensor]], slot_versions, requests, results,
                 episodes: EpisodeSpec | None = None) -> None:
    """The worker process: build the model, then answer requests in order until told to stop or orphaned."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C reaches the whole process group: the main decides
    torch.set_num_threads(threads)
    parent = mp.parent_process()
    if parent is not None:
        threading.Thread(target=_leave_with, args=(parent,), name="lmpo-worker-watchdog", daemon=True).start()
    try:
        from lmpo.generation.hf import HFRollout

        built = model_factory()
        model, tokenizer = built if isinstance(built, tuple) else (built, None)
        if tokenizer is None:
            raise TypeError(f"the model factory {model_factory!r} returned no tokenizer; it must return "
                            "(model, tokenizer)")
        model = model.to(device)
        params = [t.data for _, t in model_tensors(model)]
        mismatch = layout.mismatch(_Layout.of(model_tensors(model)), "the pushed model", "the worker's")
        if mismatch is not None:
            raise ValueError(f"the worker's model does not match the pushed one: {mismatch}; the model factory must "
                             "build the same architecture and dtype as the training model")
        engine = HFRollout(model, tokenizer, **engine_options)
        runner = None if episodes is None else episodes.runner(model, tokenizer)
        env_factory = None if episodes is None else episodes.env_factory()
        views = [layout.views(slot) for slot in slots]
        results.send(("ready", os.getpid()))
    except Exception as e:
        results.send(("failed", None, traceback.format_exc(), _raised(e)))
        return

    def load(version: int) -> None:
        slot = version % len(slots)
        wait = 0.0005
        while slot_versions[slot] < version:  # not pushed yet: the schedule, not the timing, decides
            if parent is not None and not parent.is_alive():
                raise _MainGone
            time.sleep(wait)
            wait = min(2 * wait, 0.01)
        if slot_versions[slot] != version:
            raise RuntimeError(f"weights version {version} was overwritten by {slot_versions[slot]} before the worker "
                               "read it")
        with torch.no_grad():
            for p, v in zip(params, views[slot]):
                p.copy_(v)
        if slot_versions[slot] != version:
            raise RuntimeError(f"weights version {version} was overwritten while the worker read it")

    loaded = None
    while True:
        try:
            message = requests.recv()
        except (EOFError, OSError):  # the main process closed the pipe or died
            return
        if message[0] == "stop":
            return
        kind, rid, version = message[:3]
        try:
            if version != loaded:
                loaded = None
                load(version)
                loaded = version
            if kind == "play":  # episodes, seeded as the in-process runner is (torch.Generator on the device)
                _, _, _, examples, completions_per_example, seed, generator_seed = message
                played = runner.run(env_factory, examples, completions_per_example, seed=seed,
                                    generator=torch.Generator(device).manual_seed(generator_seed))
                reply = ("result", rid, {"episodes": played}, None)
            else:
                _, _, _, prompts, completions_per_prompt, seed, generator_state, greedy = message
                generator = None
                if generator_state is not None:
                    generator = torch.Generator()
                    generator.set_state(torch.from_numpy(generator_state))
                ro = engine.generate(prompts, completions_per_prompt, seed=seed, generator=generator, greedy=greedy)
                reply = ("result", rid, _pack(ro), None if generator is None else generator.get_state().numpy())
        except _MainGone:
            return
        except Exception as e:
            reply = ("error", rid, traceback.format_exc(), _raised(e))
        try:
            results.send(reply)
        except (BrokenPipeError, OSError):
            return


@dataclass
class _Request:
    rid: int
    step: int | None
    version: int
    prompts: list  # prompts (text); for episodes, the examples
    completions_per_prompt: int
    seed: int | None
    generator_state: np.ndarray | None  # a CPU generator's state, by value
    greedy: bool
    generator_seed: int | None = None  # episodes: the seed of the runner's torch.Generator

    def message(self) -> tuple:
        if self.generator_seed is not None:
            return ("play", self.rid, self.version, self.prompts, self.completions_per_prompt, self.seed,
                    self.generator_seed)
        return ("gen", self.rid, self.version, self.prompts, self.completions_per_prompt, self.seed,
                self.generator_state, self.greedy)


def _close_if_alive(ref: weakref.ref) -> None:
    engine = ref()
    if engine is not None:
        engine.close()


#: How worker processes start: ``"spawn"`` (a fresh interpreter that imports torch and transformers, ~5 s of
#: CPU per start; nothing inherited) or ``"forkserver"`` (forked from a server process that imported this module
#: once, ~0.1 s per start; the server keeps the environment and ``sys.path`` of its first use, so it suits
#: programs that start many workers, such as a test suite). A program sets it before building an AsyncRollout.
START_METHOD = "spawn"


def worker_context(method: str):
    """The ``torch.multiprocessing`` context of ``method`` (``"spawn"`` or ``"forkserver"``)."""
    if method not in ("spawn", "forkserver"):
        raise ValueError(f"START_METHOD={method!r} must be 'spawn' or 'forkserver' (a forked worker would "
                         "inherit the parent's torch threads and locks)")
    ctx = mp.get_context(method)
    if method == "forkserver":
        ctx.set_forkserver_preload([__name__, "lmpo.generation.hf", "lmpo.models"])  # what each worker imports
    return ctx


class AsyncRollout:
    """An ``HFRollout`` in a worker process, fed weights through shared memory, ``staleness`` steps behind.

    Args:
        model_factory: a picklable callable run in the worker that returns ``(model, tokenizer)`` with the
            training model's architecture and dtype, e.g. ``functools.partial(load_model_and_tokenizer, "tiny")``.
            Its weights are replaced by the pushed ones before any request, so it may initialise them at random.
        model: the training model; its weights now are version 0 (pushed here).
        staleness: k ≥ 0. Step t's request is generated with weights version ``max(0, t − k)``.
        device: where the worker generates ("cpu", "cuda", ...).
        threads: the worker's torch threads.
        slots: weight versions held in shared memory (default k + 1: every version a k-step schedule still needs).
        queue_size: requests submitted and not yet collected, at most (default k + 2: the prefetched steps and one
            ``generate`` call).
        timeout_s: seconds without any message from a busy worker after which it is reported hung.
        start_timeout_s: seconds a (re)started worker may take to build its model.
        max_restarts: worker deaths survived in all; one more is a ``RunError``.
        log: where the restart messages go (default: standard error).
        initial_weights: version 0's tensors (name → tensor, ``model_tensors`` names) instead of ``model``'s own,
            e.g. an older version kept by a checkpoint, so that a resumed schedule goes on where it stopped.
        episodes: an ``EpisodeSpec``: the worker also builds that environment and an episode runner, and plays
            the episodes of ``submit_episodes`` requests (see ``episodes_for``).
        engine_options: ``HFRollout`` keywords (``max_new_tokens``, ``temperature``, ``top_p``, ``top_k``,
            ``ignore_eos``, ``record_logprobs``, ``impl``, ...).

    Use::

        with AsyncRollout(factory, model, staleness=1, max_new_tokens=64, record_logprobs=True) as engine:
            for t in range(k + 1):
                engine.submit(t, prompts_of(t), G, seed=seed_of(t))
            for t in range(steps):
                ro = engine.result(t)                 # generated with weights version max(0, t − k)
                train_step(model, ro)
                engine.push_weights(model)            # version t + 1
                engine.submit(t + 1 + k, prompts_of(t + 1 + k), G, seed=seed_of(t + 1 + k))

    or, the same schedule with the submissions done for you::

            for t in range(steps):
                ro = engine.rollout_for(t, lambda s: (prompts_of(s), G, seed_of(s)), last_step=steps - 1)
                train_step(model, ro)
                engine.push_weights(model)

    Not thread-safe: one thread drives an engine.
    """

    def __init__(self, model_factory: Callable[[], tuple[nn.Module, Any]], model: nn.Module, *, staleness: int = 0,
                 device: str | torch.device = "cpu", threads: int = 1, slots: int | None = None,
                 queue_size: int | None = None, timeout_s: float = 600.0, start_timeout_s: float = 600.0,
                 max_restarts: int = 3, log: Callable[[str], None] | None = None,
                 initial_weights: Mapping[str, torch.Tensor] | None = None, episodes: EpisodeSpec | None = None,
                 **engine_options: Any) -> None:
        if staleness < 0:
            raise ValueError(f"staleness={staleness} must be >= 0 (0 = synchronous)")
        if threads < 1:
            raise ValueError(f"threads={threads} must be >= 1")
        slots = staleness + 1 if slots is None else slots
        if slots < 1:
            raise ValueError(f"slots={slots} must be >= 1")
        queue_size = staleness + 2 if queue_size is None else queue_size
        if queue_size < 1:
            raise ValueError(f"queue_size={queue_size} must be >= 1")
        if timeout_s <= 0 or start_timeout_s <= 0:
            raise ValueError(f"timeout_s={timeout_s} and start_timeout_s={start_timeout_s} must be > 0")
        self.staleness, self.queue_size, self.timeout_s, self.start_timeout_s = (staleness, queue_size, timeout_s,
                                                                                 start_timeout_s)
        self.max_restarts = max_restarts
        self.device, self.threads = str(device), threads
        self.engine_options = dict(engine_options)
        self.record_logprobs = bool(engine_options.get("record_logprobs", False))
        self.model_factory = model_factory
        self.episodes = episodes
        self._log = log or (lambda msg: print(msg, file=sys.stderr, flush=True))
        self._layout = _Layout.of(model_tensors(model))
        self._ctx = worker_context(START_METHOD)
        self._slots = [{d: torch.zeros(n, dtype=d).share_memory_() for d, n in self._layout.sizes.items()}
                       for _ in range(slots)]
        self._slot_views = [self._layout.views(slot) for slot in self._slots]
        self._slot_versions = self._ctx.RawArray("q", [-1] * slots)
        #: the newest pushed weights version (the number of pushes after the constructor's)
        self.version = -1
        #: how many times a dead worker was started again
        self.restarts = 0
        #: seconds this process has spent waiting for the worker (results, and pushes that waited): the part of
        #: generation that training did not hide
        self.wait_s = 0.0
        self._next_rid = 0
        self._unfinished: OrderedDict[int, _Request] = OrderedDict()  # sent, no result received yet
        self._received: dict[int, tuple] = {}  # result received, not collected yet
        self._step_rid: dict[int, int] = {}
        self._last_version_asked = 0
        self._last_step_submitted = -1
        self._process = None
        self._closed = False
        self.push_weights(model if initial_weights is None else initial_weights)
        self._start()
        self._atexit = lambda ref=weakref.ref(self): _close_if_alive(ref)
        atexit.register(self._atexit)

    # ------------------------------------------------------------------ process
    @property
    def pid(self) -> int | None:
        """The current worker's process id."""
        return None if self._process is None else self._process.pid

    def _start(self) -> None:
        requests_read, self._requests = self._ctx.Pipe(duplex=False)
        self._results, results_write = self._ctx.Pipe(duplex=False)
        self._process = self._ctx.Process(
            target=_worker_main, name="lmpo-rollout-worker", daemon=True,
            args=(self.model_factory, self.engine_options, self.device, self.threads, self._layout, self._slots,
                  self._slot_versions, requests_read, results_write, self.episodes))
        self._process.start()
        # the worker holds the other ends now: a worker that dies closes them, and a read then ends in EOF
        requests_read.close()
        results_write.close()
        self._ready = False
        self._started_at = time.monotonic()
        for request in self._unfinished.values():
            self._send(request)

    def _send(self, request: _Request) -> None:
        try:
            self._requests.send(request.message())
        except (BrokenPipeError, OSError):
            pass  # a dead worker: found by the next wait, which restarts it and sends the request again

    def _stop_process(self) -> None:
        proc = self._process
        if proc is None:
            return
        if proc.is_alive():
            try:
                self._requests.send(("stop",))
            except (BrokenPipeError, OSError):
                pass
            proc.join(_STOP_GRACE_S)
        if proc.is_alive():
            proc.terminate()
            proc.join(_STOP_GRACE_S)
        if proc.is_alive():
            proc.kill()
            proc.join()
        for conn in (self._requests, self._results):
            conn.close()
        proc.close()
        self._process = None

    def _restart(self, why: str) -> None:
        old = self.pid
        self._stop_process()
        if self.restarts >= self.max_restarts:
            self._closed = True
            raise RunError(f"the rollout worker (pid {old}) {why}, and it has already been restarted "
                           f"{self.restarts} times (max_restarts={self.max_restarts}); see the messages above for "
                           "the cause (out of memory kills show in `dmesg`)")
        self.restarts += 1
        self._start()
        self._log(f"rollout worker (pid {old}) {why}; restarted as pid {self.pid} from weights version "
                  f"{self.version} held in shared memory, {len(self._unfinished)} unfinished request(s) sent again "
                  f"(restart {self.restarts} of at most {self.max_restarts})")

    def close(self) -> None:
        """Stop the worker (asked first, terminated after a few seconds); idempotent."""
        if self._closed and self._process is None:
            return
        self._closed = True
        atexit.unregister(self._atexit)
        self._stop_process()

    def __enter__(self) -> AsyncRollout:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def _check_open(self) -> None:
        if self._closed:
            raise RunError("this AsyncRollout is closed (its worker was stopped); create a new one")

    # ------------------------------------------------------------------ messages
    def _poll(self, deadline_from: float) -> bool:
        """Handle the worker's next message if one comes within ``_POLL_S``; restart a dead worker; raise when it
        has been silent past its timeout. Returns whether anything happened."""
        try:
            if self._results.poll(_POLL_S):
                message = self._results.recv()
            else:
                message = None
        except (EOFError, OSError):
            message = None
            if self._process.is_alive():  # the pipe closes with the worker: give the exit a moment to show
                self._process.join(1.0)
        if message is None:
            if not self._process.is_alive():
                code = self._process.exitcode
                how = (f"was killed by signal {-code}" if code is not None and code < 0 else f"exited with code {code}")
                self._restart(how)
                return True
            if not self._ready:
                silent, limit, what = time.monotonic() - self._started_at, self.start_timeout_s, "start_timeout_s"
            else:
                silent, limit, what = time.monotonic() - deadline_from, self.timeout_s, "timeout_s"
            if silent > limit:
                pid = self.pid
                self.close()
                raise RunError(f"the rollout worker (pid {pid}) is hung: no message for {silent:.1f} s (limit "
                               f"{what}={limit:g} s) while {len(self._unfinished)} request(s) were waiting; it was "
                               f"stopped. A slow but healthy generation needs a larger {what}.")
            return False
        kind = message[0]
        if kind == "ready":
            self._ready = True
        elif kind == "failed":
            self.close()
            if message[3] is not None:  # an lmpo error (a user's environment module, the sandbox floor): as it is
                raise message[3]
            raise RunError(f"the rollout worker could not start:\n{message[2]}")
        elif kind == "result":
            _, rid, packed, generator_state = message
            self._unfinished.pop(rid, None)
            self._received[rid] = (packed, generator_state)
        elif kind == "error":
            _, rid, trace, raised = message
            self._unfinished.pop(rid, None)
            # an lmpo error (an environment that failed: EnvError names it, the turn and the key) is raised as it is
            error = raised if raised is not None else RunError(f"the rollout worker failed on a request:\n{trace}")
            self._received[rid] = (error, None)
        return True

    def _wait(self, done: Callable[[], bool]) -> None:
        start = last = time.monotonic()
        try:
            while not done():
                if self._poll(last):
                    last = time.monotonic()
        finally:
            self.wait_s += time.monotonic() - start

    # ------------------------------------------------------------------ weights
    def push_weights(self, model: nn.Module | Mapping[str, torch.Tensor]) -> int:
        """Write ``model``'s weights (or a mapping name → tensor with ``model_tensors``' names, such as
        ``held_weights`` returned) into shared memory as the next version; returns that version.

        Call it once after each step's optimizer steps. It waits (taking the worker's results as they come) only
        when the slot it writes still holds a version that an unfinished request needs.
        """
        self._check_open()
        if isinstance(model, nn.Module):
            tensors = model_tensors(model)
        else:
            missing = sorted(set(self._layout.names) ^ set(model))[:5]
            if missing:
                raise ValueError(f"push_weights got a mapping whose names differ from the model's (e.g. {missing})")
            tensors = [(name, model[name]) for name in self._layout.names]
        layout = _Layout.of(tensors)
        mismatch = self._layout.mismatch(layout, "the first pushed model", "this one")
        if mismatch is not None:
            raise ValueError(f"push_weights got another model than the one this AsyncRollout was built for: "
                             f"{mismatch}")
        version = self.version + 1
        slot = version % len(self._slots)
        evicted = version - len(self._slots)
        if evicted >= 0:
            self._wait(lambda: all(r.version > evicted for r in self._unfinished.values()))
        self._slot_versions[slot] = -1  # being written: the worker waits
        with torch.no_grad():
            for dst, (_, src) in zip(self._slot_views[slot], tensors):
                dst.copy_(src.detach())
        self._slot_versions[slot] = version
        self.version = version
        return version

    def held_weights(self, version: int) -> dict[str, torch.Tensor]:
        """A copy of weights version ``version`` as held in shared memory (name → CPU tensor); one of the last
        ``slots`` versions pushed. A checkpoint keeps these to resume a schedule that still needs them."""
        self._check_open()
        slot = version % len(self._slots)
        if version < 0 or version > self.version or self._slot_versions[slot] != version:
            raise ValueError(f"weights version {version} is not held (newest {self.version}, "
                             f"slots={len(self._slots)})")
        return {name: view.clone() for name, view in zip(self._layout.names, self._slot_views[slot])}

    def sync_weights(self, model: nn.Module) -> None:
        """``RolloutEngine``'s name for ``push_weights``."""
        self.push_weights(model)

    # ------------------------------------------------------------------ requests
    def version_for(self, step: int) -> int:
        """The weights version step ``step``'s request is generated with: ``max(0, step − staleness)``."""
        return max(0, step - self.staleness)

    def _enqueue(self, step: int | None, version: int, prompts: Sequence, completions_per_prompt: int,
                 seed: int | None, generator: torch.Generator | None, greedy: bool,
                 generator_seed: int | None = None) -> int:
        self._check_open()
        if completions_per_prompt < 1:
            raise ValueError(f"completions_per_prompt={completions_per_prompt} must be >= 1")
        if not prompts:
            raise ValueError("generate() needs at least one prompt")
        if generator is not None and (generator.device.type != "cpu" or self.device != "cpu"):
            raise ValueError(f"AsyncRollout takes a generator only for a CPU worker, as a CPU generator (its state "
                             f"travels to the worker); got one on {generator.device} for a worker on {self.device}; "
                             "pass seed= instead")
        what = "a generate() call" if step is None else f"step {step}"
        oldest = self.version - len(self._slots) + 1
        if version < oldest:
            raise ValueError(f"{what} needs weights version {version}, but versions before {oldest} are no "
                             f"longer held (newest {self.version}, slots={len(self._slots)}); submit step t before "
                             f"pushing version t - staleness + 1 (prefetch), or give more slots")
        if version < self._last_version_asked:
            raise ValueError(f"requests are served in order: {what} needs weights version {version}, older "
                             f"than the version {self._last_version_asked} an earlier request waits for; submit "
                             "steps in increasing order")
        if len(self._unfinished) + len(self._received) >= self.queue_size:
            raise ValueError(f"{self.queue_size} requests are already submitted and not collected (queue_size); "
                             "collect results with result(step) before submitting more")
        request = _Request(rid=self._next_rid, step=step, version=version, prompts=list(prompts),
                           completions_per_prompt=completions_per_prompt, seed=seed,
                           generator_state=None if generator is None else generator.get_state().numpy(),
                           greedy=greedy, generator_seed=generator_seed)
        self._next_rid += 1
        self._last_version_asked = version
        self._unfinished[request.rid] = request
        self._send(request)
        return request.rid

    def submit(self, step: int, prompts: Sequence[str], completions_per_prompt: int = 1, seed: int | None = None,
               greedy: bool = False) -> None:
        """Ask for step ``step``'s rollout, generated with weights version ``max(0, step − staleness)``.

        Returns at once; the worker generates as soon as that version is pushed. Steps are submitted in
        increasing order, each once.
        """
        if step < 0:
            raise ValueError(f"step={step} must be >= 0")
        if step in self._step_rid:
            raise ValueError(f"step {step} is already submitted and not collected")
        self._step_rid[step] = self._enqueue(step, self.version_for(step), prompts, completions_per_prompt, seed,
                                             None, greedy)
        self._last_step_submitted = max(self._last_step_submitted, step)

    def submit_episodes(self, step: int, examples: Sequence, completions_per_example: int, seed: int,
                        generator_seed: int) -> None:
        """Ask for step ``step``'s episodes: ``completions_per_example`` episodes of each example, played in the
        worker with weights version ``max(0, step − staleness)`` as ``EpisodeRunner.run(..., seed=seed,
        generator=torch.Generator(device).manual_seed(generator_seed))`` plays them in process; ``result(step)``
        is then the list of ``lmpo.generation.episodes.Episode``. Needs ``episodes=`` at construction."""
        if self.episodes is None:
            raise ValueError("submit_episodes needs an AsyncRollout built with episodes=EpisodeSpec(...)")
        if step < 0:
            raise ValueError(f"step={step} must be >= 0")
        if step in self._step_rid:
            raise ValueError(f"step {step} is already submitted and not collected")
        self._step_rid[step] = self._enqueue(step, self.version_for(step), list(examples), completions_per_example,
                                             seed, None, False, generator_seed=generator_seed)
        self._last_step_submitted = max(self._last_step_submitted, step)

    def result(self, step: int) -> Rollout | list:
        """Step ``step``'s rollout, or its episodes (``submit_episodes``): blocks until the worker has it; restarts a
        dead worker, raises on a hung one."""
        self._check_open()
        if step not in self._step_rid:
            raise ValueError(f"step {step} was not submitted (submitted and not collected: {sorted(self._step_rid)})")
        rid = self._step_rid[step]
        request = self._unfinished.get(rid)
        if request is not None and request.version > self.version:
            raise ValueError(f"step {step} waits for weights version {request.version}, but the newest pushed is "
                             f"{self.version}: push the weights of the steps before it first")
        self._wait(lambda: rid in self._received)
        del self._step_rid[step]
        return self._collect(rid, None)

    def rollout_for(self, step: int, request_of: Callable[[int], tuple[Sequence[str], int, int | None]],
                    last_step: int | None = None) -> Rollout:
        """Step ``step``'s rollout in a loop that pushes once per step: first submits every step up to
        ``step + staleness`` (at most ``last_step``) not submitted yet, asking ``request_of(s)`` for its
        ``(prompts, completions_per_prompt, seed)`` in increasing ``s``, then waits for ``step``'s result.

        Called at the start of each step, after the previous step's ``push_weights``, it keeps k steps generating
        ahead of training: ``request_of(s)`` runs k steps before step s trains.
        """
        return self._prefetched(step, request_of, last_step, lambda s, request: self.submit(s, *request))

    def episodes_for(self, step: int, request_of: Callable[[int], tuple[Sequence, int, int, int]],
                     last_step: int | None = None) -> list:
        """``rollout_for`` for episodes: ``request_of(s)`` gives ``(examples, completions_per_example, seed,
        generator_seed)`` (``submit_episodes``); returns step ``step``'s episodes."""
        return self._prefetched(step, request_of, last_step, lambda s, request: self.submit_episodes(s, *request))

    def _prefetched(self, step: int, request_of: Callable[[int], tuple], last_step: int | None,
                    submit: Callable[[int, tuple], None]):
        last = step + self.staleness if last_step is None else min(step + self.staleness, last_step)
        first = max(step, self._last_step_submitted + 1)
        for s in range(first, last + 1):
            submit(s, request_of(s))
        return self.result(step)

    def _collect(self, rid: int, generator: torch.Generator | None) -> Rollout | list:
        packed, generator_state = self._received.pop(rid)
        if isinstance(packed, Exception):
            raise packed
        if generator is not None:
            generator.set_state(torch.from_numpy(generator_state))
        return packed["episodes"] if "episodes" in packed else _unpack(packed)

    def generate(self, prompts: Sequence[str], completions_per_prompt: int = 1, seed: int | None = None,
                 generator: torch.Generator | None = None, greedy: bool = False) -> Rollout:
        """``RolloutEngine.generate``: one request on the newest pushed weights, waited for. A CPU ``generator`` is
        advanced as the in-process engine would advance it."""
        rid = self._enqueue(None, self.version, prompts, completions_per_prompt, seed, generator, greedy)
        self._wait(lambda: rid in self._received)
        return self._collect(rid, generator)
