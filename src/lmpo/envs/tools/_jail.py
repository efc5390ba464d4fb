"""The jail of :func:`lmpo.envs.tools.sandbox.run_python`, run as ``python -I -S -B _jail.py SPEC``.

Standard library only (it runs without ``site``) and never imported by lmpo. Three processes:

- the *supervisor* (this script; the caller's child, in the caller's namespaces): dies with the caller
  (``PR_SET_PDEATHSIG``), enters new mount, pid, network, IPC and UTS namespaces (first a user namespace of its
  own when not run as root), forks the init and enforces the wall clock. It writes its status (``marshal``) to stdout.
- the *init* (pid 1 of the new pid namespace; dies with the supervisor): builds the filesystem view (read-only
  root, one size-capped tmpfs for ``/tmp`` = the work directory, ``/dev/shm``, ``/run`` and ``/var/tmp``, a
  ``/proc`` of the new pid namespace), writes the program, forks the child, reaps every process and exits when
  the child does; the kernel then kills whatever is left in the namespace before the supervisor's wait returns.
- the *child*: a user namespace of its own whose uid 0 is the unprivileged uid 65534 outside (the caller's own
  uid when the caller is not root), no capabilities, ``no_new_privs``, rlimits, a seccomp filter that refuses
  ``socket(AF_UNIX)`` and new namespaces, then ``execve`` of ``python -I -B main.py``.

SPEC (``marshal``, hex): python, cpu_time_s, memory_mb, max_processes, output_bytes, timeout_s, caller (pid), fds (code,
stdout, stderr), python_dirs (directories the interpreter needs), env.
"""

import _signal as signal  # the C module: ``signal`` imports enum, which the jail's start-up can do without
import ctypes
import io
import marshal
import os
import select
import struct
import sys

libc = ctypes.CDLL(None, use_errno=True)
libc.syscall.restype = ctypes.c_long

CLONE_NEWNS, CLONE_NEWUTS, CLONE_NEWIPC = 0x00020000, 0x04000000, 0x08000000
CLONE_NEWUSER, CLONE_NEWPID, CLONE_NEWNET = 0x10000000, 0x20000000, 0x40000000
MS_RDONLY, MS_NOSUID, MS_NODEV, MS_NOEXEC = 1, 2, 4, 8
MS_REMOUNT, MS_BIND, MS_REC, MS_PRIVATE = 32, 4096, 16384, 1 << 18
MOUNT_ATTR_RDONLY, MOUNT_ATTR_NOSUID = 1, 2
AT_FDCWD, AT_RECURSIVE = -100, 0x8000
PR_SET_PDEATHSIG, PR_SET_DUMPABLE, PR_SET_SECCOMP, PR_CAPBSET_DROP = 1, 4, 22, 24
PR_SET_NO_NEW_PRIVS, PR_CAP_AMBIENT, PR_CAP_AMBIENT_CLEAR_ALL = 38, 47, 4
SECCOMP_MODE_FILTER = 2
#: machine -> audit arch and the syscall numbers the jail uses or filters
ARCHES = {
    "x86_64": {"audit": 0xC000003E, "mount_setattr": 442, "socket": 41, "clone": 56, "unshare": 272,
               "setns": 308, "clone3": 435, "io_uring_setup": 425},
    "aarch64": {"audit": 0xC00000B7, "mount_setattr": 442, "socket": 198, "clone": 220, "unshare": 97,
                "setns": 268, "clone3": 435, "io_uring_setup": 425},
}
NAMESPACE_FLAGS = 0x02000000 | CLONE_NEWNS | CLONE_NEWUTS | CLONE_NEWIPC | CLONE_NEWUSER | CLONE_NEWPID | CLONE_NEWNET
WORK = "/tmp"


def check(ret: int, what: str) -> None:
    if ret < 0:
        err = ctypes.get_errno()
        raise OSError(err, f"{what}: {os.strerror(err)}")


def write(path: str, text: str) -> None:
    fd = os.open(path, os.O_WRONLY)
    try:
        os.write(fd, text.encode())
    finally:
        os.close(fd)


