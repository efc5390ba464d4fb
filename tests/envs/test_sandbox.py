"""The sandboxed Python tool: each documented property has a test that fails if it stops holding.

The jail's tests run where :func:`isolation` finds the jail (as root it must: ``test_jail_in_force_as_root``);
the reproductions are those of the probes that broke the earlier, network-namespace-only sandbox.
"""

from __future__ import annotations

import json
import marshal
import os
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
import uuid
import warnings

import pytest

from lmpo.envs.tools import (
    Isolation,
    SandboxError,
    ToolCall,
    isolation,
    network_isolation,
    python_tool,
    run_python,
    run_tool_call,
    sandbox,
)
from lmpo.errors import InputError

jail = pytest.mark.skipif(isolation().mode != "jail", reason=f"no jail here: {isolation().reason}")


def test_runs_code_and_reports_errors():
    assert run_python("print(6*7)").as_text() == "42"
    failed = run_python("raise ValueError('bad input')")
    assert failed.returncode == 1 and "ValueError: bad input" in failed.stderr
    assert failed.as_text().endswith("[exit status 1]")


@pytest.mark.skipif(os.geteuid() != 0 or sys.platform != "linux", reason="the jail is promised to root on Linux")
def test_jail_in_force_as_root():
    iso = isolation()
    assert iso.mode == "jail", iso.reason
    assert set(iso.properties) >= {"network", "processes", "process_count", "privileges", "filesystem",
                                   "dies_with_caller", "wall_clock", "cpu_time", "memory", "output", "environment"}
    assert iso.missing == () and network_isolation() == "netns"


@jail
def test_no_privileges():
    """Uid 0 inside is uid 65534 outside (the caller's uid as a user), no capabilities now or after execve,
    no_new_privs, a seccomp filter; mount and unshare fail."""
    code = ("import ctypes, os\n"
            "print(' '.join(open('/proc/self/uid_map').read().split()))\n"
            "status = dict(line.split(':', 1) for line in open('/proc/self/status'))\n"
            "print([int(status[k], 16) for k in ('CapEff', 'CapPrm', 'CapBnd', 'CapAmb')])\n"
            "print(status['NoNewPrivs'].strip(), status['Seccomp'].strip())\n"
            "libc = ctypes.CDLL(None, use_errno=True)\n"
            "print(libc.mount(b'none', b'/tmp', b'tmpfs', 0, None), libc.unshare(0x10000000 | 0x00020000))")
    lines = run_python(code).stdout.splitlines()
    outside = 65534 if os.geteuid() == 0 else os.geteuid()
    assert lines == [f"0 {outside} 1", "[0, 0, 0, 0]", "1 2", "-1 -1"], lines


@pytest.fixture
def host_server():
    """A TCP server on the host's loopback that records whether anything connected to it."""
    server = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    server.bind(("127.0.0.1", 0))
    server.listen(1)
    server.settimeout(0.05)
    connected, stop = threading.Event(), threading.Event()

    def accept():
        while not stop.is_set():
            try:
                conn, _ = server.accept()
            except OSError:
                continue
            connected.set()
            conn.close()

    thread = threading.Thread(target=accept, daemon=True)
    thread.start()
    yield server.getsockname()[1], connected
    stop.set()
    thread.join(5)
    server.close()


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


@jail
def test_setns_into_the_callers_network_refused(host_server):
    """The reproduction: enter the parent's network namespace, then connect to the host's loopback."""
    port, connected = host_server
    code = ("import ctypes, os, socket\n"
            "libc = ctypes.CDLL(None, use_errno=True)\n"
            "for pid in (os.getppid(), 1):\n"
            "    try:\n"
            "        print('setns', libc.setns(os.open(f'/proc/{pid}/ns/net', 0), 0), ctypes.get_errno())\n"
            "    except OSError as e:\n"
            "        print('open', e.errno)\n"
            f"socket.create_connection(('127.0.0.1', {port}), timeout=2).sendall(b'hi')\n"
            "print('connected')")
    result = run_python(code, timeout_s=10)
    assert "connected" not in result.stdout and "Network is unreachable" in result.stderr, result.as_text()
    assert "setns 0" not in result.stdout
    assert not connected.wait(0.5)


def _in_forked_caller(body, timeout: float = 60.0):
    """Run ``body()`` in a forked copy of this process (the caller); its JSON-able result, and how it ended."""
    read_end, write_end = os.pipe()
    pid = os.fork()
    if pid == 0:  # pragma: no cover - the child reports through the pipe
        try:
            os.close(read_end)
            os.write(write_end, json.dumps(body()).encode())
        finally:
            os._exit(0)
    os.close(write_end)
    with os.fdopen(read_end, "rb") as fh:
        data = fh.read()
    _, status = os.waitpid(pid, 0)
    return (json.loads(data) if data else None), os.waitstatus_to_exitcode(status)


