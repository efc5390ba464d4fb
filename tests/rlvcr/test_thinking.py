"""Thinking levels, cost, token-space parsing, confidence, the config section and the built-in task."""

from __future__ import annotations

import pytest
import torch

from lmpo.rlvcr.config import RLVCRConfig
from lmpo.rlvcr.thinking import (
    action_confidence,
    assign_levels,
    cut_generated_thinking,
    find_subsequence,
    level_instruction,
    locate_thinking,
    teacher_forced_confidence,
    thinking_cost,
    thinking_reward,
)


def test_assign_levels_smallest_budget_that_fits_else_largest():
    n = torch.tensor([0, 1, 4, 5, 8, 9, 11, 16, 17, 32, 33, 100])
    got = assign_levels(n, (4, 8, 16, 32))
    assert got.tolist() == [1, 1, 1, 2, 2, 3, 3, 3, 4, 4, 4, 4]
    # Slow definition: min{l : budget_l >= n} or L.
    budgets = (3, 10, 11)
    for k in range(0, 15):
        expect = next((i + 1 for i, b in enumerate(budgets) if b >= k), len(budgets))
        assert assign_levels(torch.tensor([k]), budgets).item() == expect


def test_cost_and_thinking_reward_by_hand():
    cost = thinking_cost(torch.tensor([0, 8, 11, 32]), (4, 8, 16, 32))
    torch.testing.assert_close(cost, torch.tensor([0.0, 0.25, 0.34375, 1.0]))
    # 0.9 − 0.2·0.34375 = 0.83125 ; 0.5 − 0.2·1 = 0.3
    r = thinking_reward(torch.tensor([0.9, 0.5]), torch.tensor([0.34375, 1.0]), 0.2)
    torch.testing.assert_close(r, torch.tensor([0.83125, 0.3]))


def test_action_confidence_is_mean_probability_of_masked_tokens():
    lp = torch.log(torch.tensor([[0.5, 0.25, 1.0, 0.1], [0.2, 0.4, 0.6, 0.8]]))
    m = torch.tensor([[0, 1, 1, 0], [0, 0, 0, 0]])
    # row 0: (0.25 + 1.0)/2 = 0.625 ; row 1: no action tokens -> 0
    torch.testing.assert_close(action_confidence(lp, m), torch.tensor([0.625, 0.0]))


def test_locate_and_cut_in_token_space():
    O, C = [7, 8], [9, 8]  # multi-token tags
    ids = [7, 8, 1, 2, 3, 9, 8, 5, 6]
    span = locate_thinking(ids, O, C)
    assert (span.open_end, span.close_start, span.close_end, span.thinking_tokens) == (2, 5, 7, 3)
    assert locate_thinking([1, 7, 8, 9, 8, 4], O, C) is None  # tag must open the completion
    assert locate_thinking([1, 7, 8, 9, 8, 4], O, C, max_prefix_tokens=1).thinking_tokens == 0
    assert locate_thinking([7, 8, 1, 2], O, C) is None  # never closed
    assert locate_thinking([7, 8, 1, 7, 8, 9, 8, 3], O, C) is None  # nested open
    assert find_subsequence([1, 2, 3, 2, 3], [2, 3], 2) == 3
    assert cut_generated_thinking([1, 2, 9, 8, 4], C, [0], budget=10) == [1, 2]
    assert cut_generated_thinking([1, 2, 3, 4, 5, 6], C, [0], budget=4) == [1, 2, 3, 4]
    assert cut_generated_thinking([1, 0, 3, 9, 8], C, [0], budget=4) == [1]
    assert level_instruction("[think {budget}]{prompt}", "1+2=", 2, 4, 8) == "[think 8]1+2="


def test_config_validation():
    cfg = RLVCRConfig()
    assert cfg.levels == 4 and cfg.budgets == (4, 8, 16, 32) and cfg.thinking_weight == 0.5
    with pytest.raises(ValueError, match="rlvcr.budgets"):
        RLVCRConfig(budgets=(4, 8, 16))
    with pytest.raises(ValueError, match="strictly increasing"):
        RLVCRConfig(budgets=(4, 8, 8, 32))
    with pytest.raises(ValueError, match="thinking_weight"):
        RLVCRConfig(thinking_weight=-0.1)
    with pytest.raises(ValueError, match="cost_weight"):
        RLVCRConfig(cost_weight=-1.0)
    with pytest.raises(ValueError, match="instruction"):
        RLVCRConfig(instruction="[think {budget}]")
    with pytest.raises(ValueError, match="instruction"):
        RLVCRConfig(instruction="{prompt}{foo}")
    with pytest.raises(ValueError, match="scale"):
        RLVCRConfig(scale="std")


