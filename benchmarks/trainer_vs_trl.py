"""lmpo's Trainer against TRL 1.16's GRPOTrainer at equal settings, side by side on CPU.

Both train the same freshly initialised built-in ``tiny`` model (character tokenizer, same seed, same
weights) on the same addition prompts with the same exact-match reward, batch shape (``--prompts`` prompts ×
``--group`` completions per step, one optimizer step per step, no gradient accumulation), learning rate,
sampling temperature, GRPO loss (``loss_type="grpo"`` / preset ``grpo``), ``beta=0`` (no reference model),
``num_iterations=1`` (on-policy) and number of steps.

Equal completion lengths: every completion is exactly ``--completion-tokens`` tokens in both — TRL through
``generation_kwargs={"min_new_tokens": T}`` with ``max_completion_length=T`` (EOS is suppressed until T), lmpo
through ``rollout.ignore_eos=true`` with ``max_new_tokens=T``. Each framework runs in its own subprocess (so
peak RSS is its own) with the same number of torch threads. Throughput is measured over the steady state:
from the end of step 1 to the end of the last step (start-up, first-call warm-up and lmpo's final
evaluation are excluded). Prints steps/s and peak RSS for both and their ratios.

    .venv/bin/python benchmarks/trainer_vs_trl.py [--steps 20 --prompts 16 --group 8 --completion-tokens 8]
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import tempfile
import time


def _prompts(n: int) -> list[dict]:
    from lmpo.tasks import make_task

    task = make_task("addition", min_digits=1, max_digits=2)
    return [{"prompt": e.prompt, "answer": e.answer} for e in task.train_examples(seed=0)[:n]]


def run_lmpo(args) -> dict:
    from lmpo.trainer import Trainer
    from lmpo.trainer.config import config_from_dict

    cfg = config_from_dict({
        "model": {"name": "tiny", "init_seed": 0},
        "task": {"name": "addition", "options": {"min_digits": 1, "max_digits": 2}, "eval_examples": 8},
        "rollout": {"completions_per_prompt": args.group, "max_new_tokens": args.completion_tokens,
                    "temperature": 1.0, "ignore_eos": True},
        "objective": {"preset": "grpo"},
        "optim": {"lr": args.lr, "max_grad_norm": 1.0},
        "loop": {"steps": args.steps, "prompts_per_step": args.prompts, "seqs_per_microbatch": args.prompts * args.group,
                 "seed": 0, "device": "cpu", "num_threads": args.threads},
        "eval": {"at_start": False},
        "checkpoint": {"at_end": False},
        "logging": {"run_dir": tempfile.mkdtemp(prefix="lmpo_bench_"), "progress_bar": False, "tensorboard": False},
    })
    trainer = Trainer(cfg, log=lambda msg: None)
    stamps: list[float] = []
    real_step = trainer._rl_step

    def timed_step(step):
        out = real_step(step)
        stamps.append(time.perf_counter())
        return out

    trainer._rl_step = timed_step
    result = trainer.train()
    lengths = [r["completion/length_mean"] for r in result.history]
    return {"steady_s": stamps[-1] - stamps[0], "steady_steps": len(stamps) - 1, "mean_completion_tokens":
            sum(lengths) / len(lengths)}


def run_trl(args) -> dict:
    import torch
    from datasets import Dataset
    from transformers import TrainerCallback
    from trl import GRPOConfig, GRPOTrainer

    from lmpo.models import load_model_and_tokenizer
    from lmpo.rewards import exact_match

    torch.set_num_threads(args.threads)
    model, tokenizer = load_model_and_tokenizer("tiny", seed=0)
    rows = _prompts(args.prompts * args.steps)
    dataset = Dataset.from_list(rows)

    def reward(prompts, completions, answer, **kwargs):
        return exact_match(prompts, completions, answer)

    stamps: list[float] = []
    lengths: list[float] = []

    class Stamp(TrainerCallback):
        def on_step_end(self, targs, state, control, **kw):
            stamps.append(time.perf_counter())

        def on_log(self, targs, state, control, logs=None, **kw):
            if logs and "completions/mean_length" in logs:
                lengths.append(logs["completions/mean_length"])

    seqs = args.prompts * args.group
    config = GRPOConfig(
        output_dir=tempfile.mkdtemp(prefix="trl_bench_"), use_cpu=True, report_to="none", bf16=False,
        per_device_train_batch_size=seqs, num_generations=args.group, generation_batch_size=seqs,
        gradient_accumulation_steps=1, num_iterations=1, beta=0.0, learning_rate=args.lr, max_grad_norm=1.0,
        lr_scheduler_type="constant", warmup_steps=0, weight_decay=0.0, adam_beta1=0.9, adam_beta2=0.999,
        max_completion_length=args.completion_tokens, generation_kwargs={"min_new_tokens": args.completion_tokens},
        temperature=1.0, top_p=1.0, loss_type="grpo", scale_rewards="group", max_steps=args.steps, logging_steps=1,
        save_strategy="no", disable_tqdm=True, seed=0, dataloader_num_workers=0, shuffle_dataset=False,
        log_completions=False,
    )
    trainer = GRPOTrainer(model=model, reward_funcs=reward, args=config, train_dataset=dataset,
                          processing_class=tokenizer, callbacks=[Stamp()])
    trainer.train()
    return {"steady_s": stamps[-1] - stamps[0], "steady_steps": len(stamps) - 1,
            "mean_completion_tokens": sum(lengths) / len(lengths) if lengths else float("nan")}


def _child(args) -> None:
    out = run_lmpo(args) if args.child == "lmpo" else run_trl(args)
    out["peak_rss_mb"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # Linux: KiB
    print("RESULT " + json.dumps(out), flush=True)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--steps", type=int, default=20)
    p.add_argument("--prompts", type=int, default=16, help="prompts per step")
    p.add_argument("--group", type=int, default=8, help="completions per prompt (G)")
    p.add_argument("--completion-tokens", type=int, default=8, help="every completion's length in tokens")
    p.add_argument("--lr", type=float, default=1e-4)
    p.add_argument("--threads", type=int, default=1, help="torch threads in each framework's process")
    p.add_argument("--child", choices=["lmpo", "trl"], default=None, help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.child:
        _child(args)
        return
    results = {}
    for name in ("lmpo", "trl"):
        cmd = [sys.executable, os.path.abspath(__file__), "--child", name] + [
            f"--{k.replace('_', '-')}={v}" for k, v in vars(args).items() if k != "child"]
        proc = subprocess.run(cmd, capture_output=True, text=True, env={**os.environ, "TOKENIZERS_PARALLELISM": "false"})
        line = [ln for ln in proc.stdout.splitlines() if ln.startswith("RESULT ")]
        if proc.returncode != 0 or not line:
            sys.stderr.write(proc.stdout[-3000:] + proc.stderr[-5000:])
            raise SystemExit(f"{name} run failed (exit {proc.returncode})")
        results[name] = json.loads(line[-1][len("RESULT "):])
        r = results[name]
        r["steps_per_s"] = r["steady_steps"] / r["steady_s"]
    print(f"settings: tiny model, addition, {args.prompts} prompts x {args.group} completions per step, "
          f"{args.completion_tokens} tokens per completion, {args.steps} steps, lr {args.lr}, "
          f"{args.threads} torch thread(s), CPU")
    print(f"{'':6} {'steps/s':>9} {'peak RSS MB':>12} {'completion tokens':>18}")
    for name, r in results.items():
        print(f"{name:6} {r['steps_per_s']:9.3f} {r['peak_rss_mb']:12.0f} {r['mean_completion_tokens']:18.2f}")
    a, b = results["lmpo"], results["trl"]
    print(f"throughput ratio lmpo/TRL: {a['steps_per_s'] / b['steps_per_s']:.2f}x (target >= 1.5x)")
    print(f"peak memory ratio lmpo/TRL: {a['peak_rss_mb'] / b['peak_rss_mb']:.2f}")


if __name__ == "__main__":
    main()
