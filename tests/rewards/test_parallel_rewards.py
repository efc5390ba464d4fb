"""Rewards in a thread or process pool (lmpo.rewards.parallel): equal to the serial scorer, hanging and raising
rewards counted (never stuck), async rewards."""

from __future__ import annotations

import asyncio
import threading
import time

import pytest
import torch

from lmpo.errors import RunError
from lmpo.rewards import RewardScorer
from lmpo.rewards.parallel import ParallelRewardScorer, run_in_threads

PROMPTS = [f"{i}+1=" for i in range(10)]
COMPLETIONS = [str(i + 1) if i % 3 else "x" for i in range(10)]
ANSWERS = [str(i + 1) for i in range(10)]
_BARRIER = threading.Barrier(4, timeout=20)


def length(prompts, completions, answer, **kwargs):
    return [float(len(c)) for c in completions]


def hang(prompts, completions, answer, **kwargs):
    time.sleep(600)  # a reward service that never answers
    return [0.0] * len(completions)


def boom(prompts, completions, answer, **kwargs):
    raise ValueError("the verifier crashed")


async def async_length(prompts, completions, answer, **kwargs):
    await asyncio.sleep(0.01)
    return [float(len(c)) for c in completions]


async def meet(prompts, completions, answer, **kwargs):
    """Returns only once 4 calls run at the same time (the barrier breaks after 20 s otherwise)."""
    await asyncio.to_thread(_BARRIER.wait)
    return [1.0] * len(completions)


def _specs(*names):
    return [{"name": f"test_parallel_rewards:{n}", "weight": w} for n, w in names]


def test_thread_pool_equals_the_serial_scorer():
    specs = [{"name": "exact_match", "weight": 1.0}] + _specs(("length", 0.5), ("async_length", 0.25))
    serial_total, serial = RewardScorer(specs).score(PROMPTS, COMPLETIONS, ANSWERS)
    total, per_fn = ParallelRewardScorer(specs, workers=3, seqs_per_call=3).score(PROMPTS, COMPLETIONS, ANSWERS)
    torch.testing.assert_close(total, serial_total)
    for name in serial:
        torch.testing.assert_close(per_fn[name], serial[name], equal_nan=True)
    # by hand: exact match on the 6 of 10 completions that are not "x"; length 1 or 2 characters
    assert total[1].item() == pytest.approx(1.0 + 0.5 * 1 + 0.25 * 1)


def test_a_hanging_reward_times_out_and_is_counted():
    scorer = ParallelRewardScorer(_specs(("length", 1.0), ("hang", 1.0)), workers=2, timeout_s=0.5,
                                  seqs_per_call=5, on_error="raise")
    for _ in range(2):  # the abandoned calls hold no worker: the second batch is scored as the first
        t0 = time.monotonic()
        total, per_fn = scorer.score(PROMPTS, COMPLETIONS, ANSWERS)
        assert time.monotonic() - t0 < 10  # two waves of 0.5 s, not the 600 s of the hanging call
        assert torch.isnan(per_fn["test_parallel_rewards:hang"]).all()
        torch.testing.assert_close(total, per_fn["test_parallel_rewards:length"])
        assert scorer.last_stats == {"reward/skipped": 2.0, "reward/timeouts": 2.0, "reward/nonfinite": 0.0}
    assert scorer.timed_out_calls == 4


def test_a_raising_reward_is_counted_or_named():
    skip = ParallelRewardScorer(_specs(("length", 1.0), ("boom", 1.0)), workers=2, on_error="skip")
    total, per_fn = skip.score(PROMPTS, COMPLETIONS, ANSWERS)
    assert torch.isnan(per_fn["test_parallel_rewards:boom"]).all()
    assert skip.last_stats == {"reward/skipped": 1.0, "reward/timeouts": 0.0, "reward/nonfinite": 0.0}
    strict = ParallelRewardScorer(_specs(("boom", 1.0)), workers=2)
    with pytest.raises(RunError, match="'test_parallel_rewards:boom' raised ValueError: the verifier crashed"):
        strict.score(PROMPTS, COMPLETIONS, ANSWERS)


