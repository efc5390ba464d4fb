"""The sandboxed Python tool: each documented property has a test that fails if it stops holding."""

from __future__ import annotations

import socket
import threading
import time

import pytest

from lmpo.envs.tools import ToolCall, network_isolation, python_tool, run_python, run_tool_call


def test_runs_code_and_reports_errors():
    assert run_python("print(6*7)").as_text() == "42"
    failed = run_python("raise ValueError('bad input')")
    assert failed.returncode == 1 and "ValueError: bad input" in failed.stderr
    assert failed.as_text().endswith("[exit status 1]")


@pytest.fixture
def host_server():
    """A TCP server on the host's loopback that records whether anything connected to it."""
    server = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    server.bind(("127.0.0.1", 0))
    server.listen(1)
    server.settimeout(5)
    connected = threading.Event()

    def accept():
        try:
            conn, _ = server.accept()
            connected.set()
            conn.close()
        except OSError:
            pass

    thread = threading.Thread(target=accept, daemon=True)
    thread.start()
    yield server.getsockname()[1], connected
    server.close()
    thread.join(6)


def test_no_network(host_server):
    """The host's own loopback is unreachable: a sandbox sharing the host's network would connect."""
    port, connected = host_server
    # the same code outside the sandbox does connect: the test can tell the difference
    code = f"import socket\ns = socket.create_connection(('127.0.0.1', {port}), timeout=2)\nprint('connected')"
    result = run_python(code, timeout_s=10)
    assert "connected" not in result.stdout
    assert result.returncode != 0
    assert ("Network is unreachable" in result.stderr or "network access is disabled" in result.stderr
            or "Connection refused" in result.stderr), result.stderr
    assert not connected.wait(0.5)


def test_network_isolation_mode_is_known():
    assert network_isolation() in ("netns", "userns+netns", "socket-guard")


def test_memory_limit():
    result = run_python("x = b'x' * (512 << 20)\nprint('allocated', len(x))", memory_mb=128)
    assert "allocated" not in result.stdout
    assert "MemoryError" in result.stderr


def test_cpu_time_limit():
    start = time.monotonic()
    result = run_python("while True:\n    pass", cpu_time_s=1, timeout_s=30)
    assert result.limit == "cpu_time"
    assert time.monotonic() - start < 15  # killed by the CPU limit, far before the wall-clock one


def _alive(pid: int) -> bool:
    """Whether a process runs (a zombie waiting for its parent to reap it does not)."""
    try:
        with open(f"/proc/{pid}/stat") as fh:
            return fh.read().rsplit(")", 1)[1].split()[0] != "Z"
    except FileNotFoundError:
        return False


def test_wall_clock_limit():
    """Sleeping uses no CPU: only the wall-clock limit stops it; the child it started dies with it."""
    start = time.monotonic()
    code = "import subprocess, time\nchild = subprocess.Popen(['sleep', '60'])\nprint(child.pid, flush=True)\ntime.sleep(60)"
    result = run_python(code, timeout_s=1)
    assert result.limit == "wall_clock"
    assert time.monotonic() - start < 5
    assert result.as_text().endswith("[killed: wall clock limit]")
    child = int(result.stdout.split()[0])
    deadline = time.monotonic() + 3
    while _alive(child) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not _alive(child)


def test_output_capped():
    result = run_python("print('a' * 100000)", max_output_chars=50)
    assert result.stdout == "a" * 50 + "\n[output truncated: 99951 more characters]"  # 100,000 a's and a newline
    flood = run_python("import sys\nwhile True:\n    sys.stdout.write('x' * 65536)", timeout_s=10)
    assert flood.limit == "output_size" and flood.seconds < 5 and len(flood.stdout) <= 2000 + 50


def test_isolated_working_directory_and_environment(monkeypatch):
    monkeypatch.setenv("LMPO_SECRET", "hunter2")
    result = run_python("import os\nprint(os.environ.get('LMPO_SECRET'), os.listdir('.'))")
    assert result.stdout.strip() == "None ['main.py', 'stderr', 'stdout']"


def test_python_tool_through_the_boundary():
    tool = python_tool(timeout_s=1)
    assert run_tool_call([tool], ToolCall("python", {"code": "print(2**10)"})).output == "1024"
    slow = run_tool_call([tool], ToolCall("python", {"code": "import time; time.sleep(30)"}))
    assert slow.ok and slow.output == "[killed: wall clock limit]"
