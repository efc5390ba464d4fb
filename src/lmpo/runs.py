"""Run directories: one run per directory, what ``--resume`` may change, and metrics files that survive a kill.

Rules shared by ``lmpo train`` and ``lmpo sac train``:

* A directory that already holds a run is refused unless the command says ``--resume`` (continue it from its
  newest complete checkpoint) or ``--overwrite`` (delete the run's files and start again; files lmpo did not
  write are left alone). ``--resume`` where there is no checkpoint is an error, not a silent fresh start.
* ``--resume`` compares the stored config with the new one: a change outside the command's allowed keys
  (how long to run, logging, evaluation and checkpoint cadence) is refused, naming each changed key, unless
  ``--allow-config-change`` is given.
* Metrics files are append-only JSONL. A resumed run cuts the file back to the rows its checkpoint had seen,
  through a temporary file and a rename; a torn last line (a kill mid-write) is dropped and reported.
* Temporary files a killed writer left behind (``.tmp_*``) are removed when a run starts.
* Every command's run directory stores its resolved config as ``config.yaml`` (:func:`write_run_config`) and its
  TensorBoard events under ``tensorboard/`` (``TENSORBOARD_DIR``); ``config.json`` of SAC runs written before
  is still read (:func:`stored_config_path`).
* lmpo never writes through a symbolic link in a run directory: a link among the names a command writes
  (its entries, anything under the folders among them, ``plots/``, the lock file) is refused before the run
  starts (:func:`refuse_links`), and the files it appends to are opened with ``O_NOFOLLOW``
  (:func:`open_append`), so a link planted later is refused too. A link could otherwise make a resumed run or
  ``lmpo plot`` overwrite or append to any file the user can write.
* A run directory has one writer (:class:`RunLock`): ``RUN_DIR/.lmpo-lock`` names the process (PID, host) that
  holds it from start to exit; a second writer is refused, naming the owner; a lock whose process is gone
  (killed without cleaning up) is taken over with a note.
"""

from __future__ import annotations

import contextlib
import datetime
import errno
import fcntl
import json
import os
import shutil
import signal
import socket
import sys
import threading
from collections.abc import Callable, Iterable, Iterator, Mapping
from pathlib import Path
from typing import Any

import yaml

from lmpo.checkpoints import remove_stale, replace_file
from lmpo.config import ConfigError, changed_keys, from_dict, to_dict
from lmpo.errors import InputError

#: the resolved config of a run, in every command's run directory
CONFIG_FILE = "config.yaml"
#: where a run's TensorBoard events go
TENSORBOARD_DIR = "tensorboard"
#: the config file of SAC runs written before the one convention (read, never written)
LEGACY_CONFIG_FILE = "config.json"
#: where every command's run directory gets its training curves (``lmpo plot``, ``logging.plots``)
PLOTS_DIR = "plots"


def link_refused(path: str | os.PathLike, fix: str) -> InputError:
    """The one message for a symbolic link where lmpo would write; ``fix``: the sentence's alternative."""
    path = Path(path)
    try:
        target = os.readlink(path)
    except OSError:
        target = "?"
    return InputError(f"{path} is a symbolic link (to {target!r}): lmpo writes there and never follows a link "
                      "out of a run directory, which could overwrite or append to whatever the link points at. "
                      f"Remove the link (or replace it with a real file or folder), or {fix}.")


def refuse_links(run_dir: str | os.PathLike, names: Iterable[str], *, dir_option: str) -> None:
    """Raise :func:`link_refused`'s InputError when ``RUN_DIR/NAME`` or anything under it (for each of ``names``, the
    files and folders a command writes) is a symbolic link; the run directory itself may be one (the user names it)."""
    root = Path(run_dir)
    fix = f"choose another {dir_option}"
    for name in names:
        p = root / name
        if p.is_symlink():
            raise link_refused(p, fix)
        if p.is_dir():
            for folder, dirs, files in os.walk(p):  # os.walk does not descend into linked folders
                for n in (*dirs, *files):
                    if os.path.islink(os.path.join(folder, n)):
                        raise link_refused(os.path.join(folder, n), fix)


def open_no_follow(path: str | os.PathLike, flags: int, fix: str = "write the run to another directory",
                   mode: int = 0o666) -> int:
    """``os.open(path, flags | O_NOFOLLOW, mode)``: a file descriptor, or :func:`link_refused`'s InputError when
    ``path`` is a symbolic link."""
    try:
        return os.open(path, flags | os.O_NOFOLLOW | getattr(os, "O_CLOEXEC", 0), mode)
    except OSError as e:
        if e.errno == errno.ELOOP:
            raise link_refused(path, fix) from None
        raise


