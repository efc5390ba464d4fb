"""The supervised twin: the SAC policy network trained by cross-entropy on the same text (``lmpo sac reference``).

It answers "what does imitation alone reach with this network and this text?", the bar the RL stage must not
fall below, and it is the starting point of the RL stage (``init_policy``). Same network (``PolicyNetwork`` of
the run's ``net`` section, same legal masking), same training text (the train chapters of ``corpus`` plus the
filtered ``extra_train_corpus``), same held-out protocol (:func:`lmpo.textagent.sac.evaluate.evaluate_run`).

Training: AdamW on ``−log π(c_t | window)`` over every position of the training text, ``batch`` windows per
step, a fixed number of steps with the learning rate decayed to 0 on a cosine (Loshchilov & Hutter 2017,
arXiv 1608.03983) so that the final model is a settled one; no early stopping on the held-out chapters: the
number reported is the final model's. The held-out top-1 curve is logged every ``eval_every`` steps for reading only.

Ceiling (an optimistic upper bound, not a fair number): ``λ·π + (1−λ)·S_ngram`` with the Analects-only n-gram
scores normalised per position, λ picked on the held-out chapters themselves.

Run directory: ``config.yaml``, ``policy.safetensors`` (the trained policy's weights), ``metrics.jsonl``,
``eval.json`` and ``summary.json`` (``kind: reference``; the gate reads it as the reference row).
"""

from __future__ import annotations

import json
import math
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F

from lmpo.errors import InputError
from lmpo.runs import write_run_config
from lmpo.textagent.sac.config import POLICY_FILE
from lmpo.textagent.sac.textdata import TextPairs
from lmpo.textagent.sac.weights import alphabet_digest

INTERPOLATION_LAMBDAS = (0.3, 0.5, 0.7, 0.9)


@torch.no_grad()
def interpolation(agent, bundle, positions, order: int) -> dict[str, Any]:
    """Held-out top-1 / top-3 of ``λ·π + (1−λ)·S_order`` for each λ (λ chosen on the held-out set: a bound)."""
    from lmpo.textagent.sac.baseline import NgramModel
    from lmpo.textagent.sac.evaluate import left_padded_window

    alphabet, chapters, m = bundle.alphabet, bundle.heldout_chapters, bundle.window
    compliance = bundle.envs[0].compliance
    ngram = NgramModel(order).fit(bundle.train_chapters)
    enc = [alphabet.encode(t) for t in chapters]
    targets = np.array([enc[ci][p] for ci, p in positions])
    known = targets != alphabet.unk_id
    out: dict[str, Any] = {"order": order, "by_lambda": {}}
    agent.policy.eval()
    for s in range(0, len(positions), 512):
        chunk = positions[s:s + 512]
        wins = np.stack([left_padded_window(enc[ci], p, m, alphabet.pad_id) for ci, p in chunk])
        masks = np.stack([compliance.mask(enc[ci][:p])[0].astype(bool) for ci, p in chunk])
        probs, _ = agent.policy(torch.as_tensor(wins), torch.as_tensor(masks))
        ng = np.zeros(probs.shape, dtype=np.float32)
        for row, (ci, p) in enumerate(chunk):
            for ch, score in ngram.scores(chapters[ci][:p]).items():
                ng[row, alphabet.encode(ch)[0]] = score
        ng /= np.maximum(ng.sum(-1, keepdims=True), 1e-12)
        tgt, kn = targets[s:s + len(chunk)], known[s:s + len(chunk)]
        for lam in INTERPOLATION_LAMBDAS:
            top3 = np.argsort(-(lam * probs.numpy() + (1 - lam) * ng), axis=-1)[:, :3]
            acc = out["by_lambda"].setdefault(str(lam), [0, 0])
            acc[0] += int(((top3[:, 0] == tgt) & kn).sum())
            acc[1] += int(((top3 == tgt[:, None]).any(-1) & kn).sum())
    agent.policy.train()
    n = max(1, len(positions))
    out["by_lambda"] = {lam: {"top1": h1 / n, "top3": h3 / n} for lam, (h1, h3) in out["by_lambda"].items()}
    out["top1"] = max(v["top1"] for v in out["by_lambda"].values())
    out["top3"] = max(v["top3"] for v in out["by_lambda"].values())
    return out