@jail
def test_code_cannot_kill_signal_or_read_its_caller():
    """The reproductions: kill the parent; read the parent's environment and memory; the caller's own pid."""
    caller_env = open("/proc/self/environ", "rb").read().split(b"\0")[0].decode()  # an entry the caller started with
    code = (
        "import os\n"
        "ppid = os.getppid()\n"
        "def attempt(f):\n"
        "    try:\n"
        "        return f()\n"
        "    except OSError as e:\n"
        "        return e.errno\n"
        "def heap(pid):\n"
        "    line = [x for x in open(f'/proc/{pid}/maps') if '[heap]' in x][0]\n"
        "    with open(f'/proc/{pid}/mem', 'rb') as fh:\n"
        "        fh.seek(int(line.split('-')[0], 16))\n"
        "        return len(fh.read(4096))\n"
        "print(attempt(lambda: open(f'/proc/{ppid}/environ', 'rb').read().decode(errors='replace')))\n"
        "print(attempt(lambda: heap(ppid)))\n"
        f"print(attempt(lambda: os.kill({os.getpid()}, 0)))\n"
        "print(sorted(int(p) for p in os.listdir('/proc') if p.isdigit()))\n"
        "os.kill(ppid, 9)\n"
    )

    def call():
        result = run_python(code)
        return {"stdout": result.stdout, "returncode": result.returncode}

    seen, caller_exit = _in_forked_caller(call)
    assert caller_exit == 0 and seen is not None  # the caller lived to report
    environ, mem, signal_caller, pids, *_ = seen["stdout"].splitlines() + ["", "", "", ""]
    assert caller_env not in environ and environ in ("", "13"), environ
    assert mem in ("13", "1"), mem  # permission denied (errno 13 / EPERM)
    assert signal_caller == "3", signal_caller  # ESRCH: the caller's pid names no process in there
    assert pids == "[1, 2]", pids  # its init and itself


@jail
def test_process_count_limit():
    code = ("import os, time\nn = 0\ntry:\n    for _ in range(300):\n        if os.fork() == 0:\n"
            "            time.sleep(2)\n            os._exit(0)\n        n += 1\n"
            "except OSError as e:\n    print('refused', e.errno)\nprint(n)")
    result = run_python(code, max_processes=16, timeout_s=10)
    assert result.stdout.splitlines()[0] == "refused 11", result.as_text()  # EAGAIN
    assert int(result.stdout.splitlines()[1]) < 16


def _host_processes(argv: list[str]) -> list[int]:
    found = []
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as fh:
                if fh.read().split(b"\0")[:-1] == [a.encode() for a in argv]:
                    found.append(int(pid))
        except OSError:
            pass
    return found


@jail
@pytest.mark.parametrize("leave", ["start_new_session=True", "process_group=0", "preexec_fn=os.setsid"])
def test_no_process_survives_the_call(leave):
    """A child that left the session or the process group (setsid, setpgid(0, 0)) dies when the call returns."""
    argv = ["sleep", f"{30 + uuid.uuid4().int % 10**6 / 10**7:.7f}"]  # an argv no other process has
    result = run_python(f"import os, subprocess\nsubprocess.Popen({argv!r}, {leave})\nprint('started')")
    assert result.stdout == "started\n", result.as_text()
    survivors = _host_processes(argv)
    for pid in survivors:
        os.kill(pid, signal.SIGKILL)
    assert survivors == []  # no wait: the call returns only once every process of its namespace is gone


def test_wall_clock_limit():
    """Sleeping uses no CPU: only the wall-clock limit stops it; the child it started dies with it."""
    argv = ["sleep", f"{60 + uuid.uuid4().int % 10**6 / 10**7:.7f}"]
    start = time.monotonic()
    result = run_python(f"import subprocess, time\nsubprocess.Popen({argv!r})\ntime.sleep(60)", timeout_s=1)
    assert result.limit == "wall_clock"
    assert time.monotonic() - start < 5
    assert result.as_text().endswith("[killed: wall clock limit]")
    deadline = time.monotonic() + 3
    while _host_processes(argv) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert _host_processes(argv) == []


