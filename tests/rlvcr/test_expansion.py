"""The RLVCR expansion stage with the tiny model: who is expanded, what the new samples contain, how they
are scored, and the stage's advantages and metrics."""

from __future__ import annotations

import pytest
import torch

from lmpo.generation import HFRollout, Rollout
from lmpo.models import build_tiny_model
from lmpo.models.tokenizer import CharTokenizer
from lmpo.rlvcr.advantages import rlvcr_advantages
from lmpo.rlvcr.config import RLVCRConfig
from lmpo.rlvcr.expansion import (
    Expansion,
    expand_thinking_levels,
    expansion_loss_mask,
    rlvcr_stage,
    score_thinking,
)
from lmpo.rlvcr.thinking import find_subsequence

TOK = CharTokenizer()
SMALL = {"hidden_size": 32, "num_layers": 1, "num_heads": 2, "intermediate_size": 64}  # behaviour, not skill

PROMPTS = ["12+34=", "12+34=", "12+34=", "5+6=", "5+6=", "5+6="]
COMPLETIONS = [
    "<think>2+4=6 1+3=4</think>46",  # success, 11 thinking tokens -> level 3 (budget 16)
    "<think>2+4=6</think>47",  # failure: never expanded
    "<think>ab</think>46",  # success, 2 tokens -> level 1 (budget 4)
    "<think>5+6=11</think>11",  # success, 6 tokens -> level 2 (budget 8)
    "11",  # success but no thinking block: not expandable
    "<think>" + "x" * 40 + "</think>11",  # success, 40 tokens (over every budget) -> level 4
]
REWARDS = torch.tensor([1.0, 0.0, 1.0, 1.0, 1.0, 1.0])


def make_rollout(prompts, completions, eos=True) -> Rollout:
    p = [TOK(x)["input_ids"] for x in prompts]
    c = [TOK(x, add_special_tokens=False)["input_ids"] + ([TOK.eos_token_id] if eos else []) for x in completions]
    P, T = max(map(len, p)), max(map(len, c))
    B = len(p)
    pi, pm = torch.zeros(B, P, dtype=torch.long), torch.zeros(B, P, dtype=torch.long)
    ci, cm = torch.zeros(B, T, dtype=torch.long), torch.zeros(B, T, dtype=torch.long)
    for i in range(B):
        pi[i, P - len(p[i]):], pm[i, P - len(p[i]):] = torch.tensor(p[i]), 1
        ci[i, :len(c[i])], cm[i, :len(c[i])] = torch.tensor(c[i]), 1
    group = torch.tensor([0, 0, 0, 1, 1, 1])[:B]
    return Rollout(pi, pm, ci, cm, group, list(prompts), list(completions), torch.zeros(B, dtype=torch.bool))


def valid(ids, mask):
    return [t for t, m in zip(ids.tolist(), mask.tolist()) if m]


@pytest.fixture(scope="module")
def model():
    return build_tiny_model(TOK, seed=1, **SMALL)


@pytest.fixture(scope="module")
def expansion(model):
    cfg = RLVCRConfig(enabled=True)
    ro = make_rollout(PROMPTS, COMPLETIONS)
    return ro, expand_thinking_levels(model, TOK, ro, REWARDS, cfg, generator=torch.Generator().manual_seed(0))


def test_who_is_expanded_and_levels(expansion):
    ro, ex = expansion
    # rows 0, 2, 3, 5 are expandable successes; 1 failed; 4 has no block.
    assert ex.successes == 5 and ex.unparseable == 1
    assert ex.num_expanded == 4 * 3 and len(ex.rollout) == 6 + 12
    assert ex.thinking_group_id[:6].tolist() == [0, -1, 1, 2, -1, 3]
    assert ex.level[:6].tolist() == [3, 0, 1, 2, 0, 4]
    assert ex.thinking_tokens[:6].tolist() == [11, 5, 2, 6, -1, 40]
    assert 1 not in ex.source.tolist()[6:] and 4 not in ex.source.tolist()[6:]  # failed/unparseable: no family
    for g in range(4):
        fam = (ex.thinking_group_id == g).nonzero().squeeze(-1)
        assert sorted(ex.level[fam].tolist()) == [1, 2, 3, 4]
        assert ex.is_original[fam].sum() == 1
        assert (ex.rewards[fam] == 1.0).all()
    assert ex.rollout.group_ids.tolist()[6:] == [0] * 6 + [1] * 6


