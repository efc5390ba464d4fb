"""The lab's progress display: jobs done / running / left and the time left.

On a terminal one status line is redrawn in place and finished jobs scroll above it; when stdout is not a
terminal (a log file, CI) every event is one plain line and the status line is printed after each finished job
and at most once a minute otherwise.

The time left is estimated from the jobs finished in this session: the mean duration of each kind (warm-up,
cell, snapshot; any kind's mean before one of a kind has finished), summed over the jobs still to do (a
running job counts what its estimate has left) and divided by the number of jobs running at once.
"""

from __future__ import annotations

import sys
import time
from typing import TextIO


def _duration(seconds: float) -> str:
    seconds = max(0, int(round(seconds)))
    h, rest = divmod(seconds, 3600)
    m, s = divmod(rest, 60)
    return f"{h}h{m:02d}m" if h else f"{m}m{s:02d}s" if m else f"{s}s"


class Progress:
    """Tracks jobs and prints their progress (``mode``: ``auto``, ``lines`` or ``quiet``)."""

    def __init__(self, kinds: dict[str, str], done: int, *, jobs: int, mode: str = "auto",
                 stream: TextIO | None = None, clock=time.monotonic) -> None:
        """``kinds``: key → kind of every job still to run; ``done``: jobs already finished before this run."""
        self.stream = stream or sys.stdout
        self.tty = mode == "auto" and hasattr(self.stream, "isatty") and self.stream.isatty()
        self.mode = mode
        self.clock = clock
        self.jobs = jobs
        self.kinds = dict(kinds)
        self.done_before = done
        self.total = done + len(kinds)
        self.finished: dict[str, float] = {}
        self.failed: list[str] = []
        self.running: dict[str, float] = {}
        self.t0 = clock()
        self._last_line = -1e9
        self._last_text = ""
        self._status_width = 0

    # ------------------------------------------------------------------ events
    def start(self, key: str) -> None:
        self.running[key] = self.clock()
        self._event(f"start  {key}")

    def finish(self, key: str) -> None:
        began = self.running.pop(key, self.clock())
        self.finished[key] = self.clock() - began
        self._event(f"done   {key} ({_duration(self.finished[key])})", status=True)

    def fail(self, key: str, why: str) -> None:
        self.running.pop(key, None)
        self.failed.append(key)
        self._event(f"FAILED {key}: {why}", status=True)

    def note(self, message: str) -> None:
        self._event(message)

    def tick(self) -> None:
        """Called while waiting: redraws the terminal line, or prints the status once a minute."""
        if self.mode == "quiet":
            return
        if self.tty:
            self._draw()
        elif self.clock() - self._last_line >= 60:
            self._print(self.status())

    def close(self) -> None:
        if self.mode == "quiet":
            return
        if self.tty:
            self._clear()
        status = self.status()
        if status != self._last_text:
            self._print(status)

    # ------------------------------------------------------------------ numbers
    def counts(self) -> tuple[int, int, int]:
        done = self.done_before + len(self.finished)
        running = len(self.running)
        return done, running, self.total - done - running - len(self.failed)

    def seconds_left(self) -> float | None:
        if not self.finished:
            return None
        by_kind: dict[str, list[float]] = {}
        for key, secs in self.finished.items():
            by_kind.setdefault(self.kinds[key], []).append(secs)
        overall = sum(self.finished.values()) / len(self.finished)

        def estimate(key: str) -> float:
            values = by_kind.get(self.kinds[key])
            return sum(values) / len(values) if values else overall

        now = self.clock()
        work = sum(max(0.0, estimate(k) - (now - t)) for k, t in self.running.items())
        work += sum(estimate(k) for k in self.kinds if k not in self.finished and k not in self.running
                    and k not in self.failed)
        return work / max(1, self.jobs)

    def status(self) -> str:
        done, running, left = self.counts()
        eta = self.seconds_left()
        failed = f", {len(self.failed)} failed" if self.failed else ""
        return (f"[lab] {done}/{self.total} done, {running} running, {left} left{failed}; elapsed "
                f"{_duration(self.clock() - self.t0)}, time left {'~' + _duration(eta) if eta is not None else 'unknown'}")

    # ------------------------------------------------------------------ output
    def _event(self, message: str, status: bool = False) -> None:
        if self.mode == "quiet":
            return
        if self.tty:
            self._clear()
            self._print(f"[lab] {message}")
            self._draw()
        else:
            self._print(f"[lab] {message}")
            if status:
                self._print(self.status())

    def _print(self, line: str) -> None:
        print(line, file=self.stream, flush=True)
        self._last_line = self.clock()
        self._last_text = line

    def _draw(self) -> None:
        line = self.status()
        self.stream.write("\r" + line.ljust(self._status_width))
        self.stream.flush()
        self._status_width = len(line)

    def _clear(self) -> None:
        if self._status_width:
            self.stream.write("\r" + " " * self._status_width + "\r")
            self.stream.flush()
            self._status_width = 0


__all__ = ["Progress"]