def report(fd: int, status: dict) -> None:
    os.write(fd, marshal.dumps(status))


def mount(source, target, fstype, flags, data=None) -> None:
    args = [None if a is None else a.encode() for a in (source, target, fstype)]
    check(libc.mount(*args, ctypes.c_ulong(flags), None if data is None else data.encode()), f"mount {target}")


def make_read_only(path: str, arch: dict) -> None:
    """Read-only and nosuid on ``path`` and every mount below it (``mount_setattr``, Linux 5.12)."""
    attr = struct.pack("QQQQ", MOUNT_ATTR_RDONLY | MOUNT_ATTR_NOSUID, 0, 0, 0)
    check(libc.syscall(ctypes.c_long(arch["mount_setattr"]), ctypes.c_long(AT_FDCWD), path.encode(),
                       ctypes.c_long(AT_RECURSIVE), attr, ctypes.c_long(len(attr))), f"mount_setattr {path}")


def closed_ancestor(path: str) -> str | None:
    """The first directory on ``path`` that others may not enter (the jailed uid is "others" everywhere)."""
    current = "/"
    for part in path.strip("/").split("/"):
        current = os.path.join(current, part)
        if not os.stat(current).st_mode & 0o001:
            return current
    return None


def build_filesystem(spec: dict, arch: dict, as_root: bool) -> None:
    mount(None, "/", None, MS_REC | MS_PRIVATE)  # nothing done here propagates to the caller's mounts
    # as root the child runs as uid 65534, which cannot enter e.g. /root where the interpreter may live: keep
    # handles on the interpreter's directories, hide the closed ancestor under a tmpfs and bind them back
    # the interpreter's directories under /tmp (a checkout there) are hidden by the work directory's tmpfs: they
    # are bound back the same way, each at its own path inside that tmpfs
    reopen = {}
    for d in spec["python_dirs"]:
        top = closed_ancestor(d) if as_root else None
        if top is None and (d + "/").startswith(WORK + "/"):
            top = d
        if top is not None:
            reopen.setdefault(top, []).append((d, os.open(d, os.O_PATH | os.O_DIRECTORY)))
    make_read_only("/", arch)
    size = f"size={spec['memory_mb']}m"
    mount("tmpfs", WORK, "tmpfs", MS_NOSUID | MS_NODEV, f"{size},mode=1777")
    for extra in ("/dev/shm", "/run", "/var/tmp"):  # one tmpfs, so one size cap, for every writable place
        if os.path.isdir(extra) and not os.path.islink(extra):
            mount(WORK, extra, None, MS_BIND)
    for top, dirs in reopen.items():
        os.makedirs(top, mode=0o755, exist_ok=True)  # (only missing when it was under the work directory)
        mount("tmpfs", top, "tmpfs", MS_NOSUID | MS_NODEV, "size=1m,mode=0755")
        for d, fd in dirs:
            target = os.path.join(top, os.path.relpath(d, top))
            os.makedirs(target, mode=0o755, exist_ok=True)
            mount(f"/proc/self/fd/{fd}", target, None, MS_BIND | MS_REC)
            os.close(fd)
        make_read_only(top, arch)
    mount("proc", "/proc", "proc", MS_NOSUID | MS_NODEV | MS_NOEXEC)  # this pid namespace's processes only


