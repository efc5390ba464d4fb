"""One side of the two-process check of the TRL adapter (``test_integ_trl_two_process.py``).

``accelerate launch --multi_gpu --num_processes 2 trl_two_process_worker.py OUT`` (CPU: gloo) builds
``LmpoGRPOTrainer`` in each process, wraps the policy in DDP, gives process r its half of one global batch of 8
sequences and writes, from process 0, the loss (mean over processes) and the all-reduced gradients of each
objective to OUT. The test computes the same global batch in one process and compares.
"""

from __future__ import annotations

import sys
import tempfile

import torch
from datasets import Dataset
from trl import GRPOConfig

from lmpo.integrations.trl import LmpoGRPOTrainer
from lmpo.models import CharTokenizer, build_tiny_model

TINY = dict(hidden_size=32, intermediate_size=64, num_layers=2, num_heads=2)
OBJECTIVES = ("grpo", "dapo", "gspo")
ROWS = 8


def reward(completions, **kwargs):
    return [float(len(c)) for c in completions]


def build(objective: str) -> LmpoGRPOTrainer:
    tokenizer = CharTokenizer()
    model = build_tiny_model(tokenizer, seed=0, **TINY)
    args = GRPOConfig(output_dir=tempfile.mkdtemp(prefix="lmpo_trl2_"), per_device_train_batch_size=4,
                      num_generations=4, max_completion_length=6, max_steps=1, use_cpu=True, report_to="none",
                      bf16=False, save_strategy="no", gradient_accumulation_steps=1, disable_tqdm=True,
                      temperature=0.7, beta=0.0)
    return LmpoGRPOTrainer(model, reward, args, train_dataset=Dataset.from_dict({"prompt": ["1+1="] * 8}),
                           processing_class=tokenizer, objective=objective)


def global_batch(vocab: int, P: int = 5, T: int = 7) -> dict[str, torch.Tensor]:
    """A TRL micro-batch of 8 sequences (left-padded prompts, right-padded completions of mixed lengths)."""
    g = torch.Generator().manual_seed(0)
    prompt_mask = torch.ones(ROWS, P, dtype=torch.long)
    prompt_mask[0, :2] = prompt_mask[5, :1] = 0
    lengths = torch.tensor([7, 3, 5, 1, 6, 2, 7, 4])
    completion_mask = (torch.arange(T).unsqueeze(0) < lengths.unsqueeze(1)).long()
    return {"prompt_ids": torch.randint(4, vocab, (ROWS, P), generator=g), "prompt_mask": prompt_mask,
            "completion_ids": torch.randint(4, vocab, (ROWS, T), generator=g), "completion_mask": completion_mask,
            "advantages": torch.randn(ROWS, generator=g),
            # TRL counts the completion tokens of the whole generation batch, on all processes
            "num_items_in_batch": completion_mask.sum()}


def loss_and_grads(trainer: LmpoGRPOTrainer) -> tuple[float, list[torch.Tensor]]:
    """This process's share of the global batch through the adapter's loss, backward through the prepared (DDP)
    model; the loss averaged over processes and the (all-reduced) gradients."""
    acc = trainer.accelerator
    trainer.current_gradient_accumulation_steps = 1  # what TRL's training loop sets (GA = 1)
    trainer.model.train()
    model = acc.prepare_model(trainer.model)
    batch = global_batch(trainer.processing_class.vocab_size)
    share = ROWS // acc.num_processes
    rows = slice(acc.process_index * share, (acc.process_index + 1) * share)
    inputs = {k: v if k == "num_items_in_batch" else v[rows] for k, v in batch.items()}
    loss = trainer._compute_loss(model, inputs)
    acc.backward(loss)
    mean_loss = acc.gather(loss.detach().reshape(1)).mean().item()
    grads = [p.grad.detach().clone() for p in acc.unwrap_model(model).parameters()]
    return mean_loss, grads


def main(out: str) -> None:
    results = {}
    for objective in OBJECTIVES:
        trainer = build(objective)
        results[objective] = loss_and_grads(trainer)
        results["num_processes"] = trainer.accelerator.num_processes
        results["backend"] = str(torch.distributed.get_backend()) if torch.distributed.is_initialized() else ""
    if trainer.accelerator.is_main_process:
        torch.save(results, out)


if __name__ == "__main__":
    main(sys.argv[1])
