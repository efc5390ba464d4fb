"""The RLVCR trainer stage (docs/rlvcr.md): expand successful completions into one sample per thinking level,
score their thinking, and compute the mixed advantages.

Between scoring and the update, for a rollout of B completions::

    1. expansion: every original with reward > success_threshold and a ``<think>…</think>action`` completion
       takes the level whose budget its thinking fits; for each of the other L − 1 levels the policy
       regenerates the thinking under the level instruction with ``max_new_tokens = budget`` (+ the closing
       tag), cut at ``</think>`` / EOS / the budget, and the original action follows it. The new samples are
       appended after the B originals (rows B … B'−1) in the ``Rollout`` layout, so they train like any other.
    2. thinking reward per member of a thinking group: confidence (mean probability of the action tokens,
       teacher-forced, one batched forward) − λ_cost · thinking tokens / max budget.
    3. advantages: :func:`lmpo.rlvcr.advantages.rlvcr_advantages`.

``rlvcr_stage`` runs the three and returns the expanded rollout, advantages, the rows to train on and
``rlvcr/...`` metrics (expanded count, confidence / cost / thinking reward / thinking advantage per level, the
levels chosen by the originals).
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass

import torch

from lmpo.generation import HFRollout, Rollout, eos_token_ids
from lmpo.rlvcr.advantages import rlvcr_advantages
from lmpo.rlvcr.config import EXPANSION_LOSS_MODES, RLVCRConfig
from lmpo.rlvcr.thinking import (
    assign_levels,
    cut_generated_thinking,
    level_instruction,
    locate_thinking,
    teacher_forced_confidence,
    thinking_cost,
    thinking_reward,
)

Tensor = torch.Tensor


@dataclass
class Expansion:
    """An expanded batch of B' = B + E rows: the B originals (same order), then E regenerated samples.

    rollout:           the B' sequences in the ``Rollout`` layout (originals re-padded, content unchanged).
    rewards:           (B',) the originals' rewards; an expanded row carries its original's (same action).
    source:            (B',) long, the row of the original each sample comes from (itself for originals).
    is_original:       (B',) bool.
    thinking_group_id: (B',) long, 0 … K−1 for the K expanded families, −1 for originals not expanded.
    level:             (B',) long, thinking level 1 … L inside a family, 0 outside.
    thinking_tokens:   (B',) long, thinking length in tokens, −1 where no thinking block was found.
    action_start:      (B',) long, offset of the action in the completion, −1 where no block was found.
    sampled_start:     (B',) long, offset in the completion where the tokens the policy sampled begin: 0 for an
                       original, the end of the copied opening tag for an expanded row. None: unknown (an
                       ``Expansion`` built by hand), read as 0.
    sampled_end:       (B',) long, where they end: an expanded row's regenerated thinking, plus the closing tag
                       when the regeneration wrote it itself (not when the budget or an EOS cut it); an
                       original's completion length. None: unknown, read as ``action_start``.
    successes:         originals with reward > success_threshold.
    unparseable:       successful originals that were not expanded because no ``open…close`` block was found.
    """

    rollout: Rollout
    rewards: Tensor
    source: Tensor
    is_original: Tensor
    thinking_group_id: Tensor
    level: Tensor
    thinking_tokens: Tensor
    action_start: Tensor
    successes: int
    unparseable: int
    sampled_start: Tensor | None = None
    sampled_end: Tensor | None = None

    @property
    def num_expanded(self) -> int:
        return int((~self.is_original).sum())


def _tag_ids(tokenizer, tag: str) -> list[int]:
    ids = tokenizer(tag, add_special_tokens=False)["input_ids"]
    if not ids:
        raise ValueError(f"the tokenizer encodes the thinking tag {tag!r} to no tokens; set rlvcr.think_open / "
                         "rlvcr.think_close to the tags your model writes.")
    return list(ids)


def _pack(prompt_rows: Sequence[list[int]], completion_rows: Sequence[list[int]], pad: int, device
          ) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """Left-padded prompts (B, P) and right-padded completions (B, T) with their masks."""
    B = len(prompt_rows)
    P = max(len(p) for p in prompt_rows)
    T = max(max(len(c) for c in completion_rows), 1)
    prompt_ids = torch.full((B, P), pad, dtype=torch.long)
    prompt_mask = torch.zeros((B, P), dtype=torch.long)
    completion_ids = torch.full((B, T), pad, dtype=torch.long)
    completion_mask = torch.zeros((B, T), dtype=torch.long)
    for i, (p, c) in enumerate(zip(prompt_rows, completion_rows)):
        prompt_ids[i, P - len(p):] = torch.tensor(p, dtype=torch.long)
        prompt_mask[i, P - len(p):] = 1
        if c:
            completion_ids[i, :len(c)] = torch.tensor(c, dtype=torch.long)
            completion_mask[i, :len(c)] = 1
    return prompt_ids.to(device), prompt_mask.to(device), completion_ids.to(device), completion_mask.to(device)


@torch.no_grad()
def expand_thinking_levels(
    model,
    tokenizer,
    rollout: Rollout,
    rewards: Tensor,
    cfg: RLVCRConfig,
    *,
    temperature: float = 1.0,
    top_p: float = 1.0,
    top_k: int = 0,
    generator: torch.Generator | None = None,
) -> Expansion:
    """Expand every successful original into L samples, one per thinking level (docs/rlvcr.md).

    Args:
        model, tokenizer: the current policy (generation runs in eval mode without gradient).
        rollout: B originals; ``completion_mask`` covers the tokens up to and including EOS.
        rewards: (B,) total rewards; originals with reward > ``cfg.success_threshold`` are expanded.
        temperature, top_p, top_k: sampling of the regenerated thinking (the rollout's by default in the loop).
        generator: randomness of the regeneration.
    """
    B = len(rollout)
    if tuple(rewards.shape) != (B,):
        raise ValueError(f"expand_thinking_levels: rewards has shape {tuple(rewards.shape)}, expected ({B},) — "
                         "one total reward per completion of the rollout.")
    open_ids, close_ids = _tag_ids(tokenizer, cfg.think_open), _tag_ids(tokenizer, cfg.think_close)
    pad = tokenizer.pad_token_id
    eos = eos_token_ids(tokenizer, model)
    stop_ids = sorted(eos | ({pad} if pad is not None else set()))
    L, budgets = cfg.levels, cfg.budgets

    prompt_rows: list[list[int]] = []
    full: list[list[int]] = []  # completion tokens up to and including EOS
    bodies: list[list[int]] = []  # the same without the final EOS
    spans = []
    p_ids, p_mask = rollout.prompt_ids.tolist(), rollout.prompt_mask.tolist()
    c_ids, c_mask = rollout.completion_ids.tolist(), rollout.completion_mask.tolist()
    for i in range(B):
        prompt_rows.append([t for t, m in zip(p_ids[i], p_mask[i]) if m])
        comp = [t for t, m in zip(c_ids[i], c_mask[i]) if m]
        has_eos = bool(comp) and comp[-1] in eos
        body = comp[:-1] if has_eos else comp
        full.append(comp)
        bodies.append(body)
        span = locate_thinking(body, open_ids, close_ids, max_prefix_tokens=len(body))
        # Only whitespace may precede the opening tag (chat models often start with a newline).
        if span is not None and tokenizer.decode(body[:span.open_end - len(open_ids)]).strip():
            span = None
        spans.append(span)

    success = (rewards.detach().float().cpu() > cfg.success_threshold).tolist()
    thinking_tokens = [s.thinking_tokens if s is not None else -1 for s in spans]
    action_start = [s.close_end if s is not None else -1 for s in spans]
    group = [-1] * B
    level = [0] * B
    requests: dict[int, list[int]] = {lvl: [] for lvl in range(1, L + 1)}  # level -> original rows
    num_groups = 0
    unparseable = 0
    for i in range(B):
        if not success[i]:
            continue
        if spans[i] is None:
            unparseable += 1
            continue
        group[i] = num_groups
        num_groups += 1
        level[i] = int(assign_levels(torch.tensor([thinking_tokens[i]]), budgets)[0])
        for lvl in range(1, L + 1):
            if lvl != level[i]:
                requests[lvl].append(i)

    new_rows: list[tuple[int, int, list[int], list[int], str, int, int, int]] = []
    for lvl in range(1, L + 1):
        rows = requests[lvl]
        if not rows:
            continue
        budget = budgets[lvl - 1]
        instructed = [level_instruction(cfg.instruction, rollout.prompts[i], lvl, L, budget) for i in rows]
        contexts = [instructed[k] + tokenizer.decode(bodies[i][:spans[i].open_end]) for k, i in enumerate(rows)]
        engine = HFRollout(model, tokenizer, max_new_tokens=budget + len(close_ids), temperature=temperature,
                           top_p=top_p, top_k=top_k)
        gen = engine.generate(contexts, 1, generator=generator)
        gen_ids, gen_mask = gen.completion_ids.tolist(), gen.completion_mask.tolist()
        for k, i in enumerate(rows):
            span = spans[i]
            produced = [t for t, m in zip(gen_ids[k], gen_mask[k]) if m]
            thinking = cut_generated_thinking(produced, close_ids, stop_ids, budget)
            # the regeneration closed its thinking itself (its tag right after the kept thinking)
            closed = produced[len(thinking):len(thinking) + len(close_ids)] == list(close_ids)
            completion = (bodies[i][:span.open_end] + thinking + bodies[i][span.close_start:]
                          + full[i][len(bodies[i]):])  # the original's EOS, when it had one
            prompt = (tokenizer(instructed[k])["input_ids"] if cfg.train_with_instruction else prompt_rows[i])
            prompt_text = instructed[k] if cfg.train_with_instruction else rollout.prompts[i]
            start = span.open_end + len(thinking) + (span.close_end - span.close_start)
            sampled_end = span.open_end + len(thinking) + (len(close_ids) if closed else 0)
            new_rows.append((i, lvl, list(prompt), completion, prompt_text, len(thinking), start, sampled_end))
    # Families stay contiguous (original's group order, then level), whatever order the levels were generated in.
    new_rows.sort(key=lambda r: (group[r[0]], r[1]))

    all_prompts = prompt_rows + [r[2] for r in new_rows]
    all_completions = full + [r[3] for r in new_rows]
    device = rollout.prompt_ids.device
    prompt_ids, prompt_mask, completion_ids, completion_mask = _pack(all_prompts, all_completions, pad, device)
    source = list(range(B)) + [r[0] for r in new_rows]
    src = torch.tensor(source, dtype=torch.long)
    texts = tokenizer.batch_decode([r[3] for r in new_rows], skip_special_tokens=True) if new_rows else []
    expanded = Rollout(
        prompt_ids=prompt_ids,
        prompt_mask=prompt_mask,
        completion_ids=completion_ids,
        completion_mask=completion_mask,
        group_ids=rollout.group_ids[src.to(rollout.group_ids.device)],
        prompts=list(rollout.prompts) + [r[4] for r in new_rows],
        completions=list(rollout.completions) + texts,
        truncated=rollout.truncated[src.to(rollout.truncated.device)],
    )
    return Expansion(
        rollout=expanded,
        rewards=rewards[src.to(rewards.device)],
        source=src,
        is_original=torch.tensor([True] * B + [False] * len(new_rows)),
        thinking_group_id=torch.tensor(group + [group[r[0]] for r in new_rows], dtype=torch.long),
        level=torch.tensor(level + [r[1] for r in new_rows], dtype=torch.long),
        thinking_tokens=torch.tensor(thinking_tokens + [r[5] for r in new_rows], dtype=torch.long),
        action_start=torch.tensor(action_start + [r[6] for r in new_rows], dtype=torch.long),
        sampled_start=torch.tensor([0] * B + [spans[r[0]].open_end for r in new_rows], dtype=torch.long),
        sampled_end=torch.tensor([len(c) for c in full] + [r[7] for r in new_rows], dtype=torch.long),
        successes=int(sum(success)),
        unparseable=unparseable,
    )


def score_thinking(model, tokenizer, expansion: Expansion, cfg: RLVCRConfig, *, temperature: float = 1.0,
                   seqs_per_batch: int = 64) -> tuple[Tensor, Tensor, Tensor]:
    """Confidence, cost and thinking reward (each (B',) float32, 0 outside thinking groups) — docs/rlvcr.md.

    Confidence is teacher-forced under ``softmax(logits / temperature)`` — the trainer's policy — on the
    prompt each row trains with; the completion's final EOS is not part of the action.
    """
    ro = expansion.rollout
    Bp = len(ro)
    members = (expansion.thinking_group_id >= 0).nonzero().squeeze(-1).tolist()
    confidence = torch.zeros(Bp)
    cost = torch.zeros(Bp)
    if members:
        eos = eos_token_ids(tokenizer, model)
        p_ids, p_mask = ro.prompt_ids.tolist(), ro.prompt_mask.tolist()
        c_ids, c_mask = ro.completion_ids.tolist(), ro.completion_mask.tolist()
        prompts, comps, starts = [], [], []
        for i in members:
            prompts.append([t for t, m in zip(p_ids[i], p_mask[i]) if m])
            comp = [t for t, m in zip(c_ids[i], c_mask[i]) if m]
            comps.append(comp[:-1] if comp and comp[-1] in eos else comp)
            starts.append(int(expansion.action_start[i]))
        device = ro.prompt_ids.device
        conf = teacher_forced_confidence(model, prompts, comps, starts, tokenizer.pad_token_id, device=device,
                                         temperature=temperature, seqs_per_batch=seqs_per_batch)
        idx = torch.tensor(members, dtype=torch.long)
        confidence[idx] = conf
        cost[idx] = thinking_cost(expansion.thinking_tokens[idx], cfg.budgets)
    reward = thinking_reward(confidence, cost, cfg.cost_weight)
    return confidence, cost, reward


def level_metrics(expansion: Expansion, confidence: Tensor, cost: Tensor, thinking_rew: Tensor,
                  thinking_adv: Tensor, levels: int) -> dict[str, float]:
    """``rlvcr/...`` metrics: counts, and per level l (``_L{l}``) the means over the thinking-group members at
    that level of confidence, cost, thinking reward and thinking advantage, the confidence of the regenerated
    members alone, and the fraction of expanded originals whose own thinking took level l. A level with no
    member is left out (no NaN in the logs)."""
    in_group = expansion.thinking_group_id >= 0
    orig = expansion.is_original & in_group
    out: dict[str, float] = {
        "rlvcr/successes": float(expansion.successes),
        "rlvcr/expanded_originals": float(orig.sum()),
        "rlvcr/expanded_samples": float(expansion.num_expanded),
        "rlvcr/unparseable_successes": float(expansion.unparseable),
        "rlvcr/batch_seqs": float(len(expansion.rollout)),
    }
    if orig.any():
        out["rlvcr/original_level_mean"] = float(expansion.level[orig].float().mean())
        out["rlvcr/original_thinking_tokens_mean"] = float(expansion.thinking_tokens[orig].float().mean())
    for lvl in range(1, levels + 1):
        at = in_group & (expansion.level == lvl)
        if orig.any():
            out[f"rlvcr/original_level_frac_L{lvl}"] = float((expansion.level[orig] == lvl).float().mean())
        if not at.any():
            continue
        out[f"rlvcr/confidence_L{lvl}"] = float(confidence[at].mean())
        out[f"rlvcr/cost_L{lvl}"] = float(cost[at].mean())
        out[f"rlvcr/thinking_reward_L{lvl}"] = float(thinking_rew[at].mean())
        out[f"rlvcr/thinking_adv_L{lvl}"] = float(thinking_adv[at].mean())
        regen = at & ~expansion.is_original
        if regen.any():  # the regenerated samples alone: does the policy's thinking at this level improve?
            out[f"rlvcr/regen_confidence_L{lvl}"] = float(confidence[regen].mean())
    return out


def expansion_loss_mask(expansion: Expansion, mode: str) -> Tensor:
    """(B', T) bool: the completion tokens each row trains on under ``rlvcr.expansion_loss`` = ``mode``.

    ``all``: the completion mask (every row trains like a sampled completion). ``thinking``: an expanded row
    keeps its tokens before ``action_start`` (the opening tag, the regenerated thinking and the closing tag)
    and drops the action and EOS that follow: they were copied from the original, not sampled after this
    thinking, so reinforcing or penalising them would teach the answer regardless of the thinking before it
    (docs/rlvcr.md, "Collapse at small scale"). ``sampled``: only the tokens the regeneration sampled
    (not the copied opening tag, not a closing tag added where the budget or an EOS cut the thinking, not the
    copied action), and of those, on a row trained on its original's prompt, only from the first one where it
    differs from the original's completion: the shared prefix (the start of a scratchpad the regeneration
    repeated) is the same text in the same context as the original's, taught once by the original. Originals
    always keep their whole completion.
    """
    if mode not in EXPANSION_LOSS_MODES:
        raise ValueError(f"`rlvcr.expansion_loss` = {mode!r} must be one of {', '.join(EXPANSION_LOSS_MODES)}.")
    mask = expansion.rollout.completion_mask.bool().clone()
    if mode == "all":
        return mask
    T = mask.shape[1]
    pos = torch.arange(T, device=mask.device).unsqueeze(0)
    expanded = (~expansion.is_original).to(mask.device).unsqueeze(1)
    end = expansion.action_start if mode == "thinking" or expansion.sampled_end is None else expansion.sampled_end
    keep = pos < end.to(mask.device).unsqueeze(1)
    if mode == "sampled":
        src = expansion.source.to(mask.device)
        ids = expansion.rollout.completion_ids.to(mask.device)
        same = (ids == ids[src]) & mask & mask[src]
        # the first differing position is the count of leading equal tokens; it counts on the same prompt only
        shared = torch.cumprod(same.long(), dim=1).sum(dim=1)
        p_ids, p_mask = expansion.rollout.prompt_ids.to(mask.device), expansion.rollout.prompt_mask.to(mask.device)
        same_prompt = ((p_ids == p_ids[src]) | (p_mask == 0)).all(dim=1) & (p_mask == p_mask[src]).all(dim=1)
        start = (expansion.sampled_start.to(mask.device) if expansion.sampled_start is not None
                 else torch.zeros_like(shared))
        start = torch.where(same_prompt, torch.maximum(start, shared), start)
        keep &= pos >= start.unsqueeze(1)
    return mask & (~expanded | keep)


@dataclass
class StageOutput:
    """What the loop needs after the RLVCR stage: rows B' = originals then expansions."""

    rollout: Rollout
    advantages: Tensor  # (B',) final (1 − w)·A_action + w·A_thinking
    keep: Tensor  # (B',) bool, rows to train on
    metrics: dict[str, float]
    expansion: Expansion
    parts: dict[str, Tensor]
    loss_mask: Tensor  # (B', T) bool, the completion tokens to train on (``expansion_loss_mask``)


def rlvcr_stage(
    model,
    tokenizer,
    rollout: Rollout,
    rewards: Tensor,
    cfg: RLVCRConfig,
    *,
    keep: Tensor | None = None,
    scale: str = "group",
    temperature: float = 1.0,
    top_p: float = 1.0,
    top_k: int = 0,
    generator: torch.Generator | None = None,
    seqs_per_batch: int = 64,
) -> StageOutput:
    """Expansion → thinking rewards → mixed advantages, for one rollout batch (docs/rlvcr.md).

    Args:
        rollout, rewards: the B originals and their (B,) total rewards.
        keep: (B,) bool rows the loop would train on (e.g. after a zero-variance filter). An original keeps its
            flag; an expanded row is kept when its original is, or when it carries a thinking signal
            (``thinking_weight > 0``): a prompt whose completions all succeeded has no action signal but its
            families still compare thinking levels.
        scale: action-advantage scaling (``cfg.scale`` overrides it; the loop passes the objective's).
        temperature, top_p, top_k, generator: regeneration sampling; ``cfg.temperature`` overrides
            ``temperature``, which is also the τ of the confidence (the trainer's π = softmax(z / τ)).
    """
    t0 = time.perf_counter()
    tau = cfg.temperature if cfg.temperature is not None else temperature
    exp = expand_thinking_levels(model, tokenizer, rollout, rewards, cfg, temperature=tau, top_p=top_p,
                                 top_k=top_k, generator=generator)
    confidence, cost, t_rew = score_thinking(model, tokenizer, exp, cfg, temperature=temperature,
                                             seqs_per_batch=seqs_per_batch)
    dev = exp.rewards.device
    adv, parts = rlvcr_advantages(
        exp.rewards.float(), exp.rollout.group_ids.to(dev), exp.is_original.to(dev),
        exp.thinking_group_id.to(dev), t_rew.to(dev), thinking_weight=cfg.thinking_weight, eps=cfg.eps,
        scale=cfg.scale or scale, family_action=cfg.family_action)
    in_group = (exp.thinking_group_id >= 0).to(dev)
    base_keep = keep.to(dev)[exp.source.to(dev)] if keep is not None else torch.ones_like(in_group)
    new_keep = base_keep | (in_group & (cfg.thinking_weight > 0))
    metrics = level_metrics(exp, confidence, cost, t_rew, parts["thinking"].cpu(), cfg.levels)
    for k in ("rlvcr/action_adv_mean", "rlvcr/thinking_adv_abs_mean", "rlvcr/final_adv_mean", "rlvcr/final_adv_std"):
        metrics[k] = float(parts[k])
    if in_group.any():
        metrics["rlvcr/confidence_mean"] = float(confidence[in_group.cpu()].mean())
    loss_mask = expansion_loss_mask(exp, cfg.expansion_loss)
    trains = new_keep & loss_mask.to(dev).any(dim=1)
    # the rows through which RLVCR changes the update: a thinking advantage on a row that trains a token
    metrics["rlvcr/acting_rows"] = float((trains & in_group & (parts["thinking"] != 0)).sum())
    metrics["rlvcr/trained_rows"] = float(trains.sum())
    metrics["rlvcr/stage_s"] = time.perf_counter() - t0
    return StageOutput(rollout=exp.rollout, advantages=adv, keep=new_keep, metrics=metrics, expansion=exp,
                       parts=parts, loss_mask=loss_mask)