@jail
def test_writes_stay_inside_the_jail(tmp_path):
    """A read-only root: writes outside the tmpfs fail, and what the code writes in the tmpfs (its work
    directory, /tmp, /var/tmp, /dev/shm) never reaches the host."""
    name = f"lmpo-test-{uuid.uuid4().hex}"
    tmp_path.chmod(0o777)  # writable by anyone: only the jail's mounts stand in the way
    targets = [str(tmp_path / name), f"/var/tmp/{name}", f"/dev/shm/{name}", os.path.join(sys.prefix, name)]
    code = ("import os\n"
            f"print(bool(os.statvfs('/').f_flag & os.ST_RDONLY))\n"
            f"for path in {targets!r}:\n"
            "    try:\n"
            "        open(path, 'w').write('x')\n"
            "        print('wrote')\n"
            "    except OSError as e:\n"
            "        print(e.errno)\n")
    result = run_python(code)
    assert result.stdout.splitlines()[0] == "True", result.as_text()
    assert result.stdout.splitlines()[4] == "30"  # the interpreter's own directory: EROFS
    for path in targets:
        assert not os.path.exists(path), path


@jail
def test_dev_shm_is_gone_after_the_call():
    name = f"lmpo-test-{uuid.uuid4().hex}"
    # 100 files of 1 MB: RLIMIT_FSIZE caps each file the program writes at 1 MB
    fill = f"for i in range(100):\n    open(f'/dev/shm/{name}-{{i}}', 'wb').write(b'x' * (1 << 20))\n"
    result = run_python(fill + "print('wrote')", memory_mb=256)
    assert result.stdout == "wrote\n", result.as_text()
    assert [f for f in os.listdir("/dev/shm") if f.startswith(name)] == []
    full = run_python(fill, memory_mb=64)
    assert "No space left on device" in full.stderr  # the tmpfs holds at most memory_mb


@jail
def test_unix_sockets_by_path_unreachable(tmp_path):
    path = str(tmp_path / "s")
    server = socket.socket(socket.AF_UNIX)
    server.bind(path)
    os.chmod(path, 0o777)
    tmp_path.chmod(0o755)
    server.listen(1)
    server.setblocking(False)
    code = ("import socket\n"
            "try:\n    socket.socket(socket.AF_UNIX)\nexcept OSError as e:\n    print(e.errno)\n"
            f"s = socket.socket(socket.AF_UNIX)\ns.connect({path!r})\nprint('connected')")
    result = run_python(code)
    with pytest.raises(BlockingIOError):
        server.accept()
    server.close()
    assert result.stdout.splitlines() == ["13"], result.as_text()  # socket(AF_UNIX): EACCES, by seccomp


def test_killpg_of_its_own_group_is_not_the_cpu_limit():
    result = run_python("import os, signal\nos.killpg(os.getpgrp(), signal.SIGKILL)")
    assert result.returncode == -signal.SIGKILL and result.limit is None


def test_deleting_its_work_dir_does_not_raise():
    result = run_python("import os, shutil\nshutil.rmtree(os.getcwd(), ignore_errors=True)\nprint('done')")
    assert result.stdout == "done\n"


@jail
def test_a_leftover_process_cannot_forge_a_later_calls_output():
    """A process left by one call writes into the output of the next one wherever it can find it: the
    earlier sandbox's output files, or the stdout of the program that holds this test's marker (and no other
    process: a regression must not write into unrelated processes)."""
    mark = f"lmpo-mark-{uuid.uuid4().hex}"
    forger = ("import glob, os, time\n"
              "if os.fork() == 0:\n"
              "    os.setsid()\n"
              "    end = time.time() + 3\n"
              "    while time.time() < end:\n"
              "        targets = glob.glob('/tmp/lmpo-sandbox-*/stdout')\n"
              "        for pid in filter(str.isdigit, os.listdir('/proc')):\n"
              "            try:\n"
              f"                if {mark!r} in open(f'/proc/{{pid}}/cwd/main.py').read():\n"
              "                    targets.append(f'/proc/{pid}/fd/1')\n"
              "            except OSError:\n"
              "                pass\n"
              "        for path in targets:\n"
              "            try:\n"
              "                open(path, 'a').write('a forged line of output\\n')\n"
              "            except OSError:\n"
              "                pass\n"
              "        time.sleep(0.05)\n"
              "    os._exit(0)\n"
              "time.sleep(0.2)\nprint('first')")
    assert "first" in run_python(forger).stdout
    second = run_python(f"import time\n{mark!r}\ntime.sleep(0.5)\nprint('second')")
    assert second.stdout == "second\n"


