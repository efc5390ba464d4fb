"""lmpo's Trainer, synchronous against ``rollout.async_staleness`` = 1 and 2, side by side in one run.

    PYTHONPATH=src .venv/bin/python benchmarks/trainer_async.py [--model tiny] [--lengths 64 256] [--steps 8]

Every setting is a whole ``Trainer.train()`` of the same config (the ``tiny`` preset, addition prompts,
``--prompts`` × ``--group`` completions of exactly T tokens per step (``rollout.ignore_eos``), preset ``grpo``,
one optimizer step per step), run one after the other for each length, ``--rounds`` times in turn:

- ``sync 1 thread``:  today's loop, ``loop.num_threads: 1``;
- ``sync 2 threads``: today's loop, ``loop.num_threads: 2`` (torch on both cores);
- ``async k=1`` / ``async k=2``: generation in the rollout worker (``rollout.async_threads: 1``), training in the
  trainer (``loop.num_threads: 1``), overlapped.

A setting's time per step is the median over its steps after the first ``--warmup`` (``perf/step_s`` of the
metrics: from the start of the step's draw to the weight push after its update; for async runs that is waiting
for the worker, scoring and the update). The worker's start-up (a process importing torch) and the pipeline fill
of the first k + 1 steps fall in the dropped steps: a run pays them once. Prints steps/s per setting (median over
rounds, min–max), the ratios to ``sync 1 thread`` and ``sync 2 threads``; the last line is ``min ratio: X.XX``, the
smallest ratio async k=1 / sync 2 threads over the lengths.
"""

from __future__ import annotations

import argparse
import statistics
import tempfile


def config(run_dir: str, args, tokens: int, threads: int, k: int):
    from lmpo.trainer.config import config_from_dict

    return config_from_dict({
        "model": {"name": args.model},
        "task": {"name": "addition", "eval_examples": 4},
        "rollout": {"completions_per_prompt": args.group, "max_new_tokens": tokens, "ignore_eos": True,
                    "async_staleness": k},
        "objective": {"preset": "grpo"},
        "optim": {"lr": 1e-4},
        "loop": {"steps": args.steps, "prompts_per_step": args.prompts, "seqs_per_microbatch": args.prompts * args.group,
                 "seed": 0, "device": "cpu", "num_threads": threads},
        "eval": {"at_start": False, "max_new_tokens": 2},
        "checkpoint": {"at_end": False, "final_model": False},
        "logging": {"run_dir": run_dir, "progress_bar": False, "tensorboard": False, "plots": False,
                    "print_every_steps": 0},
    })


SETTINGS = {"sync 1 thread": (1, 0), "sync 2 threads": (2, 0), "async k=1": (1, 1), "async k=2": (1, 2)}


def steps_per_s(args, tokens: int, threads: int, k: int) -> float:
    import torch

    from lmpo.trainer import Trainer

    torch.set_num_threads(threads)
    with tempfile.TemporaryDirectory() as tmp:
        history = Trainer(config(tmp, args, tokens, threads, k), log=lambda msg: None).train().history
    times = [row["perf/step_s"] for row in history[args.warmup:]]
    return 1.0 / statistics.median(times)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default="tiny")
    parser.add_argument("--lengths", type=int, nargs="+", default=[64, 256])
    parser.add_argument("--prompts", type=int, default=8)
    parser.add_argument("--group", type=int, default=4)
    parser.add_argument("--steps", type=int, default=8)
    parser.add_argument("--warmup", type=int, default=3, help="steps left out of each run (>= k + 1)")
    parser.add_argument("--rounds", type=int, default=2)
    args = parser.parse_args()
    if args.warmup < 3 or args.steps <= args.warmup:
        parser.error("--warmup must be >= 3 (the k = 2 pipeline fill) and below --steps")
    ratios = []
    for tokens in args.lengths:
        rates: dict[str, list[float]] = {name: [] for name in SETTINGS}
        for _ in range(args.rounds):
            for name, (threads, k) in SETTINGS.items():
                rates[name].append(steps_per_s(args, tokens, threads, k))
        med = {name: statistics.median(v) for name, v in rates.items()}
        print(f"\n{args.model}, {args.prompts}x{args.group} completions x {tokens} tokens, {args.steps} steps "
              f"(first {args.warmup} dropped), {args.rounds} rounds")
        for name, v in rates.items():
            print(f"  {name:15s} {med[name]:6.2f} steps/s ({min(v):.2f}-{max(v):.2f})  "
                  f"x{med[name] / med['sync 1 thread']:.2f} vs sync 1 thread, "
                  f"x{med[name] / med['sync 2 threads']:.2f} vs sync 2 threads")
        ratios.append(med["async k=1"] / med["sync 2 threads"])
    print(f"min ratio: {min(ratios):.2f}")


if __name__ == "__main__":
    main()
