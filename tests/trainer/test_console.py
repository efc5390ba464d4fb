"""The console: a progress bar only on a terminal; piped, one plain line per interval and no carriage returns."""

from __future__ import annotations

import pytest

from lmpo.trainer.run import metrics as metrics_mod
from lmpo.trainer.run.metrics import MetricsLogger, console_line, line_interval

STEP = {"reward/mean": 0.5, "reward/accuracy": 0.25, "completion/length_mean": 3.0, "optim/grad_norm": 0.8,
        "loss/total": 1e-8}


def _run(tmp_path, steps=40, **kw):
    logger = MetricsLogger(tmp_path, steps, tensorboard=False, **kw)
    logger.log(0, {"eval/accuracy": 0.1, "eval/reward_mean": 0.2, "eval/length_mean": 3.0}, kind="eval")
    for step in range(1, steps + 1):
        logger.log(step, STEP)
    logger.close()
    return logger


def test_piped_console_gets_plain_lines_per_interval(tmp_path, capsys):
    _run(tmp_path, steps=40)  # pytest captures stdout: not a terminal
    captured = capsys.readouterr()
    lines = captured.out.splitlines()
    assert "\r" not in captured.out + captured.err  # no progress-bar redraws in a log file
    assert lines[0] == "eval step  0/40 | accuracy 0.100 | reward 0.200 | length 3.0"
    train = [ln for ln in lines if ln.startswith("step")]
    assert [int(ln.split()[1].split("/")[0]) for ln in train] == list(range(2, 41, 2))  # line_interval(40) = 2
    assert train[-1].startswith("step 40/40 | reward 0.500 | acc 0.250 | len 3.0 | |g| 0.8 | ")
    assert "ETA 0s" in train[-1] and "loss" not in train[-1]


def test_explicit_interval_and_silence(tmp_path, capsys):
    _run(tmp_path / "a", steps=25, print_every_steps=10)
    steps = [ln.split()[1] for ln in capsys.readouterr().out.splitlines() if ln.startswith("step")]
    assert steps == ["10/25", "20/25", "25/25"]  # the last step always gets a line
    _run(tmp_path / "b", steps=25, print_every_steps=0)
    assert [ln for ln in capsys.readouterr().out.splitlines() if ln.startswith("step")] == []


def test_progress_bar_only_on_a_terminal(tmp_path, monkeypatch):
    monkeypatch.setattr(metrics_mod, "console_is_terminal", lambda: True)
    logger = MetricsLogger(tmp_path / "tty", 10, tensorboard=False)
    assert logger._bar is not None and logger.print_every_steps == 0
    logger.close()
    monkeypatch.setattr(metrics_mod, "console_is_terminal", lambda: False)
    logger = MetricsLogger(tmp_path / "pipe", 10, tensorboard=False)
    assert logger._bar is None and logger.print_every_steps == 1
    logger.close()


@pytest.mark.parametrize("steps,interval", [(1, 1), (20, 1), (21, 2), (100, 5), (600, 50), (1000, 50),
                                            (5000, 250), (12345, 1000)])
def test_line_interval_is_round_and_gives_at_most_about_20_lines(steps, interval):
    assert line_interval(steps) == interval and steps / interval <= 20


def test_console_line_skips_missing_and_non_finite_values():
    assert console_line(3, 10, {"reward/mean": float("nan"), "entropy/mean": 1.5}) == "step  3/10 | H 1.500"