def test_thinking_task_and_rewards():
    from lmpo.rewards import REWARDS
    from lmpo.tasks import TASKS, make_task
    from lmpo.tasks.thinking import addition_scratchpad, split_thinking, thinking_answer, thinking_format

    assert "thinking_addition" in TASKS and "thinking_answer" in REWARDS and "thinking_format" in REWARDS
    assert addition_scratchpad(12, 34) == "2+4=6 1+3=4"
    assert addition_scratchpad(57, 68) == "7+8=15 5+6+1=12"
    assert addition_scratchpad(5, 68) == "5+8=13 0+6+1=7"
    task = make_task("thinking_addition", num_train=50, num_eval=20)
    for ex in task.train_examples(seed=3) + task.eval_examples():
        thinking, action = split_thinking(task.reference_completion(ex))
        assert action == ex.answer == str(ex.meta["a"] + ex.meta["b"]) and thinking == ex.meta["thinking"]
    assert not {e.prompt for e in task.train_examples(0)} & {e.prompt for e in task.eval_examples()}
    ref = ["46"] * 4 + ["<think>2+4=6 1+3=4</think>46"]  # a reference with its own block works too
    comps = ["<think>x</think>46", "<think>2+4=6</think>47", "46", "<think>a</think>46</think>", "<think></think> 46"]
    assert thinking_answer(None, comps, ref) == [1.0, 0.0, 0.0, 0.0, 1.0]
    assert thinking_format(None, comps, ref) == [1.0, 1.0, 0.0, 0.0, 1.0]


def test_teacher_forced_confidence_equals_slow_per_sample():
    from lmpo.models import build_tiny_model
    from lmpo.models.tokenizer import CharTokenizer

    tok = CharTokenizer()
    model = build_tiny_model(tok, seed=3, hidden_size=32, num_layers=2, num_heads=2, intermediate_size=64)
    texts = [("12+34=", "<think>2+4=6</think>46"), ("5+6=", "<think></think>11"),
             ("123+4=", "<think>3+4=7 2+0=2 1+0=1</think>127"), ("1+1=", "<think>ab</think>")]
    prompts = [tok(p)["input_ids"] for p, _ in texts]
    comps = [tok(c, add_special_tokens=False)["input_ids"] for _, c in texts]
    enc = lambda s: tok(s, add_special_tokens=False)["input_ids"]  # noqa: E731
    starts = [locate_thinking(c, enc("<think>"), enc("</think>")).close_end for c in comps]
    assert starts == [7 + 5 + 8, 7 + 0 + 8, 7 + 17 + 8, 7 + 2 + 8]  # characters are tokens
    got = teacher_forced_confidence(model, prompts, comps, starts, tok.pad_token_id, seqs_per_batch=3)
    for i, (p, c, s) in enumerate(zip(prompts, comps, starts)):
        ids = torch.tensor([p + c])
        with torch.no_grad():
            probs = model(input_ids=ids).logits[0].float().softmax(-1)  # (L, V), no padding at all
        action_positions = range(len(p) + s, len(p) + len(c))
        slow = [probs[t - 1, ids[0, t]].item() for t in action_positions]
        expect = sum(slow) / len(slow) if slow else 0.0
        assert got[i].item() == pytest.approx(expect, abs=1e-5), i
    assert got[3].item() == 0.0  # empty action


def test_docs_list_every_config_field_and_metric_family():
    import dataclasses
    from pathlib import Path

    text = (Path(__file__).resolve().parents[2] / "docs" / "rlvcr.md").read_text(encoding="utf-8")
    for f in dataclasses.fields(RLVCRConfig):
        assert f"`{f.name}`" in text, f"docs/rlvcr.md does not document rlvcr.{f.name}"
    for key in ("confidence_L", "cost_L", "thinking_adv_L", "original_level_frac_L", "expanded_samples"):
        assert f"rlvcr/{key}" in text
