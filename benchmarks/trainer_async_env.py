"""lmpo's Trainer on an environment (``env.id``), synchronous against ``rollout.async_staleness: 1``, paired.

    PYTHONPATH=src .venv/bin/python benchmarks/trainer_async_env.py [--env ToolArithmetic-v0] [--rounds 3]

Each round trains the same config twice, in alternating order (round r starts with the other setting than
round r − 1): the ``tiny`` preset (its chat template renders the tool schemas) on ``--env``, ``--prompts`` ×
``--group`` episodes per step under ``env.budget`` (``--turn-tokens`` per turn, 3 turns), preset ``grpo``,
``--steps`` steps:

- ``sync``:      episodes played in the training process, ``loop.num_threads: --threads``;
- ``async k=1``: episodes played in the rollout worker (``rollout.async_threads: 1``), training on one thread.

A run's time per step is the median ``perf/step_s`` after the first ``--warmup`` steps (the worker's start and the
pipeline fill fall in them); its wall time is ``TrainResult.seconds`` (all of it, start-up included). Prints both
per round and the per-round ratios sync / async (> 1: async is faster), then their medians.
"""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile


def config(run_dir: str, args, k: int):
    from lmpo.trainer.config import config_from_dict

    return config_from_dict({
        "model": {"name": "tiny"},
        "env": {"id": args.env, "budget": {"max_turns": 3, "max_total_tokens": 2048,
                                           "max_new_tokens_per_turn": args.turn_tokens}},
        "task": {"eval_examples": 2},
        "rollout": {"completions_per_prompt": args.group, "async_staleness": k},
        "objective": {"preset": "grpo"},
        "optim": {"lr": 1e-4},
        "loop": {"steps": args.steps, "prompts_per_step": args.prompts, "seqs_per_microbatch": args.prompts * args.group,
                 "seed": 0, "device": "cpu", "num_threads": 1 if k else args.threads},
        "eval": {"at_start": False},
        "checkpoint": {"at_end": False, "final_model": False},
        "logging": {"run_dir": run_dir, "progress_bar": False, "tensorboard": False, "plots": False,
                    "print_every_steps": 0},
    })


def one_run(args, k: int) -> tuple[float, float, float]:
    """(median seconds per step after the warm-up, wall seconds, mean policy tokens per episode)."""
    import torch

    from lmpo.trainer import Trainer

    torch.set_num_threads(1 if k else args.threads)
    with tempfile.TemporaryDirectory() as tmp:
        result = Trainer(config(tmp, args, k), log=lambda msg: None).train()
    rows = result.history[args.warmup:]
    return (statistics.median(row["perf/step_s"] for row in rows), result.seconds,
            statistics.mean(row["episodes/policy_tokens_mean"] for row in result.history))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--env", default="ToolArithmetic-v0")
    parser.add_argument("--prompts", type=int, default=4)
    parser.add_argument("--group", type=int, default=4)
    parser.add_argument("--turn-tokens", type=int, default=64)
    parser.add_argument("--steps", type=int, default=8)
    parser.add_argument("--warmup", type=int, default=2, help="steps left out of the per-step median (>= 2)")
    parser.add_argument("--threads", type=int, default=1, help="torch threads of the synchronous run")
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    if args.warmup < 2 or args.steps <= args.warmup:
        parser.error("--warmup must be >= 2 (the k = 1 pipeline fill) and below --steps")
    print(f"{args.env}, tiny, {args.prompts}x{args.group} episodes x <= 3 turns x {args.turn_tokens} tokens, "
          f"{args.steps} steps (per-step median after {args.warmup}), sync on {args.threads} thread(s); "
          f"load average at start {os.getloadavg()[0]:.2f}")
    step_ratios, wall_ratios = [], []
    for r in range(args.rounds):
        order = (0, 1) if r % 2 == 0 else (1, 0)
        got = {k: one_run(args, k) for k in order}
        (s_step, s_wall, s_tok), (a_step, a_wall, a_tok) = got[0], got[1]
        step_ratios.append(s_step / a_step)
        wall_ratios.append(s_wall / a_wall)
        print(f"round {r + 1} ({'sync first' if order[0] == 0 else 'async first'}): "
              f"sync {s_step:.3f} s/step, {s_wall:.1f} s wall ({s_tok:.0f} policy tokens/episode); "
              f"async k=1 {a_step:.3f} s/step, {a_wall:.1f} s wall ({a_tok:.0f}); "
              f"sync/async per step x{step_ratios[-1]:.2f}, wall x{wall_ratios[-1]:.2f}")
    print(f"median sync/async: per step x{statistics.median(step_ratios):.2f}, wall x{statistics.median(wall_ratios):.2f}; "
          f"load average at end {os.getloadavg()[0]:.2f}")


if __name__ == "__main__":
    main()