def test_originals_unchanged_and_expansions_keep_prompt_and_action(expansion):
    ro, ex = expansion
    new = ex.rollout
    close = TOK("</think>", add_special_tokens=False)["input_ids"]
    for i in range(6):
        assert valid(new.prompt_ids[i], new.prompt_mask[i]) == valid(ro.prompt_ids[i], ro.prompt_mask[i])
        assert valid(new.completion_ids[i], new.completion_mask[i]) == valid(ro.completion_ids[i],
                                                                              ro.completion_mask[i])
    budgets = (4, 8, 16, 32)
    for r in range(6, len(new)):
        s = int(ex.source[r])
        assert valid(new.prompt_ids[r], new.prompt_mask[r]) == valid(ro.prompt_ids[s], ro.prompt_mask[s])
        comp = valid(new.completion_ids[r], new.completion_mask[r])
        orig = valid(ro.completion_ids[s], ro.completion_mask[s])
        action = orig[find_subsequence(orig, close) + len(close):]  # the original's action + EOS
        n = int(ex.thinking_tokens[r])
        assert 0 <= n <= budgets[int(ex.level[r]) - 1]
        assert comp[:7] == orig[:7]  # "<think>"
        assert comp[7 + n:7 + n + 8] == close and comp[7 + n + 8:] == action
        assert int(ex.action_start[r]) == 7 + n + 8
        text = TOK.decode(comp, skip_special_tokens=True)
        assert new.completions[r] == text and text.endswith(COMPLETIONS[s].split("</think>")[1])


def test_regeneration_uses_level_instruction_and_budget(model, monkeypatch):
    seen = []
    real = HFRollout.generate

    def spy(self, prompts, completions_per_prompt=1, **kw):
        seen.append((self.max_new_tokens, list(prompts)))
        return real(self, prompts, completions_per_prompt, **kw)

    monkeypatch.setattr(HFRollout, "generate", spy)
    cfg = RLVCRConfig(enabled=True, instruction="<L{level}/{levels}:{budget}>{prompt}")
    ro = make_rollout(PROMPTS[:1], COMPLETIONS[:1])
    ex = expand_thinking_levels(model, TOK, ro, torch.tensor([1.0]), cfg)
    # Original at level 3: levels 1, 2, 4 regenerated with budget + len("</think>") = 8 new tokens at most.
    assert seen == [(4 + 8, ["<L1/4:4>12+34=<think>"]), (8 + 8, ["<L2/4:8>12+34=<think>"]),
                    (32 + 8, ["<L4/4:32>12+34=<think>"])]
    assert ex.level.tolist() == [3, 1, 2, 4]
    # With train_with_instruction the expanded rows train on the instructed prompt.
    ex2 = expand_thinking_levels(model, TOK, ro, torch.tensor([1.0]),
                                 RLVCRConfig(enabled=True, train_with_instruction=True))
    assert ex2.rollout.prompts[1:] == ["[think 4]12+34=", "[think 8]12+34=", "[think 32]12+34="]
    assert TOK.decode(valid(ex2.rollout.prompt_ids[1], ex2.rollout.prompt_mask[1]),
                      skip_special_tokens=True) == "[think 4]12+34="


def test_nothing_to_expand():
    model = build_tiny_model(TOK, seed=1, **SMALL)
    ro = make_rollout(PROMPTS, COMPLETIONS)
    out = rlvcr_stage(model, TOK, ro, torch.zeros(6), RLVCRConfig(enabled=True))
    assert len(out.rollout) == 6 and out.expansion.num_expanded == 0
    assert torch.equal(out.advantages, torch.zeros(6))  # all-zero rewards: zero-variance groups
    assert out.metrics["rlvcr/expanded_samples"] == 0.0


