"""Built-in reward functions on hand cases, import-path loading and its errors, the weighted scorer."""

import math
import sys
import textwrap

import pytest
import torch

from lmpo.rewards import (
    REWARDS,
    RewardScorer,
    countdown,
    exact_match,
    format_reward,
    get_reward_fn,
    length_penalty,
    load_reward_fn,
    math_answer,
    numeric_match,
    parse_number,
)


def test_registry_names():
    assert {"exact_match", "numeric_match", "math", "format", "length_penalty", "countdown"} <= set(REWARDS)


def test_exact_match():
    assert exact_match(["p"] * 4, [" 46", "46\n", "460", "4 6"], ["46"] * 4) == [1.0, 1.0, 0.0, 0.0]
    assert exact_match(["p"], [" 46"], ["46"], strip=False) == [0.0]
    # TRL conversational completions
    assert exact_match(["p"], [[{"role": "assistant", "content": "46"}]], ["46"]) == [1.0]


def test_numeric_match():
    completions = ["the answer is 1,234.0", "42 then 7", "no number", "3.001", "-5"]  # abs_tol 1e-6
    answers = ["1234", "7", "1", "3", "-5"]
    assert numeric_match([""] * 5, completions, answers) == [1.0, 1.0, 0.0, 0.0, 1.0]
    assert numeric_match([""] * 2, ["42 then 7", "3.001"], ["42", "3"], which="first", abs_tol=1e-2) == [
        1.0,
        1.0,
    ]
    assert numeric_match([""], ["5"], ["five"]) == [None]  # non-numeric reference: not applicable
    assert parse_number("x = -2.5e3 and 4", which="first") == -2500.0 and parse_number("x 1 y 4") == 4.0
    assert parse_number("abc") is None


def test_math_reward():
    pytest.importorskip("math_verify")
    completions = ["so \\boxed{\\frac{1}{2}}", "0.5", "$x = 3$", "\\boxed{4}"]
    assert math_answer([""] * 4, completions, ["1/2", "\\frac{1}{2}", "3", "5"]) == [1.0, 1.0, 1.0, 0.0]


def test_format_reward():
    pattern = r"<think>.*</think>\d+"
    completions = ["<think>a\nb</think>12", "12", "<think>x</think>12 extra"]
    assert format_reward([""] * 3, completions, None, pattern=pattern) == [1.0, 0.0, 0.0]
    assert format_reward([""] * 3, completions, None, pattern=pattern, mode="search") == [1.0, 0.0, 1.0]
    with pytest.raises(ValueError, match="pattern"):
        format_reward([""], ["x"], None)


def test_length_penalty():
    # -(max(0, len - 4) / 2): lengths 2, 4, 7, 10 -> 0, 0, -1.5, -3
    out = length_penalty([""] * 4, ["ab", "abcd", "abcdefg", "a" * 10], None, target_chars=4, scale_chars=2)
    assert out == [0.0, 0.0, -1.5, -3.0]


def test_countdown():
    prompts = ["3 5 7>22:"] * 5 + ["no numbers here"]
    completions = ["3*5+7", "(7+5)+3*0", "5*5-3", "7*3+1", "22", "1"]
    # valid; uses 0 (not given); uses 5 twice; uses 1 (not given); 22 not given; prompt not countdown
    assert countdown(prompts, completions, ["22"] * 6) == [1.0, 0.0, 0.0, 0.0, 0.0, None]
    assert countdown(["2 2 9>-5:"], ["2-9+2"], ["-5"]) == [1.0]
    assert countdown(["3 5>8:"], ["__import__('os')"], ["8"]) == [0.0]


