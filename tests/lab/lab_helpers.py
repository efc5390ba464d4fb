"""Helpers for the lab tests: the smoke lab's config and a comparison of reports without timings."""

from __future__ import annotations

from typing import Any

TIMING_KEYS = {"created", "cpu_seconds", "wall_seconds", "steps_per_s", "step_s"}
"""Report fields that measure wall-clock or CPU time: they differ between two runs of the same lab."""


def smoke_config(lab_dir, model_dir, **sections) -> dict:
    """2 objectives × 2 seeds × a few steps, with a warm-up and a 2-snapshot gradient study: seconds on CPU."""
    base = {
        "lab": {"dir": str(lab_dir), "jobs": 1, "checkpoint_every_steps": 2, "progress": "quiet",
                "sampled_eval_k": 2},
        "grid": {"objectives": ["grpo", "gspo"], "seeds": [0, 1]},
        "train": {
            "model": {"name": model_dir},
            "task": {"name": "thinking_addition", "options": {"min_digits": 1, "max_digits": 1, "num_train": 200, "num_eval": 20},
                     "eval_examples": 8},
            "rollout": {"completions_per_prompt": 4, "max_new_tokens": 6},
            # an untrained model is never right; the length term makes rewards differ inside groups (signal)
            "rewards": {"functions": ["thinking_answer", "length_penalty"], "weights": [1.0, 1.0],
                        "kwargs": {"length_penalty": {"target_chars": 0, "scale_chars": 3.0}}},
            "optim": {"lr": 1e-2},
            "loop": {"steps": 4, "prompts_per_step": 2, "minibatches_per_step": 2, "seqs_per_microbatch": 8,
                     "device": "cpu", "num_threads": 1},
            "sft": {"steps": 2, "seqs_per_step": 4},
            "eval": {"every_steps": 2, "seqs_per_batch": 8},
        },
        "gradients": {"batches": 3, "onpolicy_batches": 2, "snapshots": [0.0, 1.0], "points": 2},
        "report": {},
    }
    for name, values in sections.items():
        base[name] = {**base.get(name, {}), **values}
    return base


def without_timings(x: Any) -> Any:
    """A report with every timing field removed (recursively), for comparing two runs of one lab."""
    if isinstance(x, dict):
        return {k: without_timings(v) for k, v in x.items() if k not in TIMING_KEYS}
    if isinstance(x, list):
        return [without_timings(v) for v in x]
    return x