def test_score_thinking_matches_slow_computation(model, expansion):
    _, ex = expansion
    cfg = RLVCRConfig(enabled=True, cost_weight=0.3)
    conf, cost, rew = score_thinking(model, TOK, ex, cfg, seqs_per_batch=5)
    for r in range(len(ex.rollout)):
        if ex.thinking_group_id[r] < 0:
            assert conf[r] == 0 and cost[r] == 0
            continue
        p = valid(ex.rollout.prompt_ids[r], ex.rollout.prompt_mask[r])
        c = valid(ex.rollout.completion_ids[r], ex.rollout.completion_mask[r])[:-1]  # drop EOS
        ids = torch.tensor([p + c])
        with torch.no_grad():
            probs = model(input_ids=ids).logits[0].softmax(-1)
        start = len(p) + int(ex.action_start[r])
        slow = sum(probs[t - 1, ids[0, t]].item() for t in range(start, ids.shape[1])) / (ids.shape[1] - start)
        assert conf[r].item() == pytest.approx(slow, abs=1e-5)
        assert cost[r].item() == pytest.approx(int(ex.thinking_tokens[r]) / 32)
        assert rew[r].item() == pytest.approx(slow - 0.3 * int(ex.thinking_tokens[r]) / 32, abs=1e-5)


def test_stage_advantages_keep_and_metrics(model):
    ro = make_rollout(PROMPTS, COMPLETIONS)
    cfg = RLVCRConfig(enabled=True, thinking_weight=0.5, cost_weight=0.1)
    keep = torch.tensor([True, True, True, False, False, False])  # e.g. prompt 1 dropped by a filter
    out = rlvcr_stage(model, TOK, ro, REWARDS, cfg, keep=keep, generator=torch.Generator().manual_seed(0))
    ex = out.expansion
    conf, _, t_rew = score_thinking(model, TOK, ex, cfg)
    expect, parts = rlvcr_advantages(ex.rewards, ex.rollout.group_ids, ex.is_original, ex.thinking_group_id, t_rew,
                                     thinking_weight=0.5)
    torch.testing.assert_close(out.advantages, expect)
    # Prompt 0 rewards [1, 0, 1]: originals' action advantages ±GRPO; prompt 1 [1, 1, 1]: 0.
    # (eps = 1e-4 in the denominator: √(1/3)/(√(1/3) + 1e-4) = 0.57725, −2√(1/3)/(√(1/3) + 1e-4) = −1.15450)
    torch.testing.assert_close(parts["action"][:6], torch.tensor([0.57725, -1.15450, 0.57725, 0, 0, 0]),
                               atol=1e-5, rtol=0)
    # Originals keep their flag; families (thinking signal) are kept even where the filter dropped the prompt.
    in_group = ex.thinking_group_id >= 0
    assert out.keep[:6].tolist() == [True, True, True, True, False, True]
    assert out.keep[6:].all() and bool((out.keep == (keep[ex.source] | in_group)).all())
    m = out.metrics
    assert m["rlvcr/expanded_samples"] == 12 and m["rlvcr/expanded_originals"] == 4
    assert m["rlvcr/successes"] == 5 and m["rlvcr/unparseable_successes"] == 1
    for lvl in range(1, 5):
        assert m[f"rlvcr/original_level_frac_L{lvl}"] == 0.25  # one original at each level
        at = in_group & (ex.level == lvl)
        assert m[f"rlvcr/thinking_adv_L{lvl}"] == pytest.approx(float(parts["thinking"][at].mean()), abs=1e-6)
        assert f"rlvcr/confidence_L{lvl}" in m and f"rlvcr/cost_L{lvl}" in m
        regen = at & ~ex.is_original
        assert m[f"rlvcr/regen_confidence_L{lvl}"] == pytest.approx(float(conf[regen].mean()), abs=1e-6)
    # w = 0: the originals get exactly the plain GRPO advantages of the unexpanded rollout.
    out0 = rlvcr_stage(model, TOK, ro, REWARDS, RLVCRConfig(enabled=True, thinking_weight=0.0), keep=keep)
    from lmpo.rlvcr.advantages import group_normalized_advantages

    assert torch.equal(out0.advantages[:6], group_normalized_advantages(REWARDS, ro.group_ids))
    # w = 0: no thinking signal, so a family is kept exactly when its original's prompt is.
    assert torch.equal(out0.keep, keep[out0.expansion.source])