@pytest.fixture
def user_module(tmp_path, monkeypatch):
    (tmp_path / "my_rewards.py").write_text(
        textwrap.dedent(
            """
            NOT_CALLABLE = 3

            def contains_answer(prompts, completions, answer, **kwargs):
                return [float(a in c) for c, a in zip(completions, answer)]

            def fragile(prompts, completions, answer, **kwargs):
                return [1.0 / len(c) for c in completions]

            def not_finite(prompts, completions, answer, **kwargs):
                return [float("nan"), float("inf"), 1e308, 2e9, None, 3.0][: len(completions)]

            def words(prompts, completions, answer, **kwargs):
                return ["1.0", 2.0][: len(completions)]

            def exits(prompts, completions, answer, **kwargs):
                import sys

                sys.exit(0)

            def bonus(prompts, completions, answer, level, **kwargs):
                return [float(lv) for lv in level]

            class Holder:
                @staticmethod
                def one(prompts, completions, answer, **kwargs):
                    return [1.0] * len(completions)
            """
        )
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    yield "my_rewards"
    sys.modules.pop("my_rewards", None)


def test_load_reward_fn(user_module):
    fn = load_reward_fn("my_rewards:contains_answer")
    assert fn([""] * 2, ["x46", "4"], ["46", "46"]) == [1.0, 0.0]
    assert load_reward_fn("my_rewards:Holder.one")([""], ["a"], ["b"]) == [1.0]
    assert get_reward_fn("exact_match") is REWARDS["exact_match"]
    with pytest.raises(ImportError) as err:
        load_reward_fn("no_such_pkg.rewards:fn")
    assert "no_such_pkg.rewards" in str(err.value) and "PYTHONPATH" in str(err.value)
    with pytest.raises(AttributeError) as err:
        load_reward_fn("my_rewards:missing")
    assert "'missing'" in str(err.value) and "contains_answer" in str(err.value)
    with pytest.raises(TypeError, match="not callable"):
        load_reward_fn("my_rewards:NOT_CALLABLE")
    with pytest.raises(ValueError, match="package.module:function"):
        get_reward_fn("exactmatch")


def test_scorer_weights_and_columns(user_module):
    scorer = RewardScorer(
        [
            ("exact_match", 2.0),
            {"name": "length_penalty", "weight": 0.5, "kwargs": {"target_chars": 2, "scale_chars": 1}},
            {"name": "my_rewards:bonus", "weight": 0.1},
            ("numeric_match", 1.0),
        ]
    )
    total, per_fn = scorer.score(
        ["1+1=", "2+2=", "x"], ["2", "4444", "abc"], ["2", "4", "y"], level=[1, 2, 3]
    )
    # row 0: 2·1 + 0.5·0 + 0.1·1 + 1·1 = 3.1;  row 1: 0 + 0.5·(−2) + 0.1·2 + 0 = −0.8
    # row 2: 0 + 0.5·(−1) + 0.1·3 + (numeric_match None -> NaN, counts 0) = −0.2
    torch.testing.assert_close(total, torch.tensor([3.1, -0.8, -0.2]))
    assert per_fn["length_penalty"].tolist() == [0.0, -2.0, -1.0]
    assert per_fn["numeric_match"][:2].tolist() == [1.0, 0.0] and math.isnan(per_fn["numeric_match"][2])
    assert scorer.last_stats["reward/skipped"] == 0.0


def test_scorer_error_names_function_and_sample(user_module):
    scorer = RewardScorer([("exact_match", 1.0), ("my_rewards:fragile", 1.0)])
    with pytest.raises(RuntimeError) as err:
        scorer.score(["a", "b", "c"], ["ok", "", "fine"], ["ok", "x", "y"])
    msg = str(err.value)
    assert "'my_rewards:fragile'" in msg and "ZeroDivisionError" in msg and "sample 1" in msg
    assert "on_error='skip'" in msg and "prompt 'b'" in msg


def test_scorer_skip_mode(user_module):
    scorer = RewardScorer([("exact_match", 1.0), ("my_rewards:fragile", 5.0)], on_error="skip")
    total, per_fn = scorer.score(["a", "b"], ["ok", ""], ["ok", "x"])
    # fragile raised for the batch -> NaN for both rows, excluded from the total (which is exact_match alone)
    assert total.tolist() == [1.0, 0.0]
    assert torch.isnan(per_fn["my_rewards:fragile"]).all()
    assert scorer.last_stats["reward/skipped"] == 1.0 and scorer.skipped_calls == 1
    total, _ = scorer.score(["a"], ["ok"], ["ok"])  # no failure on this batch: 1 + 5·(1/2)
    assert (
        total.tolist() == [3.5] and scorer.last_stats["reward/skipped"] == 0.0 and scorer.skipped_calls == 1
    )


def test_scorer_refuses_nonfinite_values_and_counts_them_when_skipping(user_module):
    """NaN, ±inf and values beyond ±1e9 are a broken reward, not "does not apply" (None): raise names the function
    and the sample; skip scores them as undefined (0 in the total) and counts them in reward/nonfinite."""
    args = (["p"] * 6, ["a", "b", "c", "d", "e", "f"], ["x"] * 6)
    with pytest.raises(RuntimeError, match=r"'my_rewards:not_finite' returned nan for sample 0 .*4 of its 6 values"):
        RewardScorer([("my_rewards:not_finite", 1.0)]).score(*args)
    skip = RewardScorer([("exact_match", 1.0), ("my_rewards:not_finite", 1.0)], on_error="skip")
    total, per_fn = skip.score(*args)
    assert total.tolist() == [0.0] * 5 + [3.0] and torch.isnan(per_fn["my_rewards:not_finite"][:5]).all()
    assert skip.last_stats == {"reward/skipped": 0.0, "reward/nonfinite": 4.0}
    assert skip.nonfinite_note == "'my_rewards:not_finite' returned nan for completion 0"
    with pytest.raises(RuntimeError, match=r"'my_rewards:words' returned '1.0' \(str\) for completion 0.*sample 0"):
        RewardScorer([("my_rewards:words", 1.0)]).score(["p", "q"], ["a", "b"], ["x", "y"])
    with pytest.raises(RuntimeError, match=r"raised RewardExit: the function called sys.exit\(0\)"):
        RewardScorer([("my_rewards:exits", 1.0)]).score(["p"], ["a"], ["x"])


def test_scorer_bad_specs():
    with pytest.raises(ValueError, match="twice"):
        RewardScorer([("exact_match", 1.0), ("exact_match", 2.0)])
    with pytest.raises(ValueError, match="on_error"):
        RewardScorer([("exact_match", 1.0)], on_error="ignore")
    with pytest.raises(ValueError, match="unknown keys"):
        RewardScorer([{"name": "exact_match", "wieght": 2}])
    with pytest.raises(ValueError, match="same length"):
        RewardScorer(["exact_match"]).score(["a"], ["b", "c"], ["d"])


def test_a_reward_module_that_exits_on_import_fails_the_command(tmp_path, monkeypatch, capsys):
    """sys.exit(0) in code a command runs (here a reward module's top level, imported when the config is checked)
    is a failed command with one message, never exit status 0 with nothing done."""
    from lmpo.cli import main

    (tmp_path / "exits_on_import.py").write_text("import sys\nsys.exit(0)\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.chdir(tmp_path)
    try:
        code = main(["train", "--print-config", "--rewards.functions", "[exits_on_import:score]"])
    finally:
        sys.modules.pop("exits_on_import", None)
    err = capsys.readouterr().err
    assert code == 1 and "lmpo train: stopped by SystemExit(0) raised inside the command" in err, err
