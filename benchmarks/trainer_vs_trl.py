"""lmpo's Trainer against TRL's GRPOTrainer at equal settings, in one process, stepping in turn.

Both train the same freshly initialised Llama-style model (character tokenizer, same seed, same weights) on
the same addition prompts with the same exact-match reward, batch shape (``--prompts`` prompts × ``--group``
completions per step, one optimizer step per step, no gradient accumulation), learning rate, sampling
temperature, GRPO loss (``loss_type="grpo"`` / preset ``grpo``), ``beta=0`` (no reference model),
``num_iterations=1`` (on-policy) and number of steps. Every completion is exactly T tokens in both: TRL
through ``generation_kwargs={"min_new_tokens": T}`` with ``max_completion_length=T`` (EOS is suppressed until
T), lmpo through ``rollout.ignore_eos=true`` with ``max_new_tokens=T``.

Stepping in turn: each trainer runs in a thread of this one process and the two hand a baton back and forth
at every step boundary, so exactly one of them computes at any moment and step i of lmpo and step i of TRL
run back to back, under the same machine load. A step's time is from receiving the baton to passing it on
(everything the framework does per step: generation, scoring, log-probs, backward, optimizer, logging).
Step 1 (first-call warm-up) is dropped; the ratio reported per setting is the median over the remaining
steps of ``TRL step time / lmpo step time`` (= lmpo/TRL steps per second), with its interquartile range.
lmpo's phase shares split its step into generation (``rollout_engine.generate``), log-prob forward (the
trainer's log-prob forwards, with and without gradient) and update (the rest: scoring, backward, optimizer).

A generation-only check follows (``--gen-scaling``, on by default when no ``--lengths`` is given): lmpo's
rollout engine timed alone at 32 and 256 tokens per completion, median of a few calls; the target is a
growth of at most 9× for 8× the tokens.

    .venv/bin/python benchmarks/trainer_vs_trl.py                        # lengths 8 64 256 1024, two models
    .venv/bin/python benchmarks/trainer_vs_trl.py --lengths 256 --steps 4
    .venv/bin/python benchmarks/trainer_vs_trl.py --lengths 64 256 --steps 5 --warmup 2 --compile off on

Asynchronous rows (``--async-staleness 1 2``, the default; ``--async-staleness`` with no value for none): lmpo with
``rollout.async_staleness`` = k, its generation in a rollout worker process overlapped with training, joins the
same rotation — lmpo sync, lmpo async k = 1, lmpo async k = 2, TRL, one step each in turn. Same cores for all:
``--threads`` (default 2) torch threads for TRL and for lmpo sync, each one process; lmpo async splits them
between its two processes (``threads − threads // 2`` in training, ``threads // 2`` in the worker: 1 + 1 for 2).
The worker is stopped (SIGSTOP) whenever its trainer does not hold the baton and continued (SIGCONT) when it
gets it back, so that it never computes during another system's step; what it generates ahead is made inside
its own trainer's step times. The first k + 1 steps of an asynchronous run are warm-up (the worker starts and
fills its k-step lead): with async rows, ``max(--warmup, 1 + max k)`` steps are left out of every row.
Per setting and k the script prints ``async/sync`` (median over steps of lmpo sync step time / lmpo async step
time) and ``async/TRL`` (TRL step time / lmpo async step time), and whether the targets (≥ 1.7× lmpo sync,
≥ 2.0× TRL at 64 and 256 completion tokens) are met. ``--quick`` is a smoke run (tiny model, 8 tokens, 4
prompts × 2 completions, 5 steps, no generation check): it checks that every row runs, not the ratios.

``--compile off on`` runs every setting twice in the one process, lmpo with ``loop.compile`` off, then on
(TRL unchanged), so that the two ratios are measured under the same machine load; ``--warmup`` steps are left
out of each setting (a compiled run compiles in its first steps, again when a new shape arrives).

The last line is ``min ratio: X.XX``: without async rows the smallest per-setting median TRL/lmpo ratio of the
run; with async rows the smallest ``async/sync`` or ``async/TRL`` ratio over the settings and k, each divided by
its target (1.7 and 2.0), so that ``min ratio`` ≥ 1.00 means every target is met in this run.
"""