def test_stage_splits_the_family_action_advantage_when_configured(model):
    # docs/rlvcr.md, "Collapse at small scale": with `split` a family carries its original's action advantage
    # once, so the batch's action advantages sum to the originals' (GRPO: zero per prompt group)
    ro = make_rollout(PROMPTS, COMPLETIONS)
    copy = rlvcr_stage(model, TOK, ro, REWARDS, RLVCRConfig(enabled=True, thinking_weight=0.0),
                       generator=torch.Generator().manual_seed(0))
    split = rlvcr_stage(model, TOK, ro, REWARDS, RLVCRConfig(enabled=True, thinking_weight=0.0, family_action="split"),
                        generator=torch.Generator().manual_seed(0))
    ex = split.expansion
    originals = copy.parts["action"][:6]
    for g in range(int(ex.thinking_group_id.max()) + 1):
        members = ex.thinking_group_id == g
        row = int((members & ex.is_original).nonzero()[0])
        assert float(split.parts["action"][members].sum()) == pytest.approx(float(originals[row]), abs=1e-6)
        assert float(copy.parts["action"][members].sum()) == pytest.approx(4 * float(originals[row]), abs=1e-6)
    assert float(split.parts["action"].sum()) == pytest.approx(float(originals.sum()), abs=1e-5)
    with pytest.raises(ValueError, match="family_action"):
        RLVCRConfig(enabled=True, family_action="share")


def test_expansion_loss_thinking_masks_the_copied_action_of_expansions(expansion):
    # docs/rlvcr.md, "Collapse at small scale": an expansion's action (and EOS) was copied from its original, not
    # sampled after the regenerated thinking; with expansion_loss = thinking it leaves the loss, its
    # "<think>…</think>" stays, and every original keeps its whole completion.
    ro, ex = expansion
    cm = ex.rollout.completion_mask.bool()
    assert torch.equal(expansion_loss_mask(ex, "all"), cm)
    mask = expansion_loss_mask(ex, "thinking")
    assert torch.equal(mask[:6], cm[:6])
    for r in range(6, len(ex.rollout)):
        start, length = int(ex.action_start[r]), int(cm[r].sum())
        assert 0 < start < length  # every expansion has an action after its thinking
        assert mask[r, :start].all() and not mask[r, start:].any()
        kept = TOK.decode(ex.rollout.completion_ids[r][mask[r]].tolist(), skip_special_tokens=True)
        assert kept.startswith("<think>") and kept.endswith("</think>")
    with pytest.raises(ValueError, match="expansion_loss"):
        expansion_loss_mask(ex, "answer")
    with pytest.raises(ValueError, match="expansion_loss"):
        RLVCRConfig(enabled=True, expansion_loss="action")