@jail
def test_nothing_left_when_the_caller_is_killed(tmp_path):
    """The caller dies mid-call (SIGKILL): the jail dies with it and leaves no directory or process."""
    tmpdir = tmp_path / "tmpdir"
    tmpdir.mkdir()
    mark = f"lmpo-mark-{uuid.uuid4().hex}"
    read_end, write_end = os.pipe()
    pid = os.fork()
    if pid == 0:  # pragma: no cover - killed below
        os.close(read_end)
        import tempfile

        tempfile.tempdir = str(tmpdir)
        os.write(write_end, b"x")
        run_python(f"import time\nopen('/dev/shm/{mark}', 'w').write('x')\ntime.sleep(30)", timeout_s=30)
        os._exit(0)
    os.close(write_end)
    os.read(read_end, 1)
    os.close(read_end)

    def running() -> list[int]:
        found = []
        for p in filter(str.isdigit, os.listdir("/proc")):
            try:
                if mark in open(f"/proc/{p}/cwd/main.py").read():
                    found.append(int(p))
            except OSError:
                pass
        return found

    deadline = time.monotonic() + 20
    while not running() and time.monotonic() < deadline:
        time.sleep(0.05)
    assert running(), "the sandboxed program never started"
    os.kill(pid, signal.SIGKILL)
    os.waitpid(pid, 0)
    deadline = time.monotonic() + 5
    while running() and time.monotonic() < deadline:
        time.sleep(0.05)
    left = running()
    for p in left:
        os.kill(p, signal.SIGKILL)
    assert left == []
    assert list(tmpdir.iterdir()) == [] and not os.path.exists(f"/dev/shm/{mark}")


@jail
@pytest.mark.skipif(os.geteuid() != 0 or not shutil.which("setpriv"), reason="needs root and setpriv")
def test_jail_as_an_unprivileged_user():
    """The jail's user-namespace path: started as uid 65534 (setpriv), with a system Python that uid can run."""
    python = "/usr/bin/python3"
    if not os.path.exists(python) or not all(os.stat(d).st_mode & 0o001 for d in _ancestors(sandbox.JAIL_SCRIPT)):
        pytest.skip("uid 65534 cannot reach the jail script or a system Python here")
    code = ("import os\n"
            "print(open('/proc/self/uid_map').read().split())\n"
            "print(open('/proc/self/status').read().split('CapEff:')[1].split()[0])\n"
            "print(sorted(int(p) for p in os.listdir('/proc') if p.isdigit()))\n"
            "try:\n    open('/etc/lmpo-x', 'w')\nexcept OSError as e:\n    print(e.errno)\n")
    fds = {"code": sandbox._memfile("code", code.encode()), "stdout": sandbox._memfile("stdout"),
           "stderr": sandbox._memfile("stderr")}
    spec = sandbox.jail_spec(fds, timeout_s=10, cpu_time_s=2, memory_mb=128, max_processes=8, python=python)
    done = subprocess.run(["setpriv", "--reuid", "65534", "--regid", "65534", "--clear-groups", python, "-I", "-S",
                           "-B", sandbox.JAIL_SCRIPT, marshal.dumps(spec).hex()], capture_output=True,
                          pass_fds=tuple(fds.values()), env={}, timeout=60)
    stdout = os.pread(fds["stdout"], 1 << 16, 0).decode()
    for fd in fds.values():
        os.close(fd)
    status = marshal.loads(done.stdout)
    if "unshare(CLONE_NEWUSER)" in status.get("error", ""):
        pytest.skip(f"user namespaces are not allowed to users here: {status['error']}")
    assert status.get("exit") == 0, (status, stdout)
    uid_map, caps, pids, write = stdout.splitlines()
    assert uid_map == "['0', '0', '1']"  # uid 0 inside is the caller's uid (65534) one level up
    assert int(caps, 16) == 0 and pids == "[1, 2]" and write == "30"


def _ancestors(path: str) -> list[str]:
    parts = os.path.abspath(path).split("/")[1:-1]
    return ["/" + "/".join(parts[:i]) for i in range(len(parts) + 1)]


def test_memory_limit():
    result = run_python("x = b'x' * (512 << 20)\nprint('allocated', len(x))", memory_mb=128)
    assert "allocated" not in result.stdout
    assert "MemoryError" in result.stderr


def test_cpu_time_limit():
    start = time.monotonic()
    result = run_python("while True:\n    pass", cpu_time_s=1, timeout_s=30)
    assert result.limit == "cpu_time"
    assert time.monotonic() - start < 15  # killed by the CPU limit, far before the wall-clock one


