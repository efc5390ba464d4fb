"""The sandboxed Python tool: model-written code runs in a jail, a separate short-lived process tree.

Modes (:func:`isolation` says which one is in force here and what each property rests on; ``require=`` refuses
to run in a weaker one):

- ``"jail"`` (as root, or as a user where the kernel allows user namespaces): the program runs as uid 65534
  outside (as the caller's own uid when lmpo is not root) in user, pid, mount, network, IPC and UTS namespaces
  of its own, with no capabilities, ``no_new_privs`` and a seccomp filter (``_jail.py`` builds it with ctypes;
  nothing is installed). It sees no process outside its tree, cannot signal or trace lmpo, cannot reach the
  host's network or path-bound Unix sockets, writes only to one size-capped tmpfs (its work directory ``/tmp``,
  also mounted at ``/dev/shm``, ``/run`` and ``/var/tmp``) on a read-only root, starts at most
  ``max_processes`` processes, and every process it started dies before the call returns (``setsid`` or not).
  It dies with the caller, and leaves nothing on the host: the program and its output travel in memory files.
- ``"network"``: only a network namespace (``unshare -n``, or ``unshare -rn`` as a user); the process is the
  caller's child, runs as the caller's user, sees the host's processes and filesystem.
- ``"none"``: ``socket.socket`` replaced by a function that raises: a guard against accidents, not a boundary.

In every mode: **CPU time** ``RLIMIT_CPU`` (SIGXCPU, then SIGKILL); **memory** ``RLIMIT_AS`` per process (an
allocation beyond it fails with ``MemoryError``); **wall clock** the tree is killed at ``timeout_s``;
**output** stdout and stderr go to memory files limited by ``RLIMIT_FSIZE`` and the policy sees at most
``max_output_chars`` characters; an empty environment and Python in isolated mode (``-I``). Each property has
a test in ``tests/envs/test_sandbox.py`` that fails if it stops holding.
"""

from __future__ import annotations

import functools
import marshal
import os
import resource
import select
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import warnings
from dataclasses import dataclass, field

from lmpo.envs.tools.base import Tool, cap_output
from lmpo.errors import InputError, RunError