def open_append(path: str | os.PathLike):
    """``open(path, "a")`` (UTF-8 text) that refuses a symbolic link instead of appending to its target."""
    return os.fdopen(open_no_follow(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT), "a", encoding="utf-8")


def write_run_config(run_dir: str | os.PathLike, config: Mapping[str, Any]) -> Path:
    """Store a run's resolved config as ``RUN_DIR/config.yaml`` (atomically); returns its path."""
    path = Path(run_dir) / CONFIG_FILE
    replace_file(path, yaml.safe_dump(dict(config), sort_keys=False, allow_unicode=True).encode("utf-8"))
    return path


def stored_config_path(run_dir: str | os.PathLike) -> Path | None:
    """The config a run stored: ``config.yaml``, or ``config.json`` of a SAC run written before; None if neither."""
    for name in (CONFIG_FILE, LEGACY_CONFIG_FILE):
        if (Path(run_dir) / name).is_file():
            return Path(run_dir) / name
    return None


#: the lock file of a run directory (not one of a run's entries: ``--overwrite`` leaves it alone)
LOCK_FILE = ".lmpo-lock"


class RunLock:
    """The one writer of a run directory, from ``__enter__`` to ``__exit__``.

    ``RUN_DIR/.lmpo-lock`` holds ``{"pid", "host", "started"}`` of the owner under an exclusive ``flock``, which the
    kernel drops when the owner exits however it exits; so a lock file whose ``flock`` is free was left by a
    process that is gone, and is taken over (``log`` says whose it was). While the owner lives, another
    ``RunLock`` on the directory raises :class:`lmpo.errors.InputError` naming it. The file is removed on release.

    >>> with RunLock(run_dir, dir_option="logging.run_dir"):
    ...     train()
    """

    def __init__(self, run_dir: str | os.PathLike, *, dir_option: str, log: Callable[[str], None] | None = None):
        self.run_dir, self.dir_option = Path(run_dir), dir_option
        self.log = log or (lambda msg: print(msg, file=sys.stderr, flush=True))
        self.path = self.run_dir / LOCK_FILE
        self._fd: int | None = None
        self._created = False

    def __enter__(self) -> RunLock:
        self.acquire()
        return self

    def __exit__(self, *exc) -> None:
        self.release()

    def acquire(self) -> None:
        if self.run_dir.exists() and not self.run_dir.is_dir():
            raise InputError(f"run directory {str(self.run_dir)!r} is a file; choose another {self.dir_option}.")
        self._created = not self.run_dir.exists()
        try:
            self.run_dir.mkdir(parents=True, exist_ok=True)
        except OSError as e:
            raise InputError(f"run directory {str(self.run_dir)!r} cannot be created ({e.strerror or e}); choose "
                             f"another {self.dir_option}.") from None
        while True:
            fd = open_no_follow(self.path, os.O_RDWR | os.O_CREAT, f"choose another {self.dir_option}", 0o644)
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                owner = _describe_owner(_read_owner(fd))
                os.close(fd)  # (the directory is the owner's: never removed here)
                raise InputError(f"run directory {str(self.run_dir)!r} is in use by another lmpo process ({owner}); "
                                 "two writers would mix (or, with --overwrite, delete) each other's files. Wait for "
                                 f"it to finish or stop it, or choose another {self.dir_option}.") from None
            # the owner may have released (and removed) the file between our open and our flock: lock the new one
            with contextlib.suppress(FileNotFoundError):
                if os.fstat(fd).st_ino == os.stat(self.path).st_ino:
                    break
            os.close(fd)
        previous = _read_owner(fd)
        if previous:
            self.log(f"note: {self.path} was left by {_describe_owner(previous)}, which is gone; taking the run "
                     "directory over.")
        me = {"pid": os.getpid(), "host": socket.gethostname(),
              "started": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")}
        os.ftruncate(fd, 0)
        os.pwrite(fd, json.dumps(me).encode("utf-8"), 0)
        os.fsync(fd)
        self._fd = fd

    def release(self) -> None:
        if self._fd is None:
            return
        with contextlib.suppress(FileNotFoundError):
            self.path.unlink()  # before the unlock: a waiter that opened this file then sees it is gone
        os.close(self._fd)  # drops the flock
        self._fd = None
        if self._created:  # a run refused before it wrote anything leaves no directory behind
            with contextlib.suppress(OSError):
                self.run_dir.rmdir()  # only when empty


def _read_owner(fd: int) -> dict:
    raw = os.pread(fd, 4096, 0)
    try:
        owner = json.loads(raw.decode("utf-8")) if raw.strip() else {}
    except (UnicodeDecodeError, ValueError):
        return {"unreadable": raw[:80].decode("utf-8", "replace")}
    return owner if isinstance(owner, dict) else {}


def _describe_owner(owner: dict) -> str:
    if not owner:
        return "an owner that has not written its name yet"
    if "unreadable" in owner:
        return f"an owner whose lock file is unreadable ({owner['unreadable']!r})"
    return f"pid {owner.get('pid')} on host {owner.get('host')}, since {owner.get('started')}"


def holds_run(run_dir: str | os.PathLike, entries: Iterable[str]) -> list[str]:
    """The names of ``entries`` (files lmpo writes) present in ``run_dir``."""
    run_dir = Path(run_dir)
    return [e for e in entries if (run_dir / e).exists()] if run_dir.is_dir() else []


def prepare_run_dir(run_dir: str | os.PathLike, entries: Iterable[str], *, resume: bool, overwrite: bool,
                    dir_option: str) -> None:
    """Apply the one-run-per-directory rule (module docstring) and remove stale temporary files.

    ``entries``: the files and folders this kind of run writes; ``dir_option``: how the user names the
    directory (e.g. ``logging.run_dir``), for the message.
    """
    run_dir, entries = Path(run_dir), tuple(entries)
    if resume and overwrite:
        raise InputError("--resume and --overwrite contradict each other: --resume continues the run in "
                         f"{str(run_dir)!r}, --overwrite deletes it. Give one of them.")
    if run_dir.exists() and not run_dir.is_dir():
        raise InputError(f"run directory {str(run_dir)!r} is a file; choose another {dir_option}.")
    present = holds_run(run_dir, entries)
    if resume and not present:
        raise InputError(f"--resume: {str(run_dir)!r} holds no run to continue (no checkpoint, config or metrics "
                         f"there). Start the run without --resume, or point {dir_option} at the run's directory.")
    if present and not resume:
        if not overwrite:
            raise InputError(f"run directory {str(run_dir)!r} already holds a run ({', '.join(present)}). Add "
                             "--resume to continue it, --overwrite to delete it and start again, or choose "
                             f"another {dir_option}.")
        for name in present:
            p = run_dir / name
            if p.is_dir() and not p.is_symlink():
                shutil.rmtree(p)
            else:
                p.unlink()
    try:
        run_dir.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise InputError(f"run directory {str(run_dir)!r} cannot be created ({e.strerror or e}); choose another "
                         f"{dir_option}.") from None
    refuse_links(run_dir, (*entries, PLOTS_DIR), dir_option=dir_option)
    remove_stale(run_dir)


def _allowed(key: str, allowed: Iterable[str]) -> bool:
    return any(key == a or (a.endswith(".*") and key.startswith(a[:-1])) for a in allowed)


def check_resume_config(stored: Mapping[str, Any], new: Mapping[str, Any], allowed: Iterable[str], *,
                        allow_change: bool, stored_path: str | os.PathLike,
                        schema: type | None = None) -> list[tuple[str, Any, Any]]:
    """Compare a run's stored config with the one it is resumed with; return the changes.

    With ``schema`` (the config dataclass), the stored config is read through it first, so a field that a later
    lmpo added counts at its default and not as a change; a stored config that no longer reads as one is
    compared as stored (the message then names what differs).

    Raises :class:`InputError` naming every changed key outside ``allowed`` (``"loop.steps"``,
    ``"logging.*"``) unless ``allow_change``.
    """
    if schema is not None:
        try:
            stored = to_dict(from_dict(schema, stored))
        except (ConfigError, TypeError, ValueError):
            pass
    allowed = tuple(allowed)
    changes = changed_keys(stored, new)
    blocked = [c for c in changes if not _allowed(c[0], allowed)]
    if blocked and not allow_change:
        listed = "; ".join(f"`{k}` {a!r} -> {b!r}" for k, a, b in blocked)
        free = ", ".join(a.replace(".*", ".…") for a in allowed)
        raise InputError(f"--resume: the config differs from the run's stored config ({stored_path}) in {listed}. "
                         f"A resumed run continues the same experiment; only {free} may change. Undo the change, "
                         "start a new run directory, or add --allow-config-change to continue with it anyway.")
    return changes


class StopRequest:
    """Set by the first Ctrl-C inside :func:`stop_on_sigint`; the loop checks it between steps."""

    requested = False


@contextlib.contextmanager
def stop_on_sigint(log: Callable[[str], None]) -> Iterator[StopRequest]:
    """A first Ctrl-C (SIGINT) asks the loop to stop at its next safe point (where it writes a checkpoint);
    a second one raises ``KeyboardInterrupt`` at once. Outside the main thread nothing is installed."""
    stop = StopRequest()
    if threading.current_thread() is not threading.main_thread():
        yield stop
        return

    def ask(signum, frame):
        if stop.requested:
            raise KeyboardInterrupt
        stop.requested = True
        log("interrupt: finishing this step, then writing a checkpoint (Ctrl-C again to stop at once)")

    previous = signal.signal(signal.SIGINT, ask)
    try:
        yield stop
    finally:
        signal.signal(signal.SIGINT, previous)


def read_json_object(path: str | os.PathLike, what: str, fix: str) -> dict:
    """A JSON object (mapping) from a run directory's file; a damaged file is one message naming it.

    ``what``: what the file should be (``"a JSON config"``); ``fix``: the sentence that says what to do.
    """
    path = Path(path)
    try:
        data = json.loads(path.read_bytes().decode("utf-8"))
    except (ValueError, RecursionError) as e:  # not UTF-8, not JSON, nested too deep
        raise InputError(f"{path} is not {what} ({type(e).__name__}: {e}); the run directory is damaged. {fix}") \
            from None
    if not isinstance(data, dict):
        raise InputError(f"{path} holds a JSON {type(data).__name__}, not {what}; the run directory is damaged. "
                         f"{fix}")
    return data


# ----------------------------------------------------------------------------------------------------
# Metrics files
# ----------------------------------------------------------------------------------------------------


def _report(msg: str) -> None:
    print(f"note: {msg}", file=sys.stderr, flush=True)


def read_jsonl_lines(path: str | os.PathLike, on_torn: Callable[[str], None] | None = _report
                     ) -> list[tuple[bytes, dict]]:
    """``(raw line, record)`` of every complete line of a JSONL metrics file.

    A last line without its newline (the writer was killed mid-line) is dropped and reported through
    ``on_torn``; a damaged line elsewhere raises :class:`InputError` naming the file and the line.
    """
    path = Path(path)
    try:
        data = path.read_bytes()
    except IsADirectoryError:
        raise InputError(f"{path} is a directory, not a metrics file.") from None
    lines = data.split(b"\n")
    tail = lines.pop()  # b"" when the file ends with a newline
    out = []
    for n, raw in enumerate(lines, 1):
        if not raw.strip():
            continue
        try:
            record = json.loads(raw.decode("utf-8"))
        except (ValueError, RecursionError) as e:
            raise InputError(f"{path}: line {n} is not a JSON record ({type(e).__name__}: {e}). The file is "
                             "damaged; restore it from a copy or delete that line.") from None
        if not isinstance(record, dict):
            raise InputError(f"{path}: line {n} is a JSON {type(record).__name__}, not a record (an object); the "
                             "file is not an lmpo metrics file.")
        out.append((raw + b"\n", record))
    if tail.strip() and on_torn is not None:
        on_torn(f"{path}: the last line is incomplete ({len(tail)} bytes without a newline: the run was stopped "
                "while writing it) and is ignored.")
    return out


def read_jsonl(path: str | os.PathLike, on_torn: Callable[[str], None] | None = _report) -> list[dict]:
    """The records of a JSONL metrics file (see :func:`read_jsonl_lines`)."""
    return [r for _, r in read_jsonl_lines(path, on_torn)]


def truncate_jsonl(path: str | os.PathLike, keep_rows: int, on_torn: Callable[[str], None] | None = _report) -> int:
    """Keep the first ``keep_rows`` complete records of ``path`` (bytes unchanged), atomically; returns how
    many it kept (fewer when the file had fewer)."""
    path = Path(path)
    if not path.exists():
        return 0
    lines = read_jsonl_lines(path, on_torn)
    kept = lines[:keep_rows]
    data = b"".join(raw for raw, _ in kept)
    if data != path.read_bytes():
        replace_file(path, data)
    return len(kept)


class JsonlAppender:
    """Append-only JSONL writer: one ``json.dumps`` line per record, flushed at once (a kill loses at most
    the line being written); :meth:`sync` also forces it to disk."""

    def __init__(self, path: str | os.PathLike, rows: int = 0):
        self.path = Path(path)
        self.rows = rows
        self._fh = open_append(self.path)

    def append(self, record: Mapping[str, Any]) -> None:
        self._fh.write(json.dumps(record) + "\n")
        self._fh.flush()
        self.rows += 1

    def sync(self) -> None:
        if not self._fh.closed:
            self._fh.flush()
            os.fsync(self._fh.fileno())

    def close(self) -> None:
        if not self._fh.closed:
            self.sync()
            self._fh.close()
