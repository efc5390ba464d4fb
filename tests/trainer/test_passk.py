"""pass@k and avg@k (lmpo.eval.passk): the unbiased estimator by hand and by enumeration, intervals, wiring."""

from __future__ import annotations

import itertools
import math

import pytest
from trainer_helpers import make_trainer

from lmpo.eval.passk import default_ks, mean_interval, pass_at_k, pass_at_k_metrics


def _enumerated(n: int, c: int, k: int) -> float:
    """The share of the k-subsets of n samples (c of them correct) that hold a correct one."""
    samples = [True] * c + [False] * (n - c)
    subsets = list(itertools.combinations(range(n), k))
    return sum(any(samples[i] for i in s) for s in subsets) / len(subsets)


def test_pass_at_k_by_hand():
    # n = 5 samples, c = 2 correct: pass@1 = 2/5; pass@2 = 1 − C(3,2)/C(5,2) = 1 − 3/10; pass@3 = 1 − C(3,3)/C(5,3)
    # = 1 − 1/10; pass@4 = 1 (only 3 wrong samples, any 4 hold a correct one)
    assert pass_at_k(5, 2, 1) == pytest.approx(0.4, abs=1e-15)
    assert pass_at_k(5, 2, 2) == pytest.approx(0.7, abs=1e-15)
    assert pass_at_k(5, 2, 3) == pytest.approx(0.9, abs=1e-15)
    assert pass_at_k(5, 2, 4) == 1.0
    assert pass_at_k(5, 0, 5) == 0.0 and pass_at_k(5, 5, 1) == 1.0


@pytest.mark.parametrize("n", [1, 2, 5, 8, 10])
def test_pass_at_k_equals_enumeration_and_the_binomial_form(n):
    for c in range(n + 1):
        for k in range(1, n + 1):
            got = pass_at_k(n, c, k)
            assert got == pytest.approx(_enumerated(n, c, k), abs=1e-12)
            assert got == pytest.approx(1 - math.comb(n - c, k) / math.comb(n, k), abs=1e-12)


def test_pass_at_k_is_monotone_in_k_and_c():
    n = 16
    for c in range(n + 1):
        row = [pass_at_k(n, c, k) for k in range(1, n + 1)]
        assert row == sorted(row)
        if c < n:
            assert all(pass_at_k(n, c, k) <= pass_at_k(n, c + 1, k) for k in range(1, n + 1))


def test_bad_arguments_are_refused():
    with pytest.raises(ValueError, match="k=6 must lie in"):
        pass_at_k(5, 1, 6)
    with pytest.raises(ValueError, match="c=7"):
        pass_at_k(5, 7, 1)
    with pytest.raises(ValueError, match="same number"):
        pass_at_k_metrics([[True, False], [True]])


def test_interval_by_hand():
    # values 1, 0, 1, 1: mean 0.75, s = sqrt((3·0.25² + 0.75²)/3) = 0.5, half = 1.959964·0.5/2 = 0.489991
    mean, lo, hi = mean_interval([1.0, 0.0, 1.0, 1.0])
    assert mean == 0.75
    assert lo == pytest.approx(0.75 - 0.489991, abs=1e-6)
    assert hi == 1.0  # 1.239991 clipped
    assert mean_interval([0.5]) == (0.5, 0.0, 1.0)


def test_metrics_of_two_problems_by_hand():
    # problem A: 2 of 4 right, problem B: 0 of 4. pass@1 = (0.5 + 0)/2; pass@2 = (1 − C(2,2)/C(4,2) + 0)/2 = (5/6)/2;
    # pass@4 = (1 + 0)/2; avg@4 = pass@1
    m = pass_at_k_metrics([[True, False, True, False], [False] * 4])
    assert default_ks(4) == [1, 2, 4]
    assert m["eval/pass@1"] == pytest.approx(0.25)
    assert m["eval/pass@2"] == pytest.approx(5 / 12)
    assert m["eval/pass@4"] == pytest.approx(0.5)
    assert m["eval/avg@4"] == m["eval/pass@1"]
    # per-problem pass@4 values 1 and 0: s = sqrt(0.5), half = 1.959964·sqrt(0.5)/sqrt(2) = 0.979982
    assert m["eval/pass@4_low"] == 0.0 and m["eval/pass@4_high"] == 1.0
    assert m["eval/pass@1_high"] == pytest.approx(0.25 + 1.959964 * math.sqrt(0.125) / math.sqrt(2), abs=1e-6)
    assert default_ks(6) == [1, 2, 4, 6]


def test_trainer_logs_pass_at_k_when_asked(tmp_path):
    trainer = make_trainer(tmp_path / "run", eval={"samples_per_prompt": 4}, loop={"steps": 1})
    result = trainer.train()
    row = result.eval_after
    assert {"eval/pass@1", "eval/pass@2", "eval/pass@4", "eval/avg@4", "eval/pass@4_low"} <= set(row)
    assert row["eval/pass@1"] == pytest.approx(row["eval/avg@4"])
    assert row["eval/pass@1"] <= row["eval/pass@2"] <= row["eval/pass@4"]


def test_lmpo_eval_samples(capsys):
    from lmpo.cli import main

    assert main(["eval", "tiny", "--task", "addition", "--n", "6", "--samples", "4", "--max-new-tokens", "3"]) == 0
    out = capsys.readouterr().out
    assert "pass@1 " in out and "pass@4 " in out and "avg@4 " in out and "(over problems)" in out
