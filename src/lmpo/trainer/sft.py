"""Supervised warm-up on a task's reference answers (the usual SFT → RL pipeline).

Each step draws ``seqs_per_step`` examples with a seeded generator, builds ``prompt ‖ answer ‖ EOS``
(left-padded, like generation) and minimises the mean token cross-entropy of the answer tokens only::

    L = − Σ_{b,t} m_{b,t} log π(y_{b,t} | x_b, y_{b,<t}) / Σ m          m = 1 on answer tokens and EOS
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from lmpo.generation import position_ids_from_mask
from lmpo.tasks import Example, Task
from lmpo.trainer.config import SFTConfig


def encode_pairs(tokenizer, prompts: Sequence[str], completions: Sequence[str], device: torch.device
                 ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Left-padded ``prompt ‖ completion ‖ EOS`` batches.

    Returns input_ids (B, L), attention_mask (B, L) and loss_mask (B, L), the last 1 on completion tokens
    and EOS (the positions whose token is predicted by the previous position).
    """
    seqs, lossm = [], []
    for p, c in zip(prompts, completions):
        p_ids = tokenizer(p)["input_ids"]
        c_ids = tokenizer(c, add_special_tokens=False)["input_ids"] + [tokenizer.eos_token_id]
        seqs.append(p_ids + c_ids)
        lossm.append([0] * len(p_ids) + [1] * len(c_ids))
    L = max(len(s) for s in seqs)
    pad = tokenizer.pad_token_id
    ids = torch.full((len(seqs), L), pad, dtype=torch.long)
    attn = torch.zeros((len(seqs), L), dtype=torch.long)
    lm = torch.zeros((len(seqs), L), dtype=torch.bool)
    for i, (s, m) in enumerate(zip(seqs, lossm)):
        ids[i, L - len(s):] = torch.tensor(s)
        attn[i, L - len(s):] = 1
        lm[i, L - len(s):] = torch.tensor(m, dtype=torch.bool)
    return ids.to(device), attn.to(device), lm.to(device)


def sft_loss(model, input_ids: torch.Tensor, attention_mask: torch.Tensor, loss_mask: torch.Tensor) -> torch.Tensor:
    """Mean cross-entropy over the positions of ``loss_mask`` (B, L)."""
    logits = model(input_ids=input_ids, attention_mask=attention_mask,
                   position_ids=position_ids_from_mask(attention_mask), use_cache=False).logits
    logits = logits[:, :-1]  # (B, L-1, V): position t predicts token t+1
    target = input_ids[:, 1:]
    m = loss_mask[:, 1:]
    ce = torch.nn.functional.cross_entropy(logits[m].float(), target[m])
    return ce


def supervised_warmup(model, tokenizer, task: Task, examples: list[Example], cfg: SFTConfig, *, seed: int,
                      device: torch.device, log=None, accuracy_check=None) -> list[float]:
    """Train ``model`` in place for up to ``cfg.steps`` steps; returns the loss of each step.

    ``accuracy_check()`` (greedy accuracy on training prompts) is called every ``cfg.check_every_steps`` when
    ``cfg.stop_at_accuracy > 0``; the warm-up stops as soon as it reaches that accuracy.
    """
    if cfg.steps <= 0:
        return []
    pool = examples[: cfg.max_examples] if cfg.max_examples > 0 else examples
    gen = torch.Generator().manual_seed(seed + 7_919)
    params = [p for p in model.parameters() if p.requires_grad]
    opt = torch.optim.AdamW(params, lr=cfg.lr, weight_decay=0.0)
    model.train()
    losses = []
    for step in range(cfg.steps):
        idx = torch.randint(len(pool), (cfg.seqs_per_step,), generator=gen).tolist()
        batch = [pool[i] for i in idx]
        ids, attn, lm = encode_pairs(tokenizer, [e.prompt for e in batch],
                                     [task.reference_completion(e) for e in batch], device)
        loss = sft_loss(model, ids, attn, lm)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(params, 1.0)
        opt.step()
        losses.append(loss.item())
        if log is not None and (step + 1) % max(1, cfg.steps // 5) == 0:
            log(f"sft step {step + 1}/{cfg.steps}: loss {losses[-1]:.4f}")
        if accuracy_check is not None and cfg.stop_at_accuracy > 0 and (step + 1) % cfg.check_every_steps == 0:
            acc = accuracy_check()
            model.train()
            if acc >= cfg.stop_at_accuracy:
                if log is not None:
                    log(f"sft step {step + 1}: training-prompt greedy accuracy {acc:.3f} >= "
                        f"{cfg.stop_at_accuracy}; warm-up done")
                break
    return losses
