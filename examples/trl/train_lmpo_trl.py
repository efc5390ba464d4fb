"""Train with an lmpo objective inside TRL's GRPOTrainer (accelerate / DeepSpeed / FSDP, vLLM rollouts, PEFT).

Smoke test on a laptop CPU (built-in tiny model, no download)::

    python examples/trl/train_lmpo_trl.py --model tiny --task addition --preset gspo --use-cpu --max-steps 2

One node, 8 GPUs: vLLM server on 2 GPUs, training on 6 with DeepSpeed ZeRO-3 (see launch_vllm_server.sh)::

    CUDA_VISIBLE_DEVICES=0,1 trl vllm-serve --model Qwen/Qwen2.5-7B-Instruct --tensor-parallel-size 2
    CUDA_VISIBLE_DEVICES=2,3,4,5,6,7 accelerate launch --config_file examples/trl/accelerate_zero3.yaml \\
        --num_processes 6 examples/trl/train_lmpo_trl.py --model Qwen/Qwen2.5-7B-Instruct \\
        --task openai/gsm8k --task-option subset=main --task-option $'prompt_template=Question: {question}\\nAnswer:' \\
        --reward numeric_match --preset gspo --use-vllm --vllm-mode server --bf16

``--override key=value`` sets any ``Objective`` field (values parsed as YAML scalars: ``eps_high=0.3``,
``dual_clip=true``). ``--task`` is anything ``lmpo.tasks.load_task`` accepts: a built-in task name, a
local JSON/JSONL/Parquet file with ``prompt``/``answer`` columns, or a Hugging Face dataset name.
"""

from __future__ import annotations

import argparse
import sys

import yaml
from datasets import Dataset
from trl import GRPOConfig

from lmpo.integrations.trl import LmpoGRPOTrainer
from lmpo.models import load_model_and_tokenizer
from lmpo.objectives import PRESETS, Objective
from lmpo.rewards import REWARDS, get_reward_fn
from lmpo.tasks import load_task


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", default="tiny", help="HF model id/path, or an lmpo built-in preset (tiny)")
    p.add_argument("--task", default="addition", help="lmpo task name, data file, or HF dataset name")
    p.add_argument("--task-option", action="append", default=[], metavar="KEY=VALUE",
                   help="option for lmpo.tasks.load_task, repeatable (subset=main, prompt_template=...)")
    p.add_argument("--reward", default=None, help=f"reward function: {', '.join(REWARDS)} or pkg.module:fn "
                                                  f"(default: the task's own)")
    p.add_argument("--preset", default="gspo", choices=list(PRESETS))
    p.add_argument("--override", action="append", default=[], metavar="FIELD=VALUE",
                   help="Objective field override, repeatable")
    p.add_argument("--output-dir", default="runs/trl-lmpo")
    p.add_argument("--max-steps", type=int, default=200)
    p.add_argument("--prompts-per-device", type=int, default=2, help="prompts per device per micro-batch")
    p.add_argument("--completions-per-prompt", type=int, default=8, help="GRPO group size G")
    p.add_argument("--grad-accum", type=int, default=4, help="gradient accumulation steps")
    p.add_argument("--max-completion-length", type=int, default=512, help="max new tokens per completion")
    p.add_argument("--lr", type=float, default=1e-6)
    p.add_argument("--temperature", type=float, default=1.0)
    p.add_argument("--bf16", action="store_true")
    p.add_argument("--use-cpu", action="store_true")
    p.add_argument("--use-vllm", action="store_true", help="generate with vLLM (server or colocate)")
    p.add_argument("--vllm-mode", default="server", choices=["server", "colocate"])
    p.add_argument("--vllm-server-host", default="0.0.0.0")
    p.add_argument("--lora-r", type=int, default=0, help="LoRA rank (0: full fine-tuning)")
    return p.parse_args(argv)


def scalar(value: str) -> object:
    """``"0.3"`` → 0.3, ``"true"`` → True, ``"32"`` → 32; anything that is not a YAML scalar stays a string."""
    try:
        parsed = yaml.safe_load(value)
    except yaml.YAMLError:
        return value
    return parsed if isinstance(parsed, (int, float, bool, str)) or parsed is None else value


def key_values(items: list[str], flag: str) -> dict[str, object]:
    """``["a=1", "b=x"]`` → ``{"a": 1, "b": "x"}``."""
    out: dict[str, object] = {}
    for item in items:
        key, sep, value = item.partition("=")
        if not sep:
            raise SystemExit(f"{flag} {item!r}: expected KEY=VALUE, e.g. {flag} eps_high=0.3")
        out[key.strip()] = scalar(value)
    return out


def build_objective(preset: str, overrides: list[str]) -> Objective:
    return Objective.preset(preset, **key_values(overrides, "--override"))


def build_trainer(args: argparse.Namespace) -> LmpoGRPOTrainer:
    objective = build_objective(args.preset, args.override)
    task = load_task(args.task, **key_values(args.task_option, "--task-option"))
    dataset = Dataset.from_list([{"prompt": ex.prompt, "answer": ex.answer} for ex in task.train_examples()])
    weighted = [(args.reward, 1.0)] if args.reward else list(task.default_rewards)
    rewards = [get_reward_fn(name) for name, _ in weighted]
    model, tokenizer = load_model_and_tokenizer(args.model, dtype="bf16" if args.bf16 else "float32")
    peft_config = None
    if args.lora_r:
        from peft import LoraConfig

        peft_config = LoraConfig(r=args.lora_r, lora_alpha=2 * args.lora_r, target_modules="all-linear",
                                 task_type="CAUSAL_LM")
    config = GRPOConfig(
        output_dir=args.output_dir,
        max_steps=args.max_steps,
        per_device_train_batch_size=args.prompts_per_device * args.completions_per_prompt,
        num_generations=args.completions_per_prompt,
        gradient_accumulation_steps=args.grad_accum,
        max_completion_length=args.max_completion_length,
        learning_rate=args.lr,
        temperature=args.temperature,
        bf16=args.bf16,
        use_cpu=args.use_cpu,
        use_vllm=args.use_vllm,
        vllm_mode=args.vllm_mode,
        vllm_server_host=args.vllm_server_host,
        # what the objective expects; the objective replaces TRL's loss_type/epsilon/importance level
        scale_rewards=objective.advantage_scale,
        reward_weights=[weight for _, weight in weighted],
        beta=objective.kl_coef,
        use_bias_correction_kl=False,
        logging_steps=1,
        save_strategy="no" if args.max_steps < 50 else "steps",
        save_steps=50,
        report_to="none",
        disable_tqdm=args.use_cpu,
    )
    return LmpoGRPOTrainer(model, rewards, config, train_dataset=dataset, processing_class=tokenizer,
                           peft_config=peft_config, objective=objective)


def main(argv: list[str] | None = None) -> LmpoGRPOTrainer:
    args = parse_args(argv)
    trainer = build_trainer(args)
    trainer.train()
    if args.max_steps >= 50:
        trainer.save_model(args.output_dir)
    return trainer


if __name__ == "__main__":
    main(sys.argv[1:])