def seccomp_filter(arch: dict) -> bytes:
    """The BPF program: another architecture's calls (i386) kill; x32 calls, ``unshare``, ``setns`` and
    ``clone`` with a namespace flag fail with EPERM (user namespaces need no privilege: without this the code
    could make one and hold every capability in it); ``clone3`` and ``io_uring_setup`` (whose arguments a filter
    cannot read, or whose operations it never sees) fail with ENOSYS, so that libc falls back to ``clone``;
    ``socket(AF_UNIX, …)`` fails with EACCES: path-bound Unix sockets are reachable through a read-only mount."""
    ld, jeq, jge, jset, ret = 0x20, 0x15, 0x35, 0x45, 0x06
    allow, kill, errno = 0x7FFF0000, 0x80000000, 0x00050000
    eperm, eacces, enosys = errno | 1, errno | 13, errno | 38
    insns = [(ld, 0, 0, 4), (jeq, 1, 0, arch["audit"]), (ret, 0, 0, kill),
             (ld, 0, 0, 0), (jge, 0, 1, 0x40000000), (ret, 0, 0, eperm)]
    for name, action in (("unshare", eperm), ("setns", eperm), ("clone3", enosys), ("io_uring_setup", enosys)):
        insns += [(jeq, 0, 1, arch[name]), (ret, 0, 0, action)]
    for name, test, value, action in (("socket", jeq, 1, eacces), ("clone", jset, NAMESPACE_FLAGS, eperm)):
        # the call's first argument (offset 16 of seccomp_data; its low 32 bits) decides
        insns += [(jeq, 0, 4, arch[name]), (ld, 0, 0, 16), (test, 0, 1, value), (ret, 0, 0, action),
                  (ret, 0, 0, allow)]
    insns.append((ret, 0, 0, allow))
    return b"".join(struct.pack("HBBI", *i) for i in insns)


class SockFprog(ctypes.Structure):
    _fields_ = [("len", ctypes.c_ushort), ("filter", ctypes.c_void_p)]


