"""The progress display: counts, the time-left estimate, plain lines without a terminal, one line with one."""

from __future__ import annotations

import io

from lmpo.lab.progress import Progress


class Clock:
    def __init__(self) -> None:
        self.t = 0.0

    def __call__(self) -> float:
        return self.t


class Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def _progress(stream, clock, mode="auto"):
    kinds = {"warmup/s0": "warmup", "train/a/s0": "train", "train/b/s0": "train", "train/c/s0": "train"}
    return Progress(kinds, done=2, jobs=2, mode=mode, stream=stream, clock=clock)


def test_counts_and_time_left_from_finished_jobs_of_each_kind():
    clock, out = Clock(), io.StringIO()
    p = _progress(out, clock)
    assert p.counts() == (2, 0, 4) and p.seconds_left() is None
    p.start("warmup/s0")
    clock.t = 100.0
    p.finish("warmup/s0")
    p.start("train/a/s0")
    p.start("train/b/s0")
    clock.t = 130.0
    p.finish("train/a/s0")  # a cell takes 30 s: b has ~0 s left, c 30 s; two at a time
    assert p.counts() == (4, 1, 1)
    assert p.seconds_left() == 15.0
    p.fail("train/b/s0", "boom")
    assert p.counts() == (4, 0, 1)


def test_plain_lines_when_not_a_terminal():
    clock, out = Clock(), io.StringIO()
    p = _progress(out, clock)
    p.start("warmup/s0")
    clock.t = 65.0
    p.finish("warmup/s0")
    p.tick()
    p.close()
    lines = out.getvalue().splitlines()
    assert lines[0] == "[lab] start  warmup/s0"
    assert lines[1] == "[lab] done   warmup/s0 (1m05s)"
    assert lines[2].startswith("[lab] 3/6 done, 0 running, 3 left; elapsed 1m05s, time left ~")
    # a tick within the minute prints nothing, and closing does not repeat an unchanged status line
    assert "\r" not in out.getvalue() and len(lines) == 3
    clock.t = 70.0
    p.close()
    assert out.getvalue().splitlines()[-1].startswith("[lab] 3/6 done, 0 running, 3 left; elapsed 1m10s")


def test_one_redrawn_status_line_on_a_terminal():
    clock, out = Clock(), Terminal()
    p = _progress(out, clock)
    p.start("warmup/s0")
    clock.t = 5.0
    p.tick()
    text = out.getvalue()
    assert text.count("\r") >= 2 and "[lab] start  warmup/s0\n" in text
    assert text.rstrip().endswith("time left unknown")


def test_quiet_prints_nothing():
    clock, out = Clock(), io.StringIO()
    p = _progress(out, clock, mode="quiet")
    p.start("warmup/s0")
    p.finish("warmup/s0")
    p.close()
    assert out.getvalue() == ""
