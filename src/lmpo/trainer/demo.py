"""``lmpo demo`` / ``make demo``: the embedded default, offline on a laptop CPU.

Builds the ``tiny`` model (character tokenizer + small Llama config, no download), warms it up briefly
with supervised learning on addition — deliberately short, so the policy knows the answer format but is
often wrong — then trains it with a GRPO-family objective and prints held-out greedy accuracy before and
after RL, the run directory and its plots (written by the trainer at the end of the run). ``DEMO_CONFIG`` is the run; ``configs/demo.yaml`` is the same
run as a file (a test keeps the two equal), so ``lmpo train configs/demo.yaml`` reproduces it.
"""

from __future__ import annotations

import time

import torch

from lmpo.config import deep_merge
from lmpo.rewards import completion_text
from lmpo.trainer.config import config_from_dict, parse_overrides

#: the demo run (kept equal to configs/demo.yaml by a test)
DEMO_CONFIG: dict = {
    "model": {"name": "tiny", "init_seed": 0},
    "task": {"name": "addition", "options": {"min_digits": 1, "max_digits": 2}, "eval_examples": 200},
    "rollout": {"completions_per_prompt": 8, "max_new_tokens": 4, "temperature": 1.0},
    # exact match, plus half a point of partial credit per matching digit (a denser signal for a tiny policy);
    # accuracy (train and held-out) is always the task's exact match
    "rewards": {"functions": ["exact_match", "lmpo.trainer.demo:digit_match"], "weights": [1.0, 0.5]},
    "objective": {"preset": "grpo"},
    "optim": {"lr": 4e-4, "warmup_steps": 10, "schedule": "cosine", "min_lr_ratio": 0.1, "max_grad_norm": 1.0},
    # one thread: the tiny model's matrices are too small to gain from two, and on a busy 2-core machine
    # OpenMP threads that wait on each other are many times slower than one
    "loop": {"steps": 600, "prompts_per_step": 32, "seqs_per_microbatch": 256, "seed": 0, "num_threads": 1,
             "device": "cpu"},
    # deliberately brief: stop once the policy has the answer format and gets 30% of TRAINING prompts right
    # (the held-out split is not looked at), so that RL starts from a comparable point whatever the seed
    "sft": {"steps": 2000, "lr": 3e-3, "seqs_per_step": 64, "stop_at_accuracy": 0.3, "check_every_steps": 50},
    "eval": {"every_steps": 100, "seqs_per_batch": 200},
    "checkpoint": {"every_steps": 0, "keep_last": 1},
    "logging": {"run_dir": "runs/demo", "tensorboard": True, "progress_bar": True},
}


def digit_match(prompts, completions, answer, **kwargs) -> list[float]:
    """Partial credit for arithmetic answers: the fraction of digit positions that match the reference.

    Digits are aligned from the right (units with units) and the count is divided by the longer of the two
    strings, so ``"57"`` vs ``"65"`` scores 0, ``"64"`` vs ``"65"`` scores 0.5, an exact answer scores 1 and
    extra or missing digits cost. A user reward function in the TRL signature, referenced by import path
    ``lmpo.trainer.demo:digit_match`` in the demo's config.
    """
    out = []
    for completion, ref in zip(completions, answer):
        got, want = completion_text(completion).strip(), str(ref).strip()
        n = max(len(got), len(want), 1)
        same = sum(a == b for a, b in zip(reversed(got), reversed(want)))
        out.append(same / n)
    return out


def demo_config(run_dir: str | None = None, seed: int | None = None, preset: str | None = None,
                overrides: list[str] | dict | None = None):
    data = dict(DEMO_CONFIG)
    extra: dict = {}
    if run_dir is not None:
        extra["logging"] = {"run_dir": run_dir}
    if seed is not None:
        extra["loop"] = {"seed": seed}
        extra["model"] = {"init_seed": seed}
    if preset is not None:
        extra["objective"] = {"preset": preset}
    data = deep_merge(data, extra)
    if overrides:
        data = deep_merge(data, parse_overrides(overrides) if isinstance(overrides, list) else overrides)
    return config_from_dict(data)


def run_demo(run_dir: str | None = None, seed: int | None = None, preset: str | None = None,
             overrides: list[str] | dict | None = None) -> dict:
    """Run the demo and print its table; returns the figures (accuracies, seconds, paths)."""
    from lmpo.trainer.run.loop import Trainer

    cfg = demo_config(run_dir, seed, preset, overrides)
    t0 = time.perf_counter()
    if cfg.loop.num_threads > 0:
        torch.set_num_threads(cfg.loop.num_threads)
    print(f"lmpo demo: tiny model, {cfg.task.name} task, {cfg.sft.steps} supervised warm-up steps, then "
          f"{cfg.loop.steps} RL steps with preset {cfg.objective.preset!r} "
          f"({cfg.loop.prompts_per_step} prompts x {cfg.rollout.completions_per_prompt} completions per step)",
          flush=True)
    result = Trainer(cfg).train(overwrite=True)  # the demo replaces its own earlier run
    plots = result.plots
    seconds = time.perf_counter() - t0
    before = (result.eval_before or {}).get("eval/accuracy", float("nan"))
    after = (result.eval_after or {}).get("eval/accuracy", float("nan"))
    n_eval = cfg.task.eval_examples
    rows = [
        ("after supervised warm-up (RL start)", f"{100 * before:5.1f}%"),
        (f"after RL ({cfg.objective.preset}, {cfg.loop.steps} steps)", f"{100 * after:5.1f}%"),
        ("gain from RL", f"{100 * (after - before):+5.1f} points"),
    ]
    width = max(len(r[0]) for r in rows)
    print()
    print(f"held-out greedy accuracy ({n_eval} {cfg.task.name} problems never seen in training)")
    print(f"  {'stage'.ljust(width)}  accuracy")
    for name, value in rows:
        print(f"  {name.ljust(width)}  {value}")
    print()
    print(f"run directory: {result.run_dir}  (config.yaml, metrics.jsonl, tensorboard/, checkpoints/, model/: from_pretrained)")
    if plots:
        print(f"plots: {plots[0].parent}/ ({', '.join(p.name for p in plots)})")
    print(f"total time: {seconds:.0f} s")
    return {"accuracy_before": before, "accuracy_after": after, "seconds": seconds, "run_dir": str(result.run_dir),
            "plots": [str(p) for p in plots]}
