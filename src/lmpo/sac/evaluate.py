"""Held-out quality of a trained agent and of the n-gram baseline (the numbers the gate judges).

* Teacher-forced next-character hit: at held-out position t the model gets the true previous m characters
  (left-padded) and the legal mask of that history; top-1 hit = argmax π is c_t, top-3 hit = c_t among
  the three most probable.  Targets outside Σ (unseen in training) count as misses for every model.
* Free-running generation: from evenly spaced held-out positions, the true previous m characters are the
  prompt and the model writes L characters greedily (argmax; the legal mask follows its own history).
  4-gram coverage = share of the generated 4-grams (including the 3 prompt characters before them) that
  occur in the reference continuation (same span, same prompt tail); chrF and BLEU are sacrebleu's
  corpus scores with character tokenisation, generation vs true continuation.
* Compliance: agent-only episodes (sampling, teacher off) on an environment over the held-out chapters:
  illegal-action rate per step and early-termination rate per episode.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

from lmpo.sac.baseline import NgramModel

BASELINE_ORDERS = (2, 3, 4, 5)


def heldout_positions(chapters: list[str], max_positions: int) -> list[tuple[int, int]]:
    """(chapter, position ≥ 1) pairs, every position or an evenly spaced subset of ``max_positions``."""
    allpos = [(ci, p) for ci, text in enumerate(chapters) for p in range(1, len(text))]
    if max_positions and len(allpos) > max_positions:
        idx = np.linspace(0, len(allpos) - 1, max_positions).round().astype(int)
        allpos = [allpos[i] for i in idx]
    return allpos


def left_padded_window(ids: list[int], p: int, m: int, pad_id: int) -> np.ndarray:
    """The observation window before position p: ids[p−m:p], left-padded with ``pad_id`` to (m,)."""
    tail = ids[max(0, p - m):p]
    win = np.full(m, pad_id, dtype=np.int64)
    if tail:
        win[m - len(tail):] = tail
    return win


@torch.no_grad()
def agent_teacher_forced(agent, alphabet, compliance, chapters: list[str], positions, m: int,
                         batch: int = 512) -> dict[str, float]:
    enc = [alphabet.encode(t) for t in chapters]
    hits1 = hits3 = 0
    for s in range(0, len(positions), batch):
        chunk = positions[s:s + batch]
        wins = np.stack([left_padded_window(enc[ci], p, m, alphabet.pad_id) for ci, p in chunk])
        masks = np.stack([compliance.mask(enc[ci][:p])[0].astype(bool) for ci, p in chunk])
        agent.policy.eval()
        probs, _ = agent.policy(torch.as_tensor(wins, device=agent.device),
                                torch.as_tensor(masks, device=agent.device))
        agent.policy.train()
        top3 = probs.topk(3, dim=-1).indices.cpu().numpy()
        tgt = np.array([enc[ci][p] for ci, p in chunk])
        known = tgt != alphabet.unk_id
        hits1 += int(((top3[:, 0] == tgt) & known).sum())
        hits3 += int(((top3 == tgt[:, None]).any(-1) & known).sum())
    n = max(1, len(positions))
    return {"top1": hits1 / n, "top3": hits3 / n, "positions": len(positions)}


def baseline_teacher_forced(model: NgramModel, chapters: list[str], positions) -> dict[str, float]:
    hits1 = hits3 = 0
    for ci, p in positions:
        pred = model.top_k(chapters[ci][:p], 3)
        tgt = chapters[ci][p]
        hits1 += int(bool(pred) and pred[0] == tgt)
        hits3 += int(tgt in pred)
    n = max(1, len(positions))
    return {"top1": hits1 / n, "top3": hits3 / n, "positions": len(positions)}


def generation_prompts(chapters: list[str], m: int, count: int, length: int) -> list[tuple[int, int]]:
    cands = [(ci, p) for ci, t in enumerate(chapters) for p in range(m, len(t) - length)]
    if not cands:
        cands = [(ci, p) for ci, t in enumerate(chapters) for p in range(1, max(2, len(t) - 1))]
    idx = np.linspace(0, len(cands) - 1, min(count, len(cands))).round().astype(int)
    return [cands[i] for i in idx]


@torch.no_grad()
def agent_generate(agent, alphabet, compliance, prompt: str, m: int, length: int) -> str:
    ids = alphabet.encode(prompt)
    out: list[int] = []
    for _ in range(length):
        hist = ids + out
        win = left_padded_window(hist, len(hist), m, alphabet.pad_id)[None]
        mask = compliance.mask(hist)[0].astype(bool)[None]
        a, _ = agent.act(win, mask, greedy=True)
        a = int(a[0])
        if a == alphabet.eos_id:
            break
        out.append(a)
    return alphabet.decode(out)


def ngram_coverage(prompt_tail: str, generated: str, reference: str, n: int = 4) -> float:
    """Share of the n-grams of ``prompt_tail + generated`` that start in ``generated`` … (see module doc)."""
    g = prompt_tail + generated
    r = prompt_tail + reference
    gen = [g[i:i + n] for i in range(len(g) - n + 1)]
    ref = {r[i:i + n] for i in range(len(r) - n + 1)}
    gen = gen[max(0, len(prompt_tail) - n + 1):]  # only n-grams that contain a generated character
    return sum(x in ref for x in gen) / len(gen) if gen else 0.0


def text_scores(hyps: list[str], refs: list[str]) -> dict[str, float]:
    from sacrebleu.metrics import BLEU, CHRF

    bleu = BLEU(tokenize="char", effective_order=True).corpus_score(hyps, [refs]).score
    chrf = CHRF().corpus_score(hyps, [refs]).score
    return {"bleu": bleu, "chrf": chrf}


def compare_generations(agent, model: NgramModel, alphabet, compliance, chapters: list[str], m: int,
                        count: int, length: int) -> dict[str, Any]:
    prompts = generation_prompts(chapters, m, count, length)
    rows = {"agent": [], "baseline": []}
    refs = []
    for ci, p in prompts:
        prompt, ref = chapters[ci][max(0, p - m):p], chapters[ci][p:p + length]
        refs.append(ref)
        rows["agent"].append(agent_generate(agent, alphabet, compliance, prompt, m, length))
        rows["baseline"].append(model.generate(chapters[ci][:p], length))
    out: dict[str, Any] = {}
    for who, hyps in rows.items():
        cov = [ngram_coverage(chapters[ci][max(0, p - 3):p], h, r) for (ci, p), h, r in zip(prompts, hyps, refs)]
        out[who] = {"coverage4": float(np.mean(cov)) if cov else 0.0, **text_scores(hyps, refs),
                    "examples": [{"prompt": chapters[ci][max(0, p - 12):p], "generated": h, "reference": r}
                                 for (ci, p), h, r in list(zip(prompts, hyps, refs))[:3]]}
    return out


def rollout_compliance(agent, make_env, chapters: list[str], episodes: int, seed: int) -> dict[str, float]:
    env = make_env(chapters)
    steps = illegal = early = 0
    for ep in range(episodes):
        obs, _ = env.reset(seed=seed * 7919 + ep)
        done = False
        while not done:
            a, _ = agent.act(obs["window"][None], obs["legal_mask"][None].astype(bool))
            obs, _, term, trunc, info = env.step(int(a[0]))
            steps += 1
            illegal += int(bool(info.get("is_illegal", False)))
            if term and int(info.get("teacher_action", -1)) != env.alphabet.eos_id:
                early += 1
            done = term or trunc
    return {"illegal_rate": illegal / max(1, steps), "early_termination_rate": early / max(1, episodes),
            "steps": steps, "episodes": episodes}


def evaluate_run(agent, bundle, cfg) -> dict[str, Any]:
    """All held-out numbers for one trained agent, plus the n-gram baselines on the same positions."""
    alphabet, heldout, m = bundle.alphabet, bundle.heldout_chapters, bundle.window
    compliance = bundle.envs[0].compliance
    positions = heldout_positions(heldout, cfg.eval_max_positions)
    res: dict[str, Any] = {"agent": agent_teacher_forced(agent, alphabet, compliance, heldout, positions, m)}
    baselines = {}
    for order in BASELINE_ORDERS:
        model = NgramModel(order).fit(bundle.train_chapters)
        baselines[str(order)] = baseline_teacher_forced(model, heldout, positions)
    best = max(baselines, key=lambda k: baselines[k]["top1"])
    res["baseline_by_order"] = baselines
    res["baseline_order"] = int(best)
    res["baseline"] = baselines[best]
    gen = compare_generations(agent, NgramModel(int(best)).fit(bundle.train_chapters), alphabet, compliance,
                              heldout, m, cfg.eval_generations, cfg.eval_generation_chars)
    res["generation"] = gen
    if bundle.make_eval_env is not None:
        res["compliance"] = rollout_compliance(agent, bundle.make_eval_env, heldout, episodes=cfg.eval_rollout_episodes,
                                               seed=cfg.seed)
    return res
