"""Held-out top-1 of a plain supervised next-character model: the reference point for the SAC gate.

The SAC agent's policy network (``PolicyNetwork``: embedding + GRU + MLP head, the same masking) trained by
cross-entropy on every ``(window, next character)`` pair of the train chapters, scored with the gate's
teacher-forced protocol on the held-out chapters, beside the n-gram baselines, and interpolated with the 5-gram
model.  It answers "how far can a model trained only on these chapters get?", which bounds what the RL agent
can reach on top-1 (docs/sac.md, "The real run").

    .venv/bin/python examples/sac/supervised_reference.py --seconds 240
    .venv/bin/python examples/sac/supervised_reference.py --embed 64 --hidden 128 --dropout 0.3
"""

from __future__ import annotations

import argparse
import time

import numpy as np
import torch
import torch.nn.functional as F

from lmpo.sac.agent import SACAgent
from lmpo.sac.baseline import NgramModel
from lmpo.sac.config import TrainConfig, apply_overrides
from lmpo.sac.evaluate import (
    BASELINE_ORDERS,
    agent_teacher_forced,
    baseline_teacher_forced,
    heldout_positions,
    left_padded_window,
)
from lmpo.sac.train import make_text_envs


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--corpus", default="/work/shared/data/lunyu.simplified.json")
    ap.add_argument("--window", type=int, default=16, help="m, characters of context")
    ap.add_argument("--embed", type=int, default=128)
    ap.add_argument("--hidden", type=int, default=256, help="GRU width")
    ap.add_argument("--dropout", type=float, default=0.3)
    ap.add_argument("--weight-decay", type=float, default=0.01)
    ap.add_argument("--lr", type=float, default=1e-3)
    ap.add_argument("--batch", type=int, default=256, help="windows per step")
    ap.add_argument("--seconds", type=float, default=240.0, help="training time budget")
    ap.add_argument("--eval-every-steps", type=int, default=250)
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()

    torch.set_num_threads(1)
    cfg = apply_overrides(TrainConfig(), {
        "corpus": args.corpus, "seed": args.seed, "num_envs": 1,
        "env": {"window_chars": args.window, "nce_pretrain_steps": 0, "use_jieba_lexicon": False},
        "net": {"embed_dim": args.embed, "gru_hidden": args.hidden, "dropout": args.dropout},
    })
    torch.manual_seed(args.seed)
    bundle = make_text_envs(cfg)
    alphabet, m = bundle.alphabet, bundle.window
    positions = heldout_positions(bundle.heldout_chapters, cfg.eval_max_positions)
    for order in BASELINE_ORDERS:
        res = baseline_teacher_forced(NgramModel(order).fit(bundle.train_chapters), bundle.heldout_chapters,
                                      positions)
        print(f"{order}-gram baseline: top-1 {res['top1']:.4f} top-3 {res['top3']:.4f}")

    agent = SACAgent(bundle.num_actions, bundle.pad_id, cfg.net, cfg.sac, seed=args.seed)
    compliance = bundle.envs[0].compliance
    windows, masks, targets = [], [], []
    for text in bundle.train_chapters:
        ids = alphabet.encode(text)
        for p in range(1, len(ids)):
            windows.append(left_padded_window(ids, p, m, alphabet.pad_id))
            masks.append(compliance.mask(ids[:p])[0].astype(bool))
            targets.append(ids[p])
    X, M, Y = torch.as_tensor(np.stack(windows)), torch.as_tensor(np.stack(masks)), torch.as_tensor(targets)
    keep = M[torch.arange(len(Y)), Y]  # a target the mask forbids cannot be predicted: leave it out
    X, M, Y = X[keep], M[keep], Y[keep]
    print(f"train pairs {len(Y)}, held-out positions {len(positions)}, |Σ| {bundle.num_actions}")

    # n-gram score vectors on the held-out positions, normalised to sum to 1, for the interpolation upper bound
    ngram = NgramModel(5).fit(bundle.train_chapters)
    ngram_p = np.zeros((len(positions), bundle.num_actions), dtype=np.float32)
    for row, (ci, p) in enumerate(positions):
        for ch, score in ngram.scores(bundle.heldout_chapters[ci][:p]).items():
            ngram_p[row, alphabet.encode(ch)[0]] = score
    ngram_p /= np.maximum(ngram_p.sum(-1, keepdims=True), 1e-12)
    targets_ho = np.array([alphabet.encode(bundle.heldout_chapters[ci][p])[0] for ci, p in positions])
    known = targets_ho != alphabet.unk_id

    opt = torch.optim.AdamW(agent.policy.parameters(), lr=args.lr, weight_decay=args.weight_decay)
    gen = torch.Generator().manual_seed(args.seed)
    start, step, best, best_mix = time.time(), 0, (0.0, 0), (0.0, 0)
    while time.time() - start < args.seconds:
        idx = torch.randint(0, len(Y), (args.batch,), generator=gen)
        _, logp = agent.policy(X[idx], M[idx])
        loss = F.nll_loss(logp, Y[idx])
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        step += 1
        if step % args.eval_every_steps == 0:
            res = agent_teacher_forced(agent, alphabet, compliance, bundle.heldout_chapters, positions, m)
            best = max(best, (res["top1"], step))
            mix = interpolation_top1(agent, alphabet, compliance, bundle.heldout_chapters, positions, m, ngram_p,
                                     targets_ho, known)
            best_mix = max(best_mix, (max(mix.values()), step))
            print(f"step {step:6d} {time.time() - start:6.0f} s  train CE {loss.item():.3f}  "
                  f"held-out top-1 {res['top1']:.4f} top-3 {res['top3']:.4f}  "
                  + "  ".join(f"mix λ={lam}: {v:.4f}" for lam, v in mix.items()), flush=True)
    print(f"best held-out top-1 {best[0]:.4f} at step {best[1]}; best interpolation with the 5-gram model "
          f"{best_mix[0]:.4f} at step {best_mix[1]} (λ and step chosen on the held-out set: an upper bound)")


@torch.no_grad()
def interpolation_top1(agent, alphabet, compliance, chapters, positions, m, ngram_p, targets, known,
                       lambdas=(0.3, 0.5, 0.7)) -> dict[float, float]:
    """Top-1 of λ·π(·|o) + (1−λ)·S_5gram(·|history) on the held-out positions, for each λ."""
    enc = [alphabet.encode(t) for t in chapters]
    wins = np.stack([left_padded_window(enc[ci], p, m, alphabet.pad_id) for ci, p in positions])
    masks = np.stack([compliance.mask(enc[ci][:p])[0].astype(bool) for ci, p in positions])
    agent.policy.eval()
    probs, _ = agent.policy(torch.as_tensor(wins), torch.as_tensor(masks))
    agent.policy.train()
    probs = probs.numpy()
    return {lam: float((((lam * probs + (1 - lam) * ngram_p).argmax(-1) == targets) & known).mean())
            for lam in lambdas}


if __name__ == "__main__":
    main()