def train_reference(cfg, run_dir: str | Path, *, steps: int = 6000, batch: int = 256, lr: float = 1e-3,
                    weight_decay: float = 0.01, eval_every: int = 500, overwrite: bool = False,
                    progress: bool = True) -> dict[str, Any]:
    """Train the supervised twin of ``cfg``'s policy on ``cfg``'s training text; write the run directory."""
    from safetensors.torch import save_file

    from lmpo.checkpoints import replace_file
    from lmpo.runs import JsonlAppender
    from lmpo.textagent.sac.agent import SACAgent
    from lmpo.textagent.sac.config import apply_overrides
    from lmpo.textagent.sac.evaluate import agent_teacher_forced, evaluate_run, heldout_positions
    from lmpo.textagent.sac.train import make_text_envs, seed_everything

    run = Path(run_dir)
    if run.exists() and any(run.iterdir()) and not overwrite:
        raise InputError(f"--run-dir {str(run)!r} is not empty; pass --overwrite to replace it or choose another "
                         "directory.")
    run.mkdir(parents=True, exist_ok=True)
    for name in ("metrics.jsonl", "summary.json", "eval.json", POLICY_FILE):
        (run / name).unlink(missing_ok=True)
    if cfg.threads > 0:
        torch.set_num_threads(cfg.threads)
    cfg = apply_overrides(cfg, {"num_envs": 1, "init_policy": ""})
    write_run_config(run, cfg.to_dict())
    seed_everything(cfg.seed)
    bundle = make_text_envs(cfg)
    alphabet, compliance, m = bundle.alphabet, bundle.envs[0].compliance, bundle.window
    agent = SACAgent(bundle.num_actions, bundle.pad_id, cfg.net, cfg.sac, seed=cfg.seed, device="cpu")
    pairs = TextPairs(bundle.train_chapters, bundle.extra_chapters, alphabet, compliance, m)
    positions = heldout_positions(bundle.heldout_chapters, cfg.eval_max_positions)
    if progress:
        print(f"reference: {len(pairs):,} training pairs ({pairs.num_corpus:,} of `corpus`, drawn at share "
              f"{cfg.corpus_share}), |Σ| {bundle.num_actions:,}, {steps} steps of {batch}", file=sys.stderr)
    opt = torch.optim.AdamW(agent.policy.parameters(), lr=lr, weight_decay=weight_decay)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda i: 0.5 * (1 + math.cos(math.pi * min(i, steps) / steps)))
    gen = torch.Generator().manual_seed(cfg.seed)
    metrics = JsonlAppender(run / "metrics.jsonl")
    curve: list[list[float]] = []
    start = time.time()
    for step in range(1, steps + 1):
        windows, masks, targets = pairs.batch(pairs.sample(
            batch, cfg.corpus_share, lambda lo, hi, n: torch.randint(lo, hi, (n,), generator=gen)))
        _, logp = agent.policy(windows, masks)
        loss = F.nll_loss(logp, targets)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        sched.step()
        if step % eval_every == 0 or step == steps:
            res = agent_teacher_forced(agent, alphabet, compliance, bundle.heldout_chapters, positions, m)
            row = {"step": step, "seconds": time.time() - start, "train_ce": float(loss.detach()),
                   "quality/heldout_top1": res["top1"], "quality/heldout_top3": res["top3"]}
            curve.append([step, res["top1"]])
            metrics.append(row)
            if progress:
                print(f"reference step {step:6d} {row['seconds']:6.0f} s  train CE {row['train_ce']:.3f}  held-out "
                      f"top-1 {res['top1']:.4f} top-3 {res['top3']:.4f}", file=sys.stderr, flush=True)
    train_seconds = time.time() - start
    metrics.close()
    meta = {"alphabet_sha256": alphabet_digest(alphabet), "alphabet_size": str(len(alphabet)), "steps": str(steps)}
    save_file({k: v.contiguous() for k, v in agent.policy.state_dict().items()}, str(run / POLICY_FILE),
              metadata=meta)
    ev = evaluate_run(agent, bundle, cfg)
    ev["interpolation"] = interpolation(agent, bundle, positions, ev["baseline_order"])
    replace_file(run / "eval.json", json.dumps(ev, indent=2, ensure_ascii=False).encode("utf-8"))
    summary = {"kind": "reference", "config": cfg.to_dict(), "steps": steps, "batch": batch, "lr": lr,
               "weight_decay": weight_decay, "train_seconds": train_seconds, "training_pairs": len(pairs),
               "corpus_pairs": pairs.num_corpus,
               "num_actions": bundle.num_actions, "extra_text": bundle.extra_report, "heldout_top1_curve": curve,
               "eval": ev}
    replace_file(run / "summary.json", json.dumps(summary, indent=2, ensure_ascii=False).encode("utf-8"))
    return summary