def test_expansion_loss_sampled_trains_only_what_the_regeneration_sampled():
    # Hand-built family: the original "<think>7+8=15 5+6+1=12</think>125" and two regenerations that repeat the
    # start of its scratchpad. Under `sampled` an expansion trains from its first token that differs from the
    # original's (the shared prefix is the original's text, taught once) to the end of what it sampled: the
    # closing tag only when the regeneration wrote it, never the copied action.
    prompts = ["57+68="] * 3
    think = ["7+8=15 5+6+1=12", "7+8=", "7+9=16"]
    comps = [f"<think>{t}</think>125" for t in think]
    ro = make_rollout(prompts, comps)
    ids, cm = ro.completion_ids, ro.completion_mask.bool()
    opened = len(TOK("<think>", add_special_tokens=False)["input_ids"])
    closed = len(TOK("</think>", add_special_tokens=False)["input_ids"])
    n_think = [len(TOK(t, add_special_tokens=False)["input_ids"]) for t in think]
    starts = torch.tensor([opened + n + closed for n in n_think])
    # row 1 was cut at its budget of 4 (the closing tag was added); row 2 closed its thinking itself
    sampled_end = torch.tensor([int(cm[0].sum()), opened + n_think[1], opened + n_think[2] + closed])
    ex = Expansion(rollout=ro, rewards=torch.ones(3), source=torch.tensor([0, 0, 0]),
                   is_original=torch.tensor([True, False, False]), thinking_group_id=torch.tensor([0, 0, 0]),
                   level=torch.tensor([3, 1, 2]), thinking_tokens=torch.tensor(n_think), action_start=starts,
                   successes=1, unparseable=0, sampled_end=sampled_end)
    mask = expansion_loss_mask(ex, "sampled")
    assert torch.equal(mask[0], cm[0])  # the original keeps its whole completion
    # row 1 repeats "<think>7+8=" and then only has the forced closing tag: nothing of it was sampled anew
    assert torch.equal(ids[1, :opened + n_think[1]], ids[0, :opened + n_think[1]]) and not mask[1].any()
    # row 2: "<think>7+" is shared; "9=16" and the closing tag it wrote were sampled; the action was copied
    assert TOK.decode(ids[2][mask[2]].tolist()) == "9=16</think>"
    assert not mask[2, int(starts[2]):].any()
    # `sampled` only removes tokens from `thinking`, which keeps the forced tag of row 1
    thinking = expansion_loss_mask(ex, "thinking")
    assert (mask & ~thinking).sum() == 0 and thinking[1, opened + n_think[1]:int(starts[1])].all()
    # without sampled_end (unknown), the thinking block up to the action counts as sampled
    unknown = expansion_loss_mask(Expansion(**{**ex.__dict__, "sampled_end": None}), "sampled")
    assert TOK.decode(ids[1][unknown[1]].tolist()) == "</think>"
    assert torch.equal(unknown[2], mask[2])
    # trained on another prompt (train_with_instruction), the repeated start is not the original's text in the
    # original's context: it trains, from the first token the regeneration sampled (after the copied "<think>")
    instructed = make_rollout(["57+68=", "[think 4]57+68=", "[think 8]57+68="], comps)
    other = Expansion(**{**ex.__dict__, "rollout": instructed, "sampled_start": torch.tensor([0, opened, opened])})
    mask2 = expansion_loss_mask(other, "sampled")
    assert TOK.decode(ids[1][mask2[1]].tolist()) == "7+8="
    assert TOK.decode(ids[2][mask2[2]].tolist()) == "7+9=16</think>"


def test_sampled_end_marks_where_the_regeneration_stopped_sampling(expansion):
    ro, ex = expansion
    cm = ex.rollout.completion_mask
    close = len(TOK("</think>", add_special_tokens=False)["input_ids"])
    assert ex.sampled_end[:6].tolist() == cm[:6].sum(1).tolist()  # originals: everything was sampled
    assert ex.sampled_start[:6].tolist() == [0] * 6
    for r in range(6, len(ex.rollout)):
        end, start = int(ex.sampled_end[r]), int(ex.action_start[r])
        # the thinking ends at start − close; the regeneration either wrote the tag (end = start) or not
        assert end in (start, start - close)
        # it begins after the copied opening tag, at the original's own opening
        opening = TOK.decode(ex.rollout.completion_ids[r, :int(ex.sampled_start[r])].tolist())
        assert opening.strip() == "<think>"


def test_stage_returns_the_expansion_loss_mask(model):
    ro = make_rollout(PROMPTS, COMPLETIONS)
    for mode in ("all", "thinking", "sampled"):
        out = rlvcr_stage(model, TOK, ro, REWARDS, RLVCRConfig(enabled=True, expansion_loss=mode),
                          generator=torch.Generator().manual_seed(0))
        assert torch.equal(out.loss_mask, expansion_loss_mask(out.expansion, mode))
        # acting rows: kept, training at least one token, with a non-zero thinking advantage
        trains = out.keep & out.loss_mask.any(dim=1)
        acting = trains & (out.expansion.thinking_group_id >= 0) & (out.parts["thinking"] != 0)
        assert out.metrics["rlvcr/acting_rows"] == float(acting.sum()) > 0
        assert out.metrics["rlvcr/trained_rows"] == float(trains.sum())
        if mode != "all":
            assert int(out.loss_mask.sum()) < int(out.rollout.completion_mask.sum())
