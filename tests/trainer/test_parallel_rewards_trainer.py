"""A trainer run whose reward hangs or raises finishes, with the failed calls counted in `reward/errors`."""

from __future__ import annotations

import time

import pytest
from trainer_helpers import make_trainer

from lmpo.config import ConfigError


def hang(prompts, completions, answer, **kwargs):
    time.sleep(600)
    return [0.0] * len(completions)


def boom(prompts, completions, answer, **kwargs):
    raise RuntimeError("verifier unavailable")


def test_hanging_and_raising_rewards_are_counted_errors(tmp_path):
    rewards = {"functions": ["exact_match", "test_parallel_rewards_trainer:hang", "test_parallel_rewards_trainer:boom"],
               "weights": [1.0, 1.0, 1.0], "kwargs": {}, "workers": 4, "timeout_s": 0.5, "seqs_per_call": 6}
    # on_error left at its default (`auto`): with a pool, a raising call is a counted error like a hanging one
    t0 = time.monotonic()
    result = make_trainer(tmp_path / "run", rewards=rewards, loop={"steps": 2}).train()
    assert time.monotonic() - t0 < 120
    # 12 completions per step in calls of 6: hang and boom fail on both calls of each step
    assert [row["reward/errors"] for row in result.history] == [4.0, 4.0]
    assert all(row["reward/test_parallel_rewards_trainer:hang/mean"] != row["reward/test_parallel_rewards_trainer:hang/mean"]
               for row in result.history)  # NaN: no value defined


def test_pool_options_need_workers(tmp_path):
    with pytest.raises(ConfigError, match="`rewards.timeout_s` = 5.0 has no effect while `rewards.workers` = 0"):
        make_trainer(tmp_path / "run", rewards={"timeout_s": 5.0})


def test_without_a_pool_a_raising_reward_still_stops_the_run_by_default(tmp_path):
    from lmpo.errors import RunError

    rewards = {"functions": ["exact_match", "test_parallel_rewards_trainer:boom"], "weights": [1.0, 1.0]}
    with pytest.raises(RunError, match="boom"):
        make_trainer(tmp_path / "run", rewards=rewards, loop={"steps": 1}).train()
