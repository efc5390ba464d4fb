"""The sandboxed Python tool: code runs in a separate, short-lived, resource-limited process.

What :func:`run_python` guarantees (each property has a test in ``tests/envs/test_sandbox.py`` that fails if it
stops holding):

- **no network**: the process runs in a network namespace of its own (``unshare -n``, or ``unshare -rn`` as an
  unprivileged user) where only a loopback interface that is down exists, so it reaches neither other hosts
  nor the host's own ``127.0.0.1``. Where namespaces are unavailable (``network_isolation()`` says which
  mode is in use) the code instead starts with ``socket.socket`` replaced by a function that raises: that
  stops ordinary code but not code written to get round it (``ctypes``, ``_socket``), so treat that mode as
  a guard against accidents, not a security boundary;
- **CPU time**: ``RLIMIT_CPU`` (the kernel sends SIGXCPU, then SIGKILL);
- **memory**: ``RLIMIT_AS`` (an allocation beyond it fails with ``MemoryError``);
- **wall clock**: the process group is killed with SIGKILL at ``timeout_s`` (sleeping or blocked code too, and
  the processes it started, unless one left the group with ``setsid``);
- **output**: stdout and stderr go to files limited by ``RLIMIT_FSIZE``; the policy sees at most
  ``max_output_chars`` characters;
- **files**: it runs in a fresh temporary directory (deleted afterwards) with an empty environment, Python in
  isolated mode (``-I``: no user site, no ``PYTHON*`` variables, no script directory on ``sys.path``).

It is *not* a jail for hostile code: the filesystem is readable (and writable where the user running lmpo may
write), and the process runs as that user. Run training jobs that execute model-written code inside a
container or VM of their own.
"""

from __future__ import annotations

import functools
import os
import resource
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass

from lmpo.envs.tools.base import Tool, cap_output

#: prepended to the user's code when no network namespace is available (see the module docstring)
_SOCKET_GUARD = (
    "import socket as _s\n"
    "def _no_network(*a, **k):\n"
    "    raise PermissionError('network access is disabled in the lmpo sandbox')\n"
    "_s.socket = _s.create_connection = _s.socketpair = _no_network\n"
    "del _s, _no_network\n"
)
_OUTPUT_FILE_BYTES = 1 << 20


@functools.lru_cache(maxsize=1)
def network_isolation() -> str:
    """How the sandbox cuts the network here: ``"netns"`` (``unshare -n``), ``"userns+netns"``
    (``unshare -rn``) or ``"socket-guard"`` (no namespaces available)."""
    unshare = shutil.which("unshare")
    if unshare:
        for flags, mode in ((["-n"], "netns"), (["-r", "-n"], "userns+netns")):
            try:
                done = subprocess.run([unshare, *flags, sys.executable, "-c", "pass"], capture_output=True,
                                      timeout=20)
            except (OSError, subprocess.SubprocessError):
                continue
            if done.returncode == 0:
                return mode
    return "socket-guard"


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


def _limits(cpu_time_s: int, memory_bytes: int):
    def apply() -> None:  # runs in the child between fork and exec
        resource.setrlimit(resource.RLIMIT_CPU, (cpu_time_s, cpu_time_s + 1))
        resource.setrlimit(resource.RLIMIT_AS, (memory_bytes, memory_bytes))
        resource.setrlimit(resource.RLIMIT_FSIZE, (_OUTPUT_FILE_BYTES, _OUTPUT_FILE_BYTES))
        resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
    return apply


def _read(path: str, max_chars: int) -> str:
    # whole files are small enough to read (RLIMIT_FSIZE stops them at _OUTPUT_FILE_BYTES), and the note then
    # says how much was dropped, as a tool's capped output does
    with open(path, encoding="utf-8", errors="replace") as fh:
        return cap_output(fh.read(), max_chars)[0]


def run_python(code: str, *, timeout_s: float = 5.0, cpu_time_s: int = 2, memory_mb: int = 256,
               max_output_chars: int = 2000) -> SandboxResult:
    """Run ``code`` with ``python -I`` under the limits of the module docstring; never raises for what the code
    does (its errors are in ``stderr``)."""
    if timeout_s <= 0 or cpu_time_s < 1 or memory_mb < 32 or max_output_chars < 1:
        raise ValueError("run_python needs timeout_s > 0, cpu_time_s >= 1, memory_mb >= 32, max_output_chars >= 1")
    mode = network_isolation()
    with tempfile.TemporaryDirectory(prefix="lmpo-sandbox-") as workdir:
        script = os.path.join(workdir, "main.py")
        with open(script, "w", encoding="utf-8") as fh:
            fh.write((_SOCKET_GUARD if mode == "socket-guard" else "") + code)
        command = [sys.executable, "-I", "-B", script]
        if mode == "netns":
            command = [shutil.which("unshare"), "-n", *command]
        elif mode == "userns+netns":
            command = [shutil.which("unshare"), "-r", "-n", *command]
        out_path, err_path = os.path.join(workdir, "stdout"), os.path.join(workdir, "stderr")
        start = time.monotonic()
        with open(out_path, "wb") as out, open(err_path, "wb") as err:
            proc = subprocess.Popen(command, stdin=subprocess.DEVNULL, stdout=out, stderr=err, cwd=workdir,
                                    env={"PATH": "/usr/bin:/bin", "HOME": workdir, "PYTHONIOENCODING": "utf-8"},
                                    preexec_fn=_limits(cpu_time_s, memory_mb << 20), start_new_session=True)
            limit = None
            try:
                proc.wait(timeout=timeout_s)
            except subprocess.TimeoutExpired:
                limit = "wall_clock"
            finally:
                try:  # the whole group: the processes the code started die with it
                    os.killpg(proc.pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
                proc.wait()
        seconds = time.monotonic() - start
        if limit is None and proc.returncode in (-signal.SIGXCPU, -signal.SIGKILL) and seconds < timeout_s:
            limit = "cpu_time"
        elif limit is None and max(os.path.getsize(out_path), os.path.getsize(err_path)) >= _OUTPUT_FILE_BYTES:
            limit = "output_size"  # Python ignores SIGXFSZ: the write past the limit fails with EFBIG instead
        return SandboxResult(stdout=_read(out_path, max_output_chars), stderr=_read(err_path, max_output_chars),
                             returncode=proc.returncode, limit=limit, seconds=seconds)


def python_tool(timeout_s: float = 5.0, cpu_time_s: int = 2, memory_mb: int = 256,
                max_output_chars: int = 1000) -> Tool:
    """The sandbox as a :class:`Tool` named ``python`` with one string argument ``code`` (what it prints is
    the observation). The tool's own timeout is the sandbox's wall-clock limit plus a margin for start-up."""

    def python(code: str) -> str:
        return run_python(code, timeout_s=timeout_s, cpu_time_s=cpu_time_s, memory_mb=memory_mb,
                          max_output_chars=max_output_chars).as_text()

    return Tool(
        name="python",
        description="Run a Python program in a sandbox (no network, limited time and memory) and return what "
                    "it prints.",
        parameters={"type": "object",
                    "properties": {"code": {"type": "string", "description": "the program; print the results"}},
                    "required": ["code"]},
        function=python, timeout_s=timeout_s + 10.0, max_output_chars=max_output_chars)