def drop_privileges(arch: dict) -> None:
    """No capabilities now or after execve (empty bounding set), no_new_privs, the seccomp filter."""
    last_cap = int(open("/proc/sys/kernel/cap_last_cap").read())
    for cap in range(last_cap + 1):
        check(libc.prctl(PR_CAPBSET_DROP, cap, 0, 0, 0), "drop capability")
    check(libc.prctl(PR_CAP_AMBIENT, PR_CAP_AMBIENT_CLEAR_ALL, 0, 0, 0), "clear ambient capabilities")
    header = struct.pack("Ii", 0x20080522, 0)
    check(libc.capset(header, bytes(24)), "capset")
    check(libc.prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0), "no_new_privs")
    program = seccomp_filter(arch)
    buffer = ctypes.create_string_buffer(program)
    fprog = SockFprog(len(program) // 8, ctypes.addressof(buffer))
    check(libc.prctl(PR_SET_SECCOMP, SECCOMP_MODE_FILTER, ctypes.byref(fprog), 0, 0), "seccomp")


def child(spec: dict, arch: dict, as_root: bool, ready_w: int, go_r: int) -> None:
    """Set up the child; the caller reports any exception (status pipe)."""
    import resource

    # the init is not dumpable, which would leave this process's /proc files owned by the real root, out of the
    # init's reach when it writes the uid map as a user
    libc.prctl(PR_SET_DUMPABLE, 1, 0, 0, 0)
    if as_root:
        os.setgroups([])
    check(libc.unshare(CLONE_NEWUSER), "unshare(CLONE_NEWUSER)")
    os.write(ready_w, b"x")
    if os.read(go_r, 1) != b"x":
        os._exit(71)
    os.setresgid(0, 0, 0)
    os.setresuid(0, 0, 0)
    os.setsid()
    fds = spec["fds"]
    null = os.open("/dev/null", os.O_RDONLY)
    os.dup2(null, 0)
    os.dup2(fds["stdout"], 1)
    os.dup2(fds["stderr"], 2)
    os.chdir(WORK)
    cpu = spec["cpu_time_s"]
    resource.setrlimit(resource.RLIMIT_CPU, (cpu, cpu + 1))
    memory = spec["memory_mb"] << 20
    resource.setrlimit(resource.RLIMIT_AS, (memory, memory))
    resource.setrlimit(resource.RLIMIT_FSIZE, (spec["output_bytes"], spec["output_bytes"]))
    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
    resource.setrlimit(resource.RLIMIT_NPROC, (spec["max_processes"], spec["max_processes"]))
    drop_privileges(arch)
    os.closerange(3, 1 << 16)  # the status pipe included: nothing the program runs can write a status
    os.execve(spec["python"], [spec["python"], "-I", "-B", "main.py"], spec["env"])


def init(spec: dict, arch: dict, as_root: bool, status_w: int) -> None:
    libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
    libc.prctl(PR_SET_DUMPABLE, 0, 0, 0, 0)
    # pid 1 ignores signals it has no handler for: a handler makes the alarm (a backstop should the
    # supervisor's kill be lost) end it
    signal.signal(signal.SIGALRM, lambda *_: os._exit(124))
    signal.alarm(int(spec["timeout_s"]) + 5)
    os.setsid()
    build_filesystem(spec, arch, as_root)
    with open(os.path.join(WORK, "main.py"), "wb") as fh:
        fh.write(os.pread(spec["fds"]["code"], os.fstat(spec["fds"]["code"]).st_size, 0))
    ready_r, ready_w = os.pipe()
    go_r, go_w = os.pipe()
    pid = os.fork()
    if pid == 0:
        try:
            child(spec, arch, as_root, ready_w, go_r)
        except BaseException as e:  # noqa: BLE001 - reported through the status pipe of the init
            report(status_w, {"error": f"{type(e).__name__}: {e}"})
        os._exit(71)
    os.close(ready_w)
    os.close(go_r)
    if os.read(ready_r, 1) == b"x":
        # the child's uid 0 is uid 65534 outside as root, else the caller's uid (the init's uid 0)
        outer = "65534" if as_root else "0"
        write(f"/proc/{pid}/setgroups", "deny")
        write(f"/proc/{pid}/uid_map", f"0 {outer} 1")
        write(f"/proc/{pid}/gid_map", f"0 {outer} 1")
        os.write(go_w, b"x")
    while True:
        reaped, status, usage = os.wait4(-1, 0)
        if reaped == pid:
            break
    cpu = usage.ru_utime + usage.ru_stime
    result = ({"exit": os.WEXITSTATUS(status)} if os.WIFEXITED(status)
              else {"signal": os.WTERMSIG(status)})
    report(status_w, {**result, "cpu_s": cpu})


def main() -> None:
    spec = marshal.loads(bytes.fromhex(sys.argv[1]))
    libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
    if os.getppid() != spec["caller"]:
        return  # the caller died before the parent-death signal was set
    arch = ARCHES.get(os.uname().machine)
    if arch is None:
        raise OSError(f"no seccomp filter for the {os.uname().machine} architecture")
    as_root = os.geteuid() == 0
    if not as_root:
        uid, gid = os.geteuid(), os.getegid()
        check(libc.unshare(CLONE_NEWUSER), "unshare(CLONE_NEWUSER)")
        write("/proc/self/setgroups", "deny")
        write("/proc/self/uid_map", f"0 {uid} 1")
        write("/proc/self/gid_map", f"0 {gid} 1")
    check(libc.unshare(CLONE_NEWNS | CLONE_NEWPID | CLONE_NEWNET | CLONE_NEWIPC | CLONE_NEWUTS),
          "unshare(mount, pid, network, IPC, UTS)")
    status_r, status_w = os.pipe()
    pid = os.fork()
    if pid == 0:
        os.close(status_r)
        try:
            init(spec, arch, as_root, status_w)
        except BaseException as e:  # noqa: BLE001 - reported to the caller, which raises
            report(status_w, {"error": f"{type(e).__name__}: {e}"})
        os._exit(0)
    os.close(status_w)
    pidfd = os.pidfd_open(pid)
    limit = None
    if not select.select([pidfd], [], [], spec["timeout_s"])[0]:
        os.kill(pid, signal.SIGKILL)
        limit = "wall_clock"
    os.waitpid(pid, 0)  # returns once the kernel has killed and reaped every process of the namespace
    reports = []
    with os.fdopen(status_r, "rb") as fh:  # EOF: every process that held the pipe is gone
        stream = io.BytesIO(fh.read())
        while stream.tell() < len(stream.getbuffer()):
            reports.append(marshal.load(stream))
    status = {"limit": limit}
    for one in reversed(reports):  # a setup error (written first) wins
        status.update(one)
    sys.stdout.buffer.write(marshal.dumps(status))


if __name__ == "__main__":
    try:
        main()
    except OSError as e:
        sys.stdout.buffer.write(marshal.dumps({"error": str(e)}))