def test_async_rewards_run_concurrently_and_serially():
    scorer = ParallelRewardScorer(_specs(("meet", 1.0)), workers=4, seqs_per_call=3, timeout_s=60)
    total, _ = scorer.score(PROMPTS[:12], COMPLETIONS, ANSWERS)  # 10 completions → 4 calls, all at once
    assert total.tolist() == [1.0] * 10
    serial_total, _ = RewardScorer(_specs(("async_length", 1.0))).score(PROMPTS, COMPLETIONS, ANSWERS)
    assert serial_total.tolist() == [float(len(c)) for c in COMPLETIONS]


def test_run_in_threads_keeps_the_order_and_reports_exceptions():
    calls = [(lambda i=i, **kw: [i] * 2, {}) for i in range(7)] + [(boom, {"prompts": [], "completions": [],
                                                                            "answer": []})]
    out = run_in_threads(calls, workers=3, timeout_s=0)
    assert [v for ok, v in out[:7]] == [[i, i] for i in range(7)]
    assert out[7][0] is False and isinstance(out[7][1], ValueError)


def test_process_pool_times_out_hangs_and_keeps_scoring():
    scorer = ParallelRewardScorer(_specs(("length", 1.0), ("hang", 1.0), ("boom", 1.0)), workers=2, pool="process",
                                  timeout_s=3.0, on_error="skip")
    try:
        total, per_fn = scorer.score(PROMPTS, COMPLETIONS, ANSWERS)
        assert torch.isnan(per_fn["test_parallel_rewards:hang"]).all()
        assert torch.isnan(per_fn["test_parallel_rewards:boom"]).all()
        # length and boom finish at once on the two workers, hang is the one call past its timeout
        assert scorer.last_stats == {"reward/skipped": 2.0, "reward/timeouts": 1.0, "reward/nonfinite": 0.0}
        torch.testing.assert_close(total, per_fn["test_parallel_rewards:length"])
        plain = ParallelRewardScorer(_specs(("length", 1.0)), workers=2, pool="process", timeout_s=30)
        total, _ = plain.score(PROMPTS, COMPLETIONS, ANSWERS)
        assert total.tolist() == [float(len(c)) for c in COMPLETIONS]
        plain.close()
    finally:
        scorer.close()


def not_finite(prompts, completions, answer, **kwargs):
    """By prompt i (PROMPTS[i] = "i+1="): NaN, inf, 1e308, -2e9, None, 1.0, then 0.5 (whatever the calls' sizes)."""
    values = [float("nan"), float("inf"), 1e308, -2e9, None, 1.0]
    return [values[i] if i < len(values) else 0.5 for i in (int(p.split("+")[0]) for p in prompts)]


def exits(prompts, completions, answer, **kwargs):
    raise SystemExit(0)


@pytest.mark.slow
@pytest.mark.parametrize("pool", ["thread", "process"])
def test_pools_count_nonfinite_values_and_name_an_exit(pool):
    """As the serial scorer: non-finite values counted (skip) or named (raise); sys.exit() in a reward is an error
    of that reward (in a process pool too, where it would otherwise end the worker), never the end of the run."""
    skip = ParallelRewardScorer(_specs(("not_finite", 1.0), ("exits", 1.0)), workers=2, pool=pool, on_error="skip",
                                seqs_per_call=5)
    try:
        total, per_fn = skip.score(PROMPTS, COMPLETIONS, ANSWERS)
        assert skip.last_stats == {"reward/skipped": 2.0, "reward/timeouts": 0.0, "reward/nonfinite": 4.0}
        assert torch.isnan(per_fn["test_parallel_rewards:not_finite"][:5]).all()
        assert total.tolist() == [0.0] * 5 + [1.0] + [0.5] * 4
    finally:
        skip.close()
    if pool == "thread":  # raise: the message names the value and the sample, or the exit
        with pytest.raises(RunError, match=r"returned nan for sample 0 .*4 of its 5 values"):
            ParallelRewardScorer(_specs(("not_finite", 1.0)), workers=2, seqs_per_call=5).score(
                PROMPTS, COMPLETIONS, ANSWERS)
        with pytest.raises(RunError, match=r"raised RewardExit: the function called sys.exit\(0\)"):
            ParallelRewardScorer(_specs(("exits", 1.0)), workers=2).score(PROMPTS, COMPLETIONS, ANSWERS)
