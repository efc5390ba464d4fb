"""A run directory has one writer (lmpo.runs.RunLock), checked with real processes: a second trainer is refused
while the first holds the directory (even with --overwrite, which would delete the first's files), and a lock
left by a killed process is taken over with a note."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
from pathlib import Path

import pytest
from trainer_helpers import make_trainer

from lmpo.errors import InputError
from lmpo.runs import LOCK_FILE, RunLock

SRC = str(Path(__file__).resolve().parents[2] / "src")

# a second process that takes the lock, says so on stdout, then holds it until stdin closes (or it is killed)
HOLDER = """
import sys
from lmpo.runs import RunLock
with RunLock(sys.argv[1], dir_option="logging.run_dir"):
    print("locked", flush=True)
    sys.stdin.read()
"""


def _holder(run_dir: Path) -> subprocess.Popen:
    env = {**os.environ, "PYTHONPATH": SRC + os.pathsep + os.environ.get("PYTHONPATH", "")}
    proc = subprocess.Popen([sys.executable, "-c", HOLDER, str(run_dir)], stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, text=True, env=env)
    assert proc.stdout.readline().strip() == "locked"
    return proc


def test_a_second_writer_is_refused_naming_the_owner_and_the_first_run_is_untouched(tmp_path):
    run = tmp_path / "run"
    first = _holder(run)
    try:
        (run / "metrics.jsonl").write_text('{"step": 1}\n')  # the first writer's files
        trainer = make_trainer(run)
        with pytest.raises(InputError) as err:
            trainer.train(overwrite=True)
        message = str(err.value)
        assert f"pid {first.pid} on host {socket.gethostname()}" in message
        assert "logging.run_dir" in message
        assert (run / "metrics.jsonl").read_text() == '{"step": 1}\n'  # --overwrite deleted nothing
        owner = json.loads((run / LOCK_FILE).read_text())
        assert owner["pid"] == first.pid and owner["host"] == socket.gethostname()
    finally:
        first.stdin.close()
        assert first.wait(timeout=30) == 0
    assert not (run / LOCK_FILE).exists()  # released (and removed) at the owner's exit
    result = make_trainer(run).train(overwrite=True)  # the directory is free again
    assert result.steps_done == 2 and not (run / LOCK_FILE).exists()


def test_a_lock_left_by_a_killed_process_is_taken_over_with_a_note(tmp_path):
    run = tmp_path / "run"
    dead = _holder(run)
    dead.send_signal(signal.SIGKILL)  # no cleanup: the lock file stays, naming the dead process
    dead.wait(timeout=30)
    assert json.loads((run / LOCK_FILE).read_text())["pid"] == dead.pid
    notes: list[str] = []
    with RunLock(run, dir_option="logging.run_dir", log=notes.append) as lock:
        assert json.loads(lock.path.read_text())["pid"] == os.getpid()
    (note,) = notes
    assert f"pid {dead.pid} on host {socket.gethostname()}" in note and "gone" in note
    assert not (run / LOCK_FILE).exists()


def test_one_process_cannot_hold_a_directory_twice_and_a_file_is_no_run_directory(tmp_path):
    run = tmp_path / "run"
    with RunLock(run, dir_option="logging.run_dir"):
        with pytest.raises(InputError, match=f"pid {os.getpid()} on host"):
            RunLock(run, dir_option="--run-dir").acquire()
    (tmp_path / "file").write_text("x")
    with pytest.raises(InputError, match="is a file; choose another --run-dir"):
        RunLock(tmp_path / "file", dir_option="--run-dir").acquire()


def test_a_run_refused_before_it_starts_leaves_no_directory(tmp_path):
    run = tmp_path / "never"
    with pytest.raises(InputError, match="holds no run to continue"):
        make_trainer(run).train(resume="auto")
    assert not run.exists()
