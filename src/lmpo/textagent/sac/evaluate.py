"""Held-out quality of a trained agent and of the n-gram baseline (the numbers the gate judges).

* Teacher-forced next-character hit: at held-out position t the model gets the true previous m characters
  (left-padded) and the legal mask of that history; top-1 hit = argmax π is c_t, top-3 hit = c_t among
  the three most probable.  Targets outside Σ (unseen in training) count as misses for every model.
* Free-running generation: from evenly spaced held-out positions, the true previous m characters are the
  prompt and the model writes L characters greedily (argmax; the legal mask follows its own history).
  4-gram coverage = share of the generated 4-grams (including the 3 prompt characters before them) that
  occur in the reference continuation (same span, same prompt tail); chrF and BLEU are sacrebleu's
  corpus scores with character tokenisation, generation vs true continuation.  With
  ``eval_no_repeat_ngram = n > 0`` the agent's greedy decoding never completes an n-gram already in its own
  output (the n-gram baseline decodes plain greedy).  ``repeat4`` = share of a continuation's 4-grams that
  already occurred earlier in the same continuation (agent, baseline, and the true continuations).
* Baselines: stupid-backoff n-gram models of orders 2–5 fitted on ``bundle.train_chapters`` (the base
  corpus's train chapters only, never ``extra_train_corpus``).  ``baseline`` is the best order by top-1 (as
  before); ``baseline_best`` names the best order separately for each metric (top1, top3, coverage4, chrf,
  bleu).
* Compliance: agent-only episodes (sampling, teacher off) on an environment over the held-out chapters:
  illegal-action rate per step and early-termination rate per episode.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

from lmpo.textagent.sac.baseline import NgramModel

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
def agent_generate(agent, alphabet, compliance, prompt: str, m: int, length: int, no_repeat_ngram: int = 0) -> str:
    """Greedy continuation of ``prompt`` (up to ``length`` characters, stopping at ``<eos>``).

    ``no_repeat_ngram = n > 0``: never emit a character that would complete an n-gram already present in the
    generated output (the prompt does not count); the most probable legal character that does not is taken
    instead, and plain greedy when every legal character is blocked. ``0`` is plain greedy (argmax of π).
    """
    ids = alphabet.encode(prompt)
    out: list[int] = []
    n = int(no_repeat_ngram)
    seen: dict[tuple[int, ...], set[int]] = {}  # (n−1)-gram of the output → ids that followed it
    for _ in range(length):
        hist = ids + out
        win = left_padded_window(hist, len(hist), m, alphabet.pad_id)[None]
        mask = compliance.mask(hist)[0].astype(bool)[None]
        banned = seen.get(tuple(out[len(out) - n + 1:]) if n > 1 else ()) if n > 0 and len(out) >= n - 1 else None
        if banned:
            # π renormalised over fewer legal actions keeps their order: argmax over the rest is the most
            # probable character that completes no repeated n-gram
            allowed = mask.copy()
            allowed[0, list(banned)] = False
            mask = allowed if allowed.any() else mask
        a = int(agent.act(win, mask, greedy=True)[0][0])
        if a == alphabet.eos_id:
            break
        out.append(a)
        if n > 0 and len(out) >= n:
            seen.setdefault(tuple(out[len(out) - n:len(out) - 1]), set()).add(a)
    return alphabet.decode(out)


def repeat_share(text: str, n: int = 4) -> float:
    """Share of the n-grams of ``text`` that already occurred earlier in ``text`` (0 when it has none)."""
    grams = [text[i:i + n] for i in range(len(text) - n + 1)]
    seen: set[str] = set()
    rep = 0
    for g in grams:
        rep += g in seen
        seen.add(g)
    return rep / len(grams) if grams else 0.0


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


def _generation_scores(prompts, chapters: list[str], hyps: list[str], refs: list[str],
                       examples: int = 0) -> dict[str, Any]:
    cov = [ngram_coverage(chapters[ci][max(0, p - 3):p], h, r) for (ci, p), h, r in zip(prompts, hyps, refs)]
    out: dict[str, Any] = {"coverage4": float(np.mean(cov)) if cov else 0.0, **text_scores(hyps, refs),
                           "repeat4": float(np.mean([repeat_share(h) for h in hyps])) if hyps else 0.0}
    if examples:
        out["examples"] = [{"prompt": chapters[ci][max(0, p - 12):p], "generated": h, "reference": r}
                           for (ci, p), h, r in list(zip(prompts, hyps, refs))[:examples]]
    return out


def compare_generations(agent, model: NgramModel, alphabet, compliance, chapters: list[str], m: int,
                        count: int, length: int, no_repeat_ngram: int = 0,
                        baselines: dict[int, NgramModel] | None = None) -> dict[str, Any]:
    """Free-running continuations of the agent and of ``model`` from the same prompts, scored against the text.

    ``baselines`` (order → fitted model): also score each of them (``baseline_by_order``). ``reference`` holds
    the repetition share of the true continuations themselves.
    """
    prompts = generation_prompts(chapters, m, count, length)
    rows = {"agent": [], "baseline": []}
    refs = []
    for ci, p in prompts:
        prompt, ref = chapters[ci][max(0, p - m):p], chapters[ci][p:p + length]
        refs.append(ref)
        rows["agent"].append(agent_generate(agent, alphabet, compliance, prompt, m, length, no_repeat_ngram))
        rows["baseline"].append(model.generate(chapters[ci][:p], length))
    out: dict[str, Any] = {who: _generation_scores(prompts, chapters, hyps, refs, examples=3)
                           for who, hyps in rows.items()}
    out["reference"] = {"repeat4": float(np.mean([repeat_share(r) for r in refs])) if refs else 0.0}
    if baselines:
        out["baseline_by_order"] = {
            str(k): _generation_scores(prompts, chapters, [b.generate(chapters[ci][:p], length) for ci, p in prompts],
                                       refs)
            for k, b in baselines.items()}
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


def best_orders(baselines: dict[str, dict[str, float]], generation: dict[str, dict[str, float]] | None = None
                ) -> dict[str, dict[str, float | int]]:
    """{metric: {"order", "value"}}: the best n-gram order for each metric (ties: the lowest order).

    ``baselines`` = ``baseline_by_order`` (teacher-forced top1 / top3); ``generation`` = the free-running scores
    per order (coverage4 / chrf / bleu).
    """
    out: dict[str, dict[str, float | int]] = {}
    for table, metrics in ((baselines, ("top1", "top3")), (generation or {}, ("coverage4", "chrf", "bleu"))):
        orders = sorted(table, key=int)
        for key in metrics:
            if orders and all(key in table[o] for o in orders):
                best = max(orders, key=lambda o: (table[o][key], -int(o)))
                out[key] = {"order": int(best), "value": table[best][key]}
    return out


def evaluate_run(agent, bundle, cfg) -> dict[str, Any]:
    """All held-out numbers for one trained agent, plus the n-gram baselines on the same positions.

    The baselines are fitted on ``bundle.train_chapters`` only (the base corpus's train chapters, never the
    extra training text): ``baseline`` / ``baseline_order`` is the best order by top-1 (the free-running
    ``generation.baseline`` uses it too), ``baseline_best`` the best order per metric.
    """
    alphabet, heldout, m = bundle.alphabet, bundle.heldout_chapters, bundle.window
    compliance = bundle.envs[0].compliance
    positions = heldout_positions(heldout, cfg.eval_max_positions)
    res: dict[str, Any] = {"agent": agent_teacher_forced(agent, alphabet, compliance, heldout, positions, m)}
    baselines, models = {}, {}
    for order in BASELINE_ORDERS:
        models[order] = NgramModel(order).fit(bundle.train_chapters)
        baselines[str(order)] = baseline_teacher_forced(models[order], heldout, positions)
    best = max(baselines, key=lambda k: baselines[k]["top1"])
    res["baseline_by_order"] = baselines
    res["baseline_order"] = int(best)
    res["baseline"] = baselines[best]
    gen = compare_generations(agent, models[int(best)], alphabet, compliance, heldout, m, cfg.eval_generations,
                              cfg.eval_generation_chars, no_repeat_ngram=getattr(cfg, "eval_no_repeat_ngram", 0),
                              baselines=models)
    res["generation"] = gen
    res["baseline_best"] = best_orders(baselines, gen.get("baseline_by_order"))
    if bundle.make_eval_env is not None:
        res["compliance"] = rollout_compliance(agent, bundle.make_eval_env, heldout, episodes=cfg.eval_rollout_episodes,
                                               seed=cfg.seed)
    return res