#: prepended to the user's code in mode "none" (see the module docstring)
_SOCKET_GUARD = (
    "import socket as _s\n"
    "def _no_network(*a, **k):\n"
    "    raise PermissionError('network access is disabled in the lmpo sandbox')\n"
    "_s.socket = _s.create_connection = _s.socketpair = _no_network\n"
    "del _s, _no_network\n"
)
_OUTPUT_FILE_BYTES = 1 << 20
JAIL_SCRIPT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "_jail.py")
#: weakest first
MODES = ("none", "network", "jail")
_ENV = {"PATH": "/usr/bin:/bin", "PYTHONIOENCODING": "utf-8",
        # numerical libraries start a thread per core by default, and threads count against max_processes
        "OMP_NUM_THREADS": "1", "OPENBLAS_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}

_COMMON = {
    "cpu_time": "RLIMIT_CPU",
    "memory": "RLIMIT_AS per process",
    "output": "memory files capped by RLIMIT_FSIZE (1 MB); max_output_chars shown",
    "environment": "empty environment, python -I",
}
_JAIL_PROPERTIES = {
    "network": "a network namespace of its own (no interface up); setns and unshare refused",
    "processes": "a pid namespace of its own: no outside process visible or signallable; every descendant "
                 "dies when the call ends",
    "process_count": "RLIMIT_NPROC (max_processes) in a user namespace of its own",
    "privileges": "no capabilities, no_new_privs, seccomp (socket(AF_UNIX) refused)",
    "filesystem": "read-only root; one tmpfs of memory_mb writable at /tmp (work dir), /dev/shm, /run, /var/tmp",
    "dies_with_caller": "parent-death signal on the jail's supervisor and init",
    "wall_clock": "the whole tree (its pid namespace) killed at timeout_s",
    "memory": "RLIMIT_AS per process: the tree holds at most max_processes x memory_mb, plus the tmpfs",
}


@dataclass(frozen=True)
class Isolation:
    """How :func:`run_python` isolates code on this machine.

    ``mode`` is ``"jail"``, ``"network"`` or ``"none"``; ``properties`` maps each property in force to what it
    rests on; ``missing`` names the jail's properties not in force; ``reason`` says why a stronger mode failed.
    """

    mode: str
    properties: dict = field(default_factory=dict)
    missing: tuple = ()
    reason: str | None = None

    def __str__(self) -> str:
        text = f"{self.mode}: {', '.join(self.properties)}"
        return text + (f"; missing: {', '.join(self.missing)} ({self.reason})" if self.missing else "")


class SandboxError(RunError):
    """The sandbox cannot run code as asked (a mode weaker than required, or a jail that failed to start)."""


@functools.lru_cache(maxsize=1)
def isolation() -> Isolation:
    """The strongest mode that works here, found once per process by running a trivial program in it."""
    try:
        result = _run_jail("print('ok')", timeout_s=20, cpu_time_s=5, memory_mb=128, max_processes=8,
                           max_output_chars=100)
        reason = None if result.stdout == "ok\n" else f"the probe printed {result.as_text()!r}"
    except (OSError, SandboxError, subprocess.SubprocessError) as e:
        reason = str(e)
    if reason is None:
        user = "uid 65534" if os.geteuid() == 0 else "your uid"
        return Isolation("jail", {**_COMMON, **_JAIL_PROPERTIES,
                                  "privileges": f"{user}, " + _JAIL_PROPERTIES["privileges"]})
    reason = f"jail unavailable: {reason}"
    weaker = {"wall_clock": "process group killed (a setsid child escapes)", **_COMMON}
    missing = tuple(k for k in _JAIL_PROPERTIES if k not in ("network", "wall_clock", "memory"))
    unshare = _unshare_flags()
    if unshare:
        return Isolation("network", {"network": f"unshare {' '.join(unshare[1:])}", **weaker}, missing, reason)
    return Isolation("none", {"network": "socket.socket replaced (not a boundary)", **weaker},
                     ("network", *missing), reason + "; no network namespace either")


def network_isolation() -> str:
    """How the network is cut: ``"netns"`` (as root) or ``"userns+netns"`` (as a user) in the modes "jail"
    and "network", else ``"socket-guard"``. Kept for older callers; :func:`isolation` says more."""
    if isolation().mode == "none":
        return "socket-guard"
    return "netns" if os.geteuid() == 0 else "userns+netns"


@functools.lru_cache(maxsize=1)
def _unshare_flags() -> list[str] | None:
    unshare = shutil.which("unshare")
    if unshare:
        for flags in (["-n"], ["-r", "-n"]):
            try:
                done = subprocess.run([unshare, *flags, sys.executable, "-c", "pass"], capture_output=True,
                                      timeout=20)
            except (OSError, subprocess.SubprocessError):
                continue
            if done.returncode == 0:
                return [unshare, *flags]
    return None


_warned = []


def _warn_weaker(iso: Isolation) -> None:
    if _warned:
        return
    _warned.append(iso.mode)
    warnings.warn(f"lmpo sandbox: running model-written code in mode {iso.mode!r}, weaker than a jail "
                  f"({iso.reason}); set require='jail' to refuse, or run inside a container", RuntimeWarning,
                  stacklevel=4)


_default_require: list[str | None] = [None]


def set_default_require(require: str | None, *, key: str = "sandbox.require") -> str | None:
    """Make ``require`` the floor of every later call that passes none of its own (a training run's
    ``env.sandbox.require``), checked now; returns the previous floor."""
    check_require(require, key=key)
    previous, _default_require[0] = _default_require[0], require
    return previous


def check_require(require: str | None, *, key: str = "sandbox.require") -> Isolation:
    """The isolation in force, refused (:class:`SandboxError`) when weaker than ``require`` (or, when ``None``,
    the floor :func:`set_default_require` set); no floor accepts the strongest available, with a one-line warning
    when that is weaker than a jail. ``key`` names the setting in messages."""
    if require is None:
        require = _default_require[0]
    if require is not None and require not in MODES:
        raise InputError(f"`{key}` = {require!r} is not a sandbox mode; use one of "
                         f"{', '.join(MODES)} (jail is the strongest).")
    iso = isolation()
    if require is None:
        if iso.mode != "jail":
            _warn_weaker(iso)
    elif MODES.index(iso.mode) < MODES.index(require):
        raise SandboxError(
            f"`{key}` = {require!r} but this machine only gives the sandbox mode {iso.mode!r} "
            f"({iso.reason}). Run lmpo as root or where user namespaces are allowed "
            "(sysctl kernel.unprivileged_userns_clone=1, or an AppArmor profile that permits them), run the job "
            f"in a container of its own and set {key} to {iso.mode!r}, or lower {key}.")
    return iso


@dataclass(frozen=True)
class SandboxResult:
    """What a sandboxed run gave: its (capped) output, exit status and which limit, if any, stopped it."""

    stdout: str
    stderr: str
    returncode: int | None
    limit: str | None  # "wall_clock", "cpu_time", "output_size" or None
    seconds: float

    def as_text(self) -> str:
        """The observation the policy reads: stdout, then stderr, then how the run ended if not normally."""
        parts = [self.stdout.rstrip("\n")] if self.stdout else []
        if self.stderr:
            parts.append(self.stderr.rstrip("\n"))
        if self.limit is not None:
            parts.append(f"[killed: {self.limit.replace('_', ' ')} limit]")
        elif self.returncode:
            parts.append(f"[exit status {self.returncode}]")
        return "\n".join(parts) if parts else "[no output]"


def _memfile(name: str, data: bytes = b"") -> int:
    fd = os.memfd_create(f"lmpo-sandbox-{name}", os.MFD_CLOEXEC)
    os.write(fd, data)
    return fd


def _read(fd: int, max_chars: int) -> tuple[str, int]:
    # whole files are small enough to read (RLIMIT_FSIZE stops them at _OUTPUT_FILE_BYTES), and the note then
    # says how much was dropped, as a tool's capped output does
    size = os.fstat(fd).st_size
    return cap_output(os.pread(fd, size, 0).decode("utf-8", errors="replace"), max_chars)[0], size


def _result(fds: dict, returncode: int | None, limit: str | None, cpu_s: float | None, cpu_time_s: int,
            start: float, max_output_chars: int) -> SandboxResult:
    stdout, out_size = _read(fds["stdout"], max_output_chars)
    stderr, err_size = _read(fds["stderr"], max_output_chars)
    # a kill counts as the CPU limit only when the process spent it (os.killpg(own group, 9) does not)
    if limit is None and (returncode == -signal.SIGXCPU or (
            returncode == -signal.SIGKILL and cpu_s is not None and cpu_s >= cpu_time_s)):
        limit = "cpu_time"
    elif limit is None and max(out_size, err_size) >= _OUTPUT_FILE_BYTES:
        limit = "output_size"  # Python ignores SIGXFSZ: the write past the limit fails with EFBIG instead
    return SandboxResult(stdout=stdout, stderr=stderr, returncode=returncode, limit=limit,
                         seconds=time.monotonic() - start)


def jail_spec(fds: dict, *, timeout_s: float, cpu_time_s: int, memory_mb: int, max_processes: int,
              python: str = sys.executable) -> dict:
    """The SPEC argument of ``_jail.py`` (its docstring): ``python`` runs the program."""
    python_dirs = {sys.prefix, sys.base_prefix, sys.exec_prefix, sys.base_exec_prefix,
                   os.path.dirname(os.path.realpath(sys.executable))} if python == sys.executable else {
                   os.path.dirname(os.path.dirname(os.path.realpath(python)))}
    return {"python": python, "cpu_time_s": cpu_time_s, "memory_mb": memory_mb, "max_processes": max_processes,
            "output_bytes": _OUTPUT_FILE_BYTES, "timeout_s": timeout_s, "caller": os.getpid(), "fds": fds,
            "python_dirs": sorted(python_dirs), "env": {**_ENV, "HOME": "/tmp"}}


def _run_jail(code: str, *, timeout_s: float, cpu_time_s: int, memory_mb: int, max_processes: int,
              max_output_chars: int) -> SandboxResult:
    fds = {"code": _memfile("code", code.encode("utf-8", errors="surrogatepass")),
           "stdout": _memfile("stdout"), "stderr": _memfile("stderr")}
    try:
        spec = jail_spec(fds, timeout_s=timeout_s, cpu_time_s=cpu_time_s, memory_mb=memory_mb,
                         max_processes=max_processes)
        start = time.monotonic()
        with subprocess.Popen([sys.executable, "-I", "-S", "-B", JAIL_SCRIPT, marshal.dumps(spec).hex()], stdin=subprocess.DEVNULL,
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, pass_fds=tuple(fds.values()),
                              env={}, start_new_session=True) as proc:
            try:  # the jail enforces the wall clock itself; this backstop covers a jail that hangs
                out, err = proc.communicate(timeout=timeout_s + 30)
            except subprocess.TimeoutExpired:
                proc.kill()  # its init and, with it, the whole namespace die on the parent-death signal
                proc.communicate()
                raise SandboxError(f"the sandbox's jail did not end {timeout_s + 30:.0f} s after it "
                                   "started") from None
        try:  # written by the jail's supervisor before and after the program, never by the program
            status = marshal.loads(out)
        except (EOFError, ValueError, TypeError):
            raise SandboxError(f"the sandbox's jail failed (exit status {proc.returncode}): "
                               f"{err.decode(errors='replace').strip()[-500:]}") from None
        if "error" in status:
            raise SandboxError(f"the sandbox's jail failed to start: {status['error']}")
        returncode = status["exit"] if "exit" in status else -status["signal"] if "signal" in status else None
        return _result(fds, returncode, status["limit"], status.get("cpu_s"), cpu_time_s, start,
                       max_output_chars)
    finally:
        for fd in fds.values():
            os.close(fd)


def _limits(cpu_time_s: int, memory_bytes: int):
    def apply() -> None:  # runs in the child between fork and exec
        resource.setrlimit(resource.RLIMIT_CPU, (cpu_time_s, cpu_time_s + 1))
        resource.setrlimit(resource.RLIMIT_AS, (memory_bytes, memory_bytes))
        resource.setrlimit(resource.RLIMIT_FSIZE, (_OUTPUT_FILE_BYTES, _OUTPUT_FILE_BYTES))
        resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
    return apply


def _run_unjailed(code: str, mode: str, *, timeout_s: float, cpu_time_s: int, memory_mb: int,
                  max_output_chars: int) -> SandboxResult:
    """Modes "network" and "none": a child process group in a temporary directory."""
    fds = {"stdout": _memfile("stdout"), "stderr": _memfile("stderr")}
    try:
        with tempfile.TemporaryDirectory(prefix="lmpo-sandbox-", ignore_cleanup_errors=True) as workdir:
            script = os.path.join(workdir, "main.py")
            with open(script, "w", encoding="utf-8", errors="surrogatepass") as fh:
                fh.write((_SOCKET_GUARD if mode == "none" else "") + code)
            command = [sys.executable, "-I", "-B", script]
            if mode == "network":
                command = [*_unshare_flags(), *command]
            start = time.monotonic()
            proc = subprocess.Popen(command, stdin=subprocess.DEVNULL, stdout=fds["stdout"], stderr=fds["stderr"],
                                    cwd=workdir, env={**_ENV, "HOME": workdir},
                                    preexec_fn=_limits(cpu_time_s, memory_mb << 20), start_new_session=True)
            pidfd = os.pidfd_open(proc.pid)
            try:
                limit = None if select.select([pidfd], [], [], timeout_s)[0] else "wall_clock"
                try:  # the whole group: the processes the code started die with it
                    os.killpg(proc.pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
                _, status, usage = os.wait4(proc.pid, 0)  # wait4, not Popen.wait: the CPU time it used
                proc.returncode = os.waitstatus_to_exitcode(status)
            finally:
                os.close(pidfd)
            return _result(fds, proc.returncode, limit, usage.ru_utime + usage.ru_stime, cpu_time_s, start,
                           max_output_chars)
    finally:
        for fd in fds.values():
            os.close(fd)


def run_python(code: str, *, timeout_s: float = 5.0, cpu_time_s: int = 2, memory_mb: int = 256,
               max_output_chars: int = 2000, max_processes: int = 64, require: str | None = None) -> SandboxResult:
    """Run ``code`` with ``python -I`` under the limits of the module docstring, in the strongest mode available
    (at least ``require``: ``"jail"``, ``"network"`` or ``"none"``, else :class:`SandboxError`). Never raises
    for what the code does (its errors are in ``stderr``)."""
    if timeout_s <= 0 or cpu_time_s < 1 or memory_mb < 32 or max_output_chars < 1 or max_processes < 2:
        raise ValueError("run_python needs timeout_s > 0, cpu_time_s >= 1, memory_mb >= 32, max_output_chars >= 1, "
                         "max_processes >= 2")
    mode = check_require(require).mode
    if mode == "jail":
        return _run_jail(code, timeout_s=timeout_s, cpu_time_s=cpu_time_s, memory_mb=memory_mb,
                         max_processes=max_processes, max_output_chars=max_output_chars)
    return _run_unjailed(code, mode, timeout_s=timeout_s, cpu_time_s=cpu_time_s, memory_mb=memory_mb,
                         max_output_chars=max_output_chars)


def python_tool(timeout_s: float = 5.0, cpu_time_s: int = 2, memory_mb: int = 256,
                max_output_chars: int = 1000, max_processes: int = 64, require: str | None = None) -> Tool:
    """The sandbox as a :class:`Tool` named ``python`` with one string argument ``code`` (what it prints is
    the observation). The tool's own timeout is the sandbox's wall-clock limit plus a margin for start-up.
    ``require`` (the ``sandbox.require`` setting: ``jail``, ``network`` or ``none``) is checked here, when the
    tool is built, so that an environment refuses to start rather than its first call failing."""
    check_require(require)

    def python(code: str) -> str:
        return run_python(code, timeout_s=timeout_s, cpu_time_s=cpu_time_s, memory_mb=memory_mb,
                          max_output_chars=max_output_chars, max_processes=max_processes,
                          require=require).as_text()

    return Tool(
        name="python",
        description="Run a Python program in a sandbox (no network, limited time and memory) and return what "
                    "it prints.",
        parameters={"type": "object",
                    "properties": {"code": {"type": "string", "description": "the program; print the results"}},
                    "required": ["code"]},
        function=python, timeout_s=timeout_s + 10.0, max_output_chars=max_output_chars)