from __future__ import annotations

import argparse
import functools
import os
import signal
import statistics
import tempfile
import threading
import time

import torch

# model sizes: a built-in preset plus fields overridden (positions extended so that 1,024-token completions fit)
MODELS = {
    "tiny": {"preset": "tiny"},
    "tiny-wide": {"preset": "tiny-wide"},
    "small": {"preset": "tiny", "hidden_size": 512, "num_layers": 6, "num_heads": 8, "intermediate_size": 1536},
}
DEFAULT_STEPS = {8: 12, 64: 10, 256: 6, 1024: 4}


def build_model(name: str, seed: int = 0):
    from lmpo.models import load_tokenizer
    from lmpo.models.presets import build_tiny_model

    spec = dict(MODELS[name])
    preset = spec.pop("preset")
    tok = load_tokenizer("tiny")
    model = build_tiny_model(tok, preset=preset, seed=seed, max_position_embeddings=2048, **spec)
    return model, tok


def param_count(model) -> int:
    return sum(p.numel() for p in model.parameters())


def prompts(n: int) -> list[dict]:
    from lmpo.tasks import make_task

    task = make_task("addition", min_digits=1, max_digits=2)
    return [{"prompt": e.prompt, "answer": e.answer} for e in task.train_examples(seed=0)[:n]]


class Baton:
    """Parties take turns in a ring (first, second, ..., first, ...): a party computes only while it holds the
    baton; a finished party is skipped."""

    def __init__(self, first: str, second: str, *more: str) -> None:
        self.cond = threading.Condition()
        self.order = [first, second, *more]
        self.holder = first
        self.finished: set[str] = set()
        self.errors: list[BaseException] = []

    def _next(self, name: str) -> str:
        i = self.order.index(name)
        for j in range(1, len(self.order) + 1):
            nxt = self.order[(i + j) % len(self.order)]
            if nxt not in self.finished:
                return nxt
        return name

    def wait(self, name: str) -> float:
        with self.cond:
            self.cond.wait_for(lambda: self.holder == name or self.errors
                               or all(p in self.finished for p in self.order if p != name))
        return time.perf_counter()

    def pass_on(self, name: str) -> float:
        t = time.perf_counter()
        with self.cond:
            self.holder = self._next(name)
            self.cond.notify_all()
        return t

    def finish(self, name: str, error: BaseException | None = None) -> None:
        with self.cond:
            self.finished.add(name)
            if error is not None:
                self.errors.append(error)
            self.holder = self._next(name)
            self.cond.notify_all()


class Party:
    """One trainer's side of the baton: step durations from receiving the baton to passing it on."""

    def __init__(self, name: str, baton: Baton, threads: int | None = None) -> None:
        self.name, self.baton = name, baton
        self.threads = threads  # torch threads while this party holds the baton (None: leave them)
        self.on_take = self.on_release = None  # called on getting / before passing the baton (a worker's pause)
        self.started: float | None = None
        self.durations: list[float] = []

    def _take(self) -> float:
        t = self.baton.wait(self.name)
        if self.threads is not None:
            torch.set_num_threads(self.threads)  # process-wide: each system runs with its own count
        if self.on_take is not None:
            self.on_take()
        return t

    def begin(self) -> None:
        if self.started is None:
            self.started = self._take()

    def end(self) -> None:
        if self.on_release is not None:
            self.on_release()
        self.durations.append(self.baton.pass_on(self.name) - self.started)
        self.started = self._take()  # blocked until the other sides have run their steps