def test_output_capped():
    result = run_python("print('a' * 100000)", max_output_chars=50)
    assert result.stdout == "a" * 50 + "\n[output truncated: 99951 more characters]"  # 100,000 a's and a newline
    flood = run_python("import sys\nwhile True:\n    sys.stdout.write('x' * 65536)", timeout_s=10)
    assert flood.limit == "output_size" and flood.seconds < 5 and len(flood.stdout) <= 2000 + 50


def test_isolated_working_directory_and_environment(monkeypatch):
    monkeypatch.setenv("LMPO_SECRET", "hunter2")
    result = run_python("import os\nprint(os.environ.get('LMPO_SECRET'), sorted(os.listdir('.')))")
    # the output goes to memory files; an interpreter installed under /tmp (a checkout there) is bound back at its
    # own path, read-only, so its top directory is there too
    dirs = sandbox.jail_spec({}, timeout_s=1, cpu_time_s=1, memory_mb=1, max_processes=1)["python_dirs"]
    python_tops = sorted({d.split("/")[2] for d in dirs if d.startswith("/tmp/")} if isolation().mode == "jail"
                         else set())
    assert result.stdout.strip() == f"None {sorted(['main.py', *python_tops])}"


def test_require_refuses_a_weaker_mode(monkeypatch):
    weaker = Isolation("network", {"network": "unshare -n"}, ("processes",), "jail unavailable: a test")
    monkeypatch.setattr(sandbox, "isolation", lambda: weaker)
    monkeypatch.setattr(sandbox, "_warned", [])
    with pytest.raises(SandboxError, match=r"`sandbox.require` = 'jail' .* 'network' \(jail unavailable: a test\)"):
        run_python("print(1)", require="jail")
    with pytest.raises(SandboxError, match="`sandbox.require` = 'jail'"):
        python_tool(require="jail")
    with pytest.raises(InputError, match="not a sandbox mode"):
        sandbox.check_require("strict")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        assert sandbox.check_require(None) is weaker and sandbox.check_require("network") is weaker
        sandbox.check_require(None)
    assert [str(w.message).count("\n") for w in caught] == [0]  # one line, once
    assert "weaker than a jail" in str(caught[0].message)


def test_the_runs_env_sandbox_require_floors_every_later_call(monkeypatch):
    """`env.sandbox.require` in a training config: checked when the config is, then the floor of every call that
    passes no `require=` of its own."""
    from lmpo.trainer.config import ConfigError, config_from_dict, validate_config

    weaker = Isolation("network", {"network": "unshare -n"}, ("processes",), "jail unavailable: a test")
    monkeypatch.setattr(sandbox, "isolation", lambda: weaker)
    monkeypatch.setattr(sandbox, "_default_require", [None])
    cfg = config_from_dict({"model": {"name": "tiny"}, "env": {"id": "ToolArithmetic-v0",
                                                                "sandbox": {"require": "jail"}}})
    with pytest.raises(SandboxError, match=r"`env.sandbox.require` = 'jail' .* 'network'"):
        validate_config(cfg)
    sandbox.set_default_require("network")
    with pytest.raises(SandboxError, match="`sandbox.require` = 'jail'"):
        run_python("print(1)", require="jail")  # a call's own require still wins
    assert sandbox.check_require(None) is weaker  # the floor holds: no warning, no refusal
    with pytest.raises(SandboxError):  # a floor this machine cannot give is refused when it is set
        sandbox.set_default_require("jail")
    assert sandbox._default_require == ["network"]
    monkeypatch.setattr(sandbox, "_default_require", ["jail"])  # set where a jail was available
    with pytest.raises(SandboxError):
        python_tool()
    with pytest.raises(ConfigError, match="env.sandbox"):
        validate_config(config_from_dict({"model": {"name": "tiny"}, "env": {"sandbox": {"require": "jail"}}}))


def test_jail_failure_falls_back_and_says_why(monkeypatch):
    def broken(*args, **kwargs):
        raise SandboxError("the sandbox's jail failed to start: PermissionError: a test")

    monkeypatch.setattr(sandbox, "_run_jail", broken)
    sandbox.isolation.cache_clear()
    try:
        iso = sandbox.isolation()
        assert iso.mode in ("network", "none") and "PermissionError: a test" in iso.reason
        assert "processes" in iso.missing and "filesystem" in iso.missing
    finally:
        sandbox.isolation.cache_clear()


def test_python_tool_through_the_boundary():
    tool = python_tool(timeout_s=1)
    assert run_tool_call([tool], ToolCall("python", {"code": "print(2**10)"})).output == "1024"
    slow = run_tool_call([tool], ToolCall("python", {"code": "import time; time.sleep(30)"}))
    assert slow.ok and slow.output == "[killed: wall clock limit]"