def make_lmpo(model, tok, args, length: int, steps: int, compile: bool = False, staleness: int = 0,
              threads: int | None = None, model_name: str = "tiny", lean_decode: bool = True):
    """lmpo's Trainer; with ``staleness`` k >= 1 its rollout worker builds the same model (``build_model``) and
    gets ``threads // 2`` torch threads, the training process the rest."""
    from lmpo.trainer import Trainer
    from lmpo.trainer.config import config_from_dict

    threads = args.threads if threads is None else threads
    worker_threads = max(1, threads // 2) if staleness else 1
    main_threads = max(1, threads - worker_threads) if staleness else threads

    cfg = config_from_dict({
        "model": {"name": "tiny", "init_seed": 0},
        "task": {"name": "addition", "options": {"min_digits": 1, "max_digits": 2}, "eval_examples": 8},
        "rollout": {"completions_per_prompt": args.group, "max_new_tokens": length, "temperature": 1.0,
                    "ignore_eos": True, "async_staleness": staleness, "lean_decode": lean_decode,
                    **({"async_threads": worker_threads, "async_timeout_s": 3600.0} if staleness else {})},
        "objective": {"preset": "grpo"},
        "optim": {"lr": args.lr, "max_grad_norm": 1.0},
        "loop": {"steps": steps, "prompts_per_step": args.prompts, "seqs_per_microbatch": args.prompts * args.group,
                 "seed": 0, "device": "cpu", "num_threads": main_threads, "compile": compile},
        "eval": {"at_start": False, "max_new_tokens": 4},
        "checkpoint": {"at_end": False},
        "logging": {"run_dir": tempfile.mkdtemp(prefix="lmpo_bench_"), "progress_bar": False, "tensorboard": False},
    })
    factory = functools.partial(build_model, model_name) if staleness else None
    return Trainer(cfg, model=model, tokenizer=tok, model_factory=factory, log=lambda msg: None)


def _engine(trainer):
    """The trainer's rollout engine, built as the trainer builds it."""
    from lmpo.trainer.run.build import build_rollout_engine

    return build_rollout_engine(trainer.cfg, trainer.model, trainer.tokenizer,
                                record_logprobs=trainer.driver.needs.rollout_logp)


def run_lmpo(trainer, party: Party, phases: list[dict]) -> None:
    """``trainer.train()`` with the baton taken around each RL step and its phases timed."""
    from lmpo.trainer.run import build
    from lmpo.trainer.step import stages

    k = trainer.cfg.rollout.async_staleness
    clock = {"gen": 0.0, "logp": 0.0}
    if k:  # the worker's time: computes only in this party's turns; "gen" is the wait for its rollouts
        real_build = build.build_async_pipeline
        worker: dict = {"pid": None}

        def signal_worker(sig):
            if worker["pid"] is not None:
                try:
                    os.kill(worker["pid"], sig)
                except ProcessLookupError:
                    pass

        def build_pipeline(*args, **kwargs):
            pipeline = real_build(*args, **kwargs)
            worker["pid"] = pipeline.engine.pid
            return pipeline

        build.build_async_pipeline = build_pipeline  # the trainer builds its pipeline inside train()
        party.on_take = lambda: signal_worker(signal.SIGCONT)
        party.on_release = lambda: signal_worker(signal.SIGSTOP)
        real_train = trainer.train

        def train():
            try:
                return real_train()
            finally:
                signal_worker(signal.SIGCONT)  # a stopped worker could not be stopped at the end
                build.build_async_pipeline = real_build
        _train = train
    else:
        trainer.rollout_engine = _engine(trainer)
        _train = trainer.train

    def timed(fn, key):
        def wrapper(*a, **kw):
            t0 = time.perf_counter()
            try:
                return fn(*a, **kw)
            finally:
                clock[key] += time.perf_counter() - t0
        return wrapper

    if not k:
        trainer.rollout_engine.generate = timed(trainer.rollout_engine.generate, "gen")
    stages.policy_logprobs = timed(stages.policy_logprobs, "logp")  # the log-prob stage's forward
    real_step = trainer.rl_step

    def step(i):
        party.begin()
        clock.update(gen=0.0, logp=0.0)
        waited = trainer.pipeline.engine.wait_s if k else 0.0
        t0 = time.perf_counter()
        out = real_step(i)
        if k:
            clock["gen"] = trainer.pipeline.engine.wait_s - waited
        phases.append({"step_s": time.perf_counter() - t0, **clock})
        party.end()
        return out

    trainer.rl_step = step
    _train()


def make_trl(model, tok, args, length: int, steps: int, party: Party):
    from datasets import Dataset
    from transformers import PrinterCallback, TrainerCallback
    from trl import GRPOConfig, GRPOTrainer

    from lmpo.rewards import exact_match

    dataset = Dataset.from_list(prompts(args.prompts * steps))

    def reward(prompts, completions, answer, **kwargs):
        return exact_match(prompts, completions, answer)

    class Turn(TrainerCallback):
        def on_step_begin(self, targs, state, control, **kw):
            party.begin()

        def on_step_end(self, targs, state, control, **kw):
            party.end()

    seqs = args.prompts * args.group
    config = GRPOConfig(
        output_dir=tempfile.mkdtemp(prefix="trl_bench_"), use_cpu=True, report_to="none", bf16=False,
        per_device_train_batch_size=seqs, num_generations=args.group, generation_batch_size=seqs,
        gradient_accumulation_steps=1, num_iterations=1, beta=0.0, learning_rate=args.lr, max_grad_norm=1.0,
        lr_scheduler_type="constant", warmup_steps=0, weight_decay=0.0, adam_beta1=0.9, adam_beta2=0.999,
        max_completion_length=length, generation_kwargs={"min_new_tokens": length},
        temperature=1.0, top_p=1.0, loss_type="grpo", scale_rewards="group", max_steps=steps, logging_steps=1,
        save_strategy="no", disable_tqdm=True, seed=0, dataloader_num_workers=0, shuffle_dataset=False,
        log_completions=False,
    )
    trainer = GRPOTrainer(model=model, reward_funcs=reward, args=config, train_dataset=dataset,
                          processing_class=tok, callbacks=[Turn()])
    trainer.remove_callback(PrinterCallback)  # its per-step metric dicts would bury the table
    return trainer


def _thread(baton: Baton, name: str, fn) -> threading.Thread:
    def body():
        try:
            fn()
        except BaseException as e:  # noqa: BLE001 - reported by the main thread
            baton.finish(name, e)
            return
        baton.finish(name)

    return threading.Thread(target=body, name=name, daemon=True)


def run_in_turn(baton: Baton, lmpo_fn, trl_fn) -> None:
    """Run the two trainers in threads that take turns at every step boundary; re-raise the first error."""
    run_all_in_turn(baton, [("lmpo", lmpo_fn), ("trl", trl_fn)])


def run_all_in_turn(baton: Baton, named_fns) -> None:
    """Run each ``(party name, function)`` in a thread, the threads taking turns at every step boundary (the
    baton's ring order); re-raise the first error."""
    threads = [_thread(baton, name, fn) for name, fn in named_fns]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    if baton.errors:
        raise baton.errors[0]


def quartiles(values: list[float]) -> tuple[float, float, float]:
    if len(values) == 1:
        return values[0], values[0], values[0]
    q = statistics.quantiles(values, n=4, method="inclusive")
    return q[0], statistics.median(values), q[2]


def _median_ratio(num: list[float], den: list[float], pairs: list[int]) -> tuple[float, float, float]:
    return quartiles([num[i] / den[i] for i in pairs])


def run_setting(model_name: str, length: int, steps: int, args, compile: bool = False,
                stalenesses: tuple[int, ...] = ()) -> dict:
    """One setting: lmpo sync, lmpo async at each k of ``stalenesses`` and TRL, one step each in turn."""
    names = [*(["base"] if args.lean_baseline else []), "lmpo", *(f"async{k}" for k in stalenesses), "trl"]
    baton = Baton(*names)
    cores = args.threads
    parties = {n: Party(n, baton, threads=cores if n in ("base", "lmpo", "trl") else None) for n in names}
    tok = build_model(model_name)[1]
    trainers, phases, fns = {}, {n: [] for n in names}, []
    for n in names[:-1]:
        k = int(n[len("async"):]) if n.startswith("async") else 0
        model, _ = build_model(model_name)
        trainers[n] = make_lmpo(model, tok, args, length, steps, compile, staleness=k, model_name=model_name,
                                lean_decode=n != "base")
        if k:  # the training process's share of the cores, set again at every turn (one torch per process)
            parties[n].threads = trainers[n].cfg.loop.num_threads
        fns.append((n, functools.partial(run_lmpo, trainers[n], parties[n], phases[n])))
    model_b, _ = build_model(model_name)
    trl = make_trl(model_b, tok, args, length, steps, parties["trl"])
    run_all_in_turn(baton, [*fns, ("trl", trl.train)])
    d = {n: parties[n].durations for n in names}
    n = min(len(v) for v in d.values())
    warmup = max(args.warmup, 1 + max(stalenesses)) if stalenesses else args.warmup
    pairs = list(range(warmup, n)) if n > warmup else [n - 1]  # the first steps warm up
    q1, med, q3 = _median_ratio(d["trl"], d["lmpo"], pairs)
    steady = [phases["lmpo"][i] for i in pairs]
    total = sum(p["step_s"] for p in steady)
    gen = sum(p["gen"] for p in steady) / total
    logp = sum(p["logp"] for p in steady) / total
    out = {"model": model_name, "compile": compile, "params": param_count(trainers["lmpo"].model), "length": length,
           "pairs": len(pairs), "ratio": med, "q1": q1, "q3": q3,
           "lmpo_s": statistics.median(d["lmpo"][i] for i in pairs),
           "trl_s": statistics.median(d["trl"][i] for i in pairs),
           "gen": gen, "logp": logp, "update": 1.0 - gen - logp,
           "gen_s": statistics.median(p["gen"] for p in steady), "async": {}}
    if "base" in names:  # lmpo with the generic decode, same rotation: the phases before -> after
        base = [phases["base"][i] for i in pairs]
        base_total = sum(p["step_s"] for p in base)
        out["base"] = {"s": statistics.median(d["base"][i] for i in pairs),
                       "vs_trl": _median_ratio(d["trl"], d["base"], pairs),
                       "speedup": _median_ratio(d["base"], d["lmpo"], pairs),
                       **{f"{key}_x": _median_ratio([p[key] for p in phases["base"]], [p[key] for p in phases["lmpo"]],
                                                  pairs) for key in ("gen", "logp")},
                       "gen_s": statistics.median(p["gen"] for p in base), "gen": sum(p["gen"] for p in base) / base_total,
                       "logp": sum(p["logp"] for p in base) / base_total}
    for k in stalenesses:
        name = f"async{k}"
        steady = [phases[name][i] for i in pairs]
        total = sum(p["step_s"] for p in steady)
        out["async"][k] = {
            "s": statistics.median(d[name][i] for i in pairs),
            "vs_sync": _median_ratio(d["lmpo"], d[name], pairs),
            "vs_trl": _median_ratio(d["trl"], d[name], pairs),
            "wait": sum(p["gen"] for p in steady) / total,
            "logp": sum(p["logp"] for p in steady) / total,
        }
    return out


def generation_scaling(model_name: str, args, lengths=(32, 256), repeats: int = 3) -> dict[int, float]:
    """Median seconds of lmpo's rollout engine alone at each completion length (same batch as the trainers)."""
    model, tok = build_model(model_name)
    out = {}
    for length in lengths:
        trainer = make_lmpo(model, tok, args, length, 1)
        engine = _engine(trainer)
        batch = [r["prompt"] for r in prompts(args.prompts)]
        times = []
        for r in range(repeats + 1):
            t0 = time.perf_counter()
            engine.generate(batch, args.group, seed=r)
            if r:  # call 0 warms up
                times.append(time.perf_counter() - t0)
        out[length] = statistics.median(times)
    return out


#: the asynchronous trainer's targets: (ratio, at least, at these completion lengths in tokens)
TARGETS = {"vs_sync": 1.7, "vs_trl": 2.0}
TARGET_LENGTHS = (64, 256)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--lengths", type=int, nargs="+", default=None,
                   help="completion lengths in tokens (default: 8 64 256 1024)")
    p.add_argument("--models", nargs="+", default=["tiny", "tiny-wide"], choices=sorted(MODELS))
    p.add_argument("--steps", type=int, default=None,
                   help=f"steps per setting, warm-up steps dropped (default per length: {DEFAULT_STEPS})")
    p.add_argument("--prompts", type=int, default=16, help="prompts per step")
    p.add_argument("--group", type=int, default=8, help="completions per prompt (G)")
    p.add_argument("--lr", type=float, default=1e-4)
    p.add_argument("--threads", type=int, default=2,
                   help="cores per system: torch threads of TRL and of lmpo sync; lmpo async splits them between "
                        "its training process and its rollout worker")
    p.add_argument("--async-staleness", type=int, nargs="*", default=[1, 2],
                   help="lmpo async rows, one per k (rollout.async_staleness); none: no async rows")
    p.add_argument("--warmup", type=int, default=1, help="first steps of each setting left out (warm-up)")
    p.add_argument("--compile", nargs="+", default=["off"], choices=["off", "on"],
                   help="lmpo's loop.compile (torch.compile of the log-prob forwards and the decode step); "
                        "'off on' runs every setting twice, side by side in one process")
    p.add_argument("--lean-baseline", action="store_true",
                   help="add lmpo with rollout.lean_decode=false (the generic decode) to the rotation: each row then "
                        "also prints that system's step and phases, and the per-step ratios before -> after")
    p.add_argument("--gen-scaling", action=argparse.BooleanOptionalAction, default=None,
                   help="also time lmpo's generation alone at 32 and 256 tokens (default: on without --lengths)")
    p.add_argument("--quick", action="store_true",
                   help="smoke run: tiny model, 8 tokens, 4 prompts x 2 completions, 5 steps, no generation check")
    args = p.parse_args()
    if args.quick:
        args.models, args.lengths, args.prompts, args.group = ["tiny"], args.lengths or [8], 4, 2
        args.steps, args.gen_scaling = args.steps or 5, False
    stalenesses = tuple(sorted(set(args.async_staleness)))
    if any(k < 1 for k in stalenesses):
        p.error("--async-staleness takes k >= 1 (the sync row is always there)")
    lengths = args.lengths or [8, 64, 256, 1024]
    gen_scaling = args.gen_scaling if args.gen_scaling is not None else args.lengths is None
    torch.set_num_threads(args.threads)
    import transformers
    import trl

    worker_threads = max(1, args.threads // 2)
    print(f"settings: addition, {args.prompts} prompts x {args.group} completions per step, fixed-length "
          f"completions, lr {args.lr}, CPU, one step of each system in turn; torch {torch.__version__}, "
          f"transformers {transformers.__version__}, trl {trl.__version__}", flush=True)
    print(f"cores per system: {args.threads} — TRL: {args.threads} torch thread(s); lmpo sync: {args.threads}"
          + (f"; lmpo async k in {list(stalenesses)}: {max(1, args.threads - worker_threads)} training + "
             f"{worker_threads} rollout worker (worker stopped outside its own steps)" if stalenesses else ""),
          flush=True)
    warmup = max(args.warmup, 1 + max(stalenesses)) if stalenesses else args.warmup
    print(f"lmpo options: loop.compile in {args.compile}; {warmup} warm-up step(s) left out per setting",
          flush=True)
    print(f"{'model':>10} {'compile':>7} {'params':>8} {'T':>5} {'pairs':>5} {'lmpo s':>8} {'TRL s':>8} {'ratio':>6} "
          f"{'IQR':>11} {'gen':>5} {'logp':>5} {'update':>6}", flush=True)
    results = []
    for model_name in args.models:
        for length in lengths:
            steps = args.steps or DEFAULT_STEPS.get(length, 6)
            if steps <= warmup:
                p.error(f"--steps {steps} leaves no step after the {warmup} warm-up step(s)")
            for mode in args.compile:
                t0 = time.perf_counter()
                r = run_setting(model_name, length, steps, args, compile=mode == "on", stalenesses=stalenesses)
                results.append(r)
                print(f"{r['model']:>10} {mode:>7} {r['params'] / 1e6:7.2f}M {r['length']:5d} {r['pairs']:5d} "
                      f"{r['lmpo_s']:8.3f} {r['trl_s']:8.3f} {r['ratio']:5.2f}x {r['q1']:5.2f}-{r['q3']:4.2f}x "
                      f"{r['gen']:5.0%} {r['logp']:5.0%} {r['update']:6.0%}  ({time.perf_counter() - t0:.0f} s wall)",
                      flush=True)
                if "base" in r:
                    b = r["base"]
                    print(f"{'':>10} before (rollout.lean_decode=false): step {b['s']:.3f} s, TRL/before "
                          f"{b['vs_trl'][1]:.2f}x [{b['vs_trl'][0]:.2f}-{b['vs_trl'][2]:.2f}], gen {b['gen']:.0%} "
                          f"logp {b['logp']:.0%}; after/before: step {b['speedup'][1]:.2f}x "
                          f"[{b['speedup'][0]:.2f}-{b['speedup'][2]:.2f}], generation {b['gen_x'][1]:.2f}x "
                          f"[{b['gen_x'][0]:.2f}-{b['gen_x'][2]:.2f}], log-prob {b['logp_x'][1]:.2f}x", flush=True)
                for k, a in r["async"].items():
                    marks = []
                    for key, label in (("vs_sync", "async/sync"), ("vs_trl", "async/TRL")):
                        q1, med, q3 = a[key]
                        goal = (f" (target >= {TARGETS[key]}x: {'met' if med >= TARGETS[key] else 'NOT met'})"
                                if length in TARGET_LENGTHS else "")
                        marks.append(f"{label} {med:.2f}x [{q1:.2f}-{q3:.2f}]{goal}")
                    print(f"{'':>10} async k={k} step {a['s']:.3f} s, waits for rollouts {a['wait']:.0%}, logp "
                          f"{a['logp']:.0%}; " + "; ".join(marks), flush=True)
    if gen_scaling:
        for model_name in args.models:
            g = generation_scaling(model_name, args)
            print(f"generation alone, {model_name}: 32 tokens {g[32]:.3f} s, 256 tokens {g[256]:.3f} s, growth "
                  f"{g[256] / g[32]:.2f}x for 8x the tokens (target <= 9x)", flush=True)
    if stalenesses:
        scored = [a[key][1] / TARGETS[key] for r in results for a in r["async"].values() for key in TARGETS]
        print(f"min ratio below: the smallest async/sync / {TARGETS['vs_sync']} or async/TRL / {TARGETS['vs_trl']} "
              "(>= 1.00 when every target is met in this run)")
        print(f"min ratio: {min(scored):.2f}")
    else:
        print(f"min ratio: {min(r['ratio'] for r in results):.2f}")


if __name__ == "__main__":
    main()
