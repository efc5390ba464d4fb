"""Running a lab: plan its jobs, run the unfinished ones (in parallel processes, dependencies first), report.

``run_lab(cfg)`` is the whole of ``lmpo lab``. It is resumable: a finished job (its result file exists) is
skipped, a killed cell resumes from its newest checkpoint, and re-running a finished lab only rebuilds the
report from the stored results (the same numbers). A job directory whose ``job.json`` describes another
configuration than the one planned is refused, so that results of two configs never mix.

Each job runs as ``python -m lmpo.lab.worker JOB_DIR`` would (in a process forked from a server that imported
the training code once) with its console in ``JOB_DIR/log.txt``; on Linux a
worker dies with the lab process, and a worker holds an exclusive lock on ``JOB_DIR/.lock`` while it runs, so
a second lab started on the same directory waits for it instead of running it twice. With ``lab.launcher: ray``
the same worker command runs inside a Ray task per job (its kind's ``lab.resources``; a lost worker's task is
retried and resumes from the job's checkpoint). ``inline=True`` runs
every job in this process, one after another (tests, notebooks); the numbers are the same.
"""

from __future__ import annotations

import functools
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from lmpo.config import changed_keys
from lmpo.errors import RunError
from lmpo.lab.config import ConfigError, LabConfig, lab_config_to_dict
from lmpo.lab.grid import Job, plan_jobs, validate_lab_config
from lmpo.lab.jobs import JOB_FILE, RUN_SUBDIR, read_json, run_job, write_json_atomic
from lmpo.lab.progress import Progress

LOCK_FILE = ".lock"
LOG_FILE = "log.txt"


@dataclass
class LabResult:
    """What ``run_lab`` returns."""

    dir: Path
    ran: list[str]
    skipped: list[str]
    report: dict[str, Any]
    seconds: float


def _job_record(job: Job) -> dict[str, Any]:
    return {"kind": job.kind, "key": job.key, "spec": job.spec, "deps": list(job.deps), "labels": job.labels}


@functools.cache
def _train_defaults() -> dict[str, Any]:
    from lmpo.trainer.config import TrainConfig, config_to_dict

    return config_to_dict(TrainConfig())


def _default_at(dotted: str) -> Any:
    """The default trainer-config value at ``dotted`` (``rollout.async_start_timeout_s``), or ``_ABSENT``."""
    value: Any = _train_defaults()
    for part in dotted.split("."):
        if not isinstance(value, dict) or part not in value:
            return _ABSENT
        value = value[part]
    return value


_ABSENT = "<absent>"  # how lmpo.config.changed_keys marks a key one side lacks


def same_spec(old: Any, new: dict[str, Any]) -> bool:
    """Whether a stored job ``spec`` describes the job planned as ``new``.

    Equal specs are the same job. A spec written by an earlier lmpo lacks the trainer-config fields added
    since; such a field changes nothing while it sits at its default, which reproduces the earlier behaviour
    (a new field must default to it), so a ``train`` leaf the stored spec lacks and the plan holds at its
    default is no difference. Any other difference (a changed value, a field the stored spec has and the plan
    lacks, any key outside ``train``) is another configuration.
    """
    if not isinstance(old, dict) or set(old) != set(new):
        return False
    if any(old[key] != value for key, value in new.items() if key != "train"):
        return False
    if not (isinstance(old.get("train"), dict) and isinstance(new.get("train"), dict)):
        return old.get("train") == new.get("train")
    return all(was == _ABSENT and now == _default_at(key)
               for key, was, now in changed_keys(old["train"], new["train"]))


def _same_but_baselines(old: Any, new: dict[str, Any]) -> bool:
    """Whether two gradient-job specs differ at most in ``baselines`` (the labels the activity is measured
    against, which the verdict rule chooses)."""
    if not (isinstance(old, dict) and "baselines" in old and "baselines" in new):
        return False
    return same_spec({k: v for k, v in old.items() if k != "baselines"},
                     {k: v for k, v in new.items() if k != "baselines"})


def _prepare(job: Job) -> None:
    """Write the job's ``job.json``; refuse a directory that holds another configuration's job."""
    path = job.dir / JOB_FILE
    record = _job_record(job)
    if path.exists():
        old = read_json(path)
        if same_spec(old.get("spec"), record["spec"]):
            return  # the same job (possibly written by an lmpo without some trainer fields, at their defaults)
        if job.done() and _same_but_baselines(old.get("spec"), record["spec"]):
            # a finished gradient job planned under another verdict rule: its activity was measured against that
            # rule's baselines; the report judges what it measured (an activity it lacks: "not run")
            return
        if job.done():
            raise ConfigError(f"{job.dir} holds the finished result of a different configuration of {job.key}; "
                              "run the changed lab into a fresh `lab.dir` (or delete that directory to re-run "
                              "the job).")
        shutil.rmtree(job.dir / RUN_SUBDIR, ignore_errors=True)  # an unfinished run of the other config
    job.dir.mkdir(parents=True, exist_ok=True)
    write_json_atomic(path, record)


def _locked(job_dir: Path) -> bool:
    """Whether another process (a worker of an earlier lab still running) holds the job's lock."""
    try:
        import fcntl
    except ImportError:  # pragma: no cover - no advisory locks on this platform
        return False
    path = job_dir / LOCK_FILE
    if not path.exists():
        return False
    with open(path, "a") as fh:
        try:
            fcntl.flock(fh, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            return True
        fcntl.flock(fh, fcntl.LOCK_UN)
    return False


def _set_death_signal() -> None:  # pragma: no cover - runs in a child, before its job
    try:
        import ctypes

        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG
    except Exception:  # noqa: BLE001 - best effort: without it an orphaned worker finishes its job and exits
        pass


def _exit_with(pid: int) -> None:
    """SIGTERM this process when process ``pid`` ends (a thread waits on it): a forked worker's parent is the
    forkserver, which outlives the lab process while any worker runs, so a parent-death signal would not fire."""
    import os
    import select
    import threading

    try:
        fd = os.pidfd_open(pid)
    except (AttributeError, OSError):  # no pidfd (not Linux ≥ 5.3): poll the pid instead
        fd = None

    def wait() -> None:
        if fd is not None:
            select.select([fd], [], [])
        else:
            while True:
                try:
                    os.kill(pid, 0)
                except ProcessLookupError:
                    break
                time.sleep(1.0)
        os.kill(os.getpid(), signal.SIGTERM)

    threading.Thread(target=wait, name="lmpo-lab-exit-with-lab", daemon=True).start()


def _forked_worker(job_dir: str, log_path: str, env: dict[str, str], cwd: str, path: list[str], lab_pid: int) -> None:
    """The body of a local worker: ``python -m lmpo.lab.worker JOB_DIR`` in a process of ``multiprocessing``,
    ended with the lab process."""
    import os

    _exit_with(lab_pid)
    fd = os.open(log_path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    os.dup2(fd, 1)
    os.dup2(fd, 2)
    os.close(fd)
    sys.stdout = open(1, "w", buffering=1, encoding="utf-8", closefd=False)
    sys.stderr = open(2, "w", buffering=1, encoding="utf-8", closefd=False)
    os.environ.clear()
    os.environ.update(env)
    os.chdir(cwd)
    sys.path[:] = path
    from lmpo.lab.worker import main

    code = main([job_dir])
    sys.stdout.flush()
    sys.stderr.flush()
    sys.exit(code)


class _Process:
    """A local worker running one job, its console appended to the job's log. It is forked from a server process
    that imported the training code once (~0.1 s of CPU per job instead of the ~5–8 s a fresh interpreter spends
    importing torch and transformers; the job takes this process's environment, working directory and module path
    at its start); where the platform has no forkserver, it is a fresh interpreter."""

    def __init__(self, job: Job) -> None:
        import multiprocessing
        import os

        self.job = job
        self.log = open(job.dir / LOG_FILE, "a", encoding="utf-8")
        self.log.write(f"--- {time.strftime('%Y-%m-%d %H:%M:%S')} {job.key}\n")
        self.log.flush()
        method = "forkserver" if "forkserver" in multiprocessing.get_all_start_methods() else "spawn"
        ctx = multiprocessing.get_context(method)
        if method == "forkserver":
            ctx.set_forkserver_preload(["lmpo.lab.worker", "lmpo.lab.jobs"])  # what every job imports
        self.proc = ctx.Process(target=_forked_worker, name=f"lmpo-lab {job.key}",
                                args=(str(job.dir), str(job.dir / LOG_FILE), dict(os.environ), os.getcwd(),
                                      list(sys.path), os.getpid()))
        self.proc.start()

    def poll(self) -> int | None:
        return None if self.proc.is_alive() else self.proc.exitcode

    def stop(self) -> None:
        if self.proc.is_alive():
            self.proc.terminate()
            self.proc.join(10)
            if self.proc.is_alive():
                self.proc.kill()
        self.proc.join()
        self.log.close()


_BUSY = 75  # lmpo.lab.worker's exit status when another process holds the job


def _ray_worker_task(log_file: str = LOG_FILE, busy: int = _BUSY):
    """The body of one Ray task: ``python -m lmpo.lab.worker JOB_DIR`` on the node Ray chose, its console appended
    to the job's log. A retried task can start while the lost attempt's worker still releases the job's lock:
    it waits for the lock instead of failing.

    Built as a closure over plain values that imports what it uses inside: Ray then ships it by value, so that the
    Ray worker process runs it without importing lmpo (and torch) — only the job's own process does, once."""

    def run(job_dir: str, busy_wait_s: float = 120.0) -> int:
        import sys
        import time
        from pathlib import Path

        def die_with_parent() -> None:  # pragma: no cover - runs between fork and exec (as _set_death_signal)
            import ctypes
            import signal

            ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGTERM)

        deadline = time.monotonic() + busy_wait_s
        while True:
            with open(Path(job_dir) / log_file, "a", encoding="utf-8") as log:
                log.write(f"--- {time.strftime('%Y-%m-%d %H:%M:%S')} (ray task)\n")
                log.flush()
                code = subprocess.run([sys.executable, "-m", "lmpo.lab.worker", job_dir], stdout=log,
                                      stderr=subprocess.STDOUT,
                                      preexec_fn=die_with_parent if sys.platform.startswith("linux") else None
                                      ).returncode
            if code != busy or time.monotonic() > deadline:
                return code
            time.sleep(1.0)

    return run


class _RayLauncher:
    """Submits jobs as Ray tasks (``lab.launcher: ray``) with the resources of their kind, and a lost worker's task
    retried ``lab.max_retries`` times; results land in the job directories, as with local workers (a cluster of
    several nodes needs the lab directory on a file system they share)."""

    def __init__(self, cfg: LabConfig) -> None:
        import os

        import ray

        self.ray = ray
        self.started = not ray.is_initialized()
        if self.started:
            options: dict[str, Any] = {"include_dashboard": False, "log_to_driver": False}
            if cfg.lab.ray_address:
                # the cluster's workers import lmpo from where this process does (a source checkout on PYTHONPATH)
                env = {"PYTHONPATH": os.environ["PYTHONPATH"]} if os.environ.get("PYTHONPATH") else {}
                ray.init(address=cfg.lab.ray_address, runtime_env={"env_vars": env}, **options)
            else:  # a private instance on this machine (127.0.0.1 only), whose workers inherit this environment
                ray.init(address="local", num_cpus=os.cpu_count(), _node_ip_address="127.0.0.1", **options)
        self.task = ray.remote(_ray_worker_task())
        self.resources = cfg.lab.resources
        self.max_retries = cfg.lab.max_retries

    def start(self, job: Job) -> _RayJob:
        spec = self.resources.get(job.kind, {})
        ref = self.task.options(num_cpus=spec.get("cpus", 1), num_gpus=spec.get("gpus", 0),
                                max_retries=self.max_retries, retry_exceptions=False).remote(str(job.dir))
        return _RayJob(self.ray, ref)

    def close(self) -> None:
        if self.started:
            self.ray.shutdown()


class _RayJob:
    def __init__(self, ray, ref) -> None:
        self.ray, self.ref = ray, ref

    def poll(self) -> int | None:
        ready, _ = self.ray.wait([self.ref], timeout=0)
        if not ready:
            return None
        try:
            return int(self.ray.get(self.ref))
        except self.ray.exceptions.RayError:  # lost more often than lab.max_retries allows
            return 1

    def stop(self) -> None:
        ready, _ = self.ray.wait([self.ref], timeout=0)
        if not ready:
            self.ray.cancel(self.ref, force=True)


def _tail(path: Path, lines: int = 5) -> str:
    try:
        text = path.read_text(encoding="utf-8", errors="replace").strip().splitlines()
    except OSError:
        return ""
    return " | ".join(text[-lines:])


def run_lab(cfg: LabConfig, *, inline: bool = False, report_only: bool = False, poll_s: float = 0.5,
            stream=None, log: Callable[[str], None] | None = None) -> LabResult:
    """Run (or continue) the lab and write its report; see the module docstring.

    ``inline``: run the jobs in this process instead of worker processes (their console lines go to each job's
    ``log.txt`` and to ``log``). ``report_only``: run nothing, rebuild the report from the finished jobs (an
    unfinished job is an error). ``stream``: where the progress display writes (default stdout).
    """
    from lmpo.lab.report import write_report

    t0 = time.perf_counter()
    root = Path(cfg.lab.dir)
    if report_only and stored_only(root):
        report = rebuild_stored(root, cfg.report.rule)
        return LabResult(dir=root, ran=[], skipped=[], report=report, seconds=time.perf_counter() - t0)
    validate_lab_config(cfg)
    root.mkdir(parents=True, exist_ok=True)
    import yaml

    with open(root / "lab.yaml", "w", encoding="utf-8") as fh:
        yaml.safe_dump(lab_config_to_dict(cfg), fh, sort_keys=False)
    jobs = plan_jobs(cfg, root)
    by_key = {j.key: j for j in jobs}
    for job in jobs:
        _prepare(job)
    skipped = [j.key for j in jobs if j.done()]
    todo = [j for j in jobs if not j.done()]
    if report_only and todo:
        raise RunError(f"lab {root}: {len(todo)} job(s) are not finished (first: {todo[0].key}); run `lmpo lab` "
                       "without --report-only to finish them.")
    progress = Progress({j.key: j.kind for j in todo}, len(skipped), jobs=1 if inline else cfg.lab.jobs,
                        mode=cfg.lab.progress, stream=stream)
    if todo:
        progress.note(f"{root}: {len(jobs)} jobs, {len(skipped)} already finished, {len(todo)} to run"
                      + (" (inline)" if inline else f" ({cfg.lab.jobs} at a time)"))
    if inline:
        ran = _run_inline(todo, by_key, progress, log)
    elif cfg.lab.launcher == "ray" and todo:
        launcher = _RayLauncher(cfg)
        try:
            ran = _run_parallel(todo, by_key, cfg.lab.jobs, progress, poll_s, start=launcher.start)
        finally:
            launcher.close()
    else:
        ran = _run_parallel(todo, by_key, cfg.lab.jobs, progress, poll_s)
    progress.close()
    if progress.failed:
        first = by_key[progress.failed[0]]
        raise RunError(f"lab {root}: {len(progress.failed)} job(s) failed ({', '.join(progress.failed)}); see "
                       f"{first.dir / LOG_FILE}. Fix the cause and re-run the same command: finished jobs are kept.")
    report = write_report(cfg, root, jobs)
    return LabResult(dir=root, ran=ran, skipped=skipped, report=report, seconds=time.perf_counter() - t0)


def stored_only(root: Path) -> bool:
    """Whether ``root`` is a published lab: its ``lab.json`` without any job's results (no cells/, warmup/,
    gradients/). Its cells' configs are not checked again: the lmpo that ran them may have had other defaults."""
    return (root / "lab.json").is_file() and not any((root / d).exists() for d in ("cells", "warmup", "gradients"))


def rebuild_stored(root: Path, rule: str) -> dict[str, Any]:
    """A published lab without its job results (``lab.json`` only): the verdicts rebuilt from its stored studies
    under ``rule`` (``lmpo.lab.report.rejudge``), written back to ``lab.json`` and ``lab.md``."""
    from lmpo.lab.report import rejudge, render_markdown

    report = rejudge(read_json(root / "lab.json"), rule)
    write_json_atomic(root / "lab.json", report, indent=None)
    (root / "lab.md").write_text(render_markdown(report), encoding="utf-8")
    return report


def _ready(job: Job, by_key: dict[str, Job], failed: set[str]) -> str:
    """``ready``, ``wait`` (a dependency is unfinished) or ``blocked`` (a dependency failed)."""
    for dep in job.deps:
        if dep in failed:
            return "blocked"
        if not by_key[dep].done():
            return "wait"
    return "ready"


def _run_inline(todo: list[Job], by_key: dict[str, Job], progress: Progress,
                log: Callable[[str], None] | None) -> list[str]:
    ran: list[str] = []
    failed: set[str] = set()
    for job in todo:
        if _ready(job, by_key, failed) != "ready":
            failed.add(job.key)
            progress.fail(job.key, "a job it depends on failed")
            continue
        progress.start(job.key)
        with open(job.dir / LOG_FILE, "a", encoding="utf-8") as fh:
            fh.write(f"--- {time.strftime('%Y-%m-%d %H:%M:%S')} {job.key} (inline)\n")

            def to_file(msg: str, fh=fh) -> None:
                fh.write(msg + "\n")
                fh.flush()
                if log is not None:
                    log(msg)

            try:
                run_job(job.dir, log=to_file)
            except Exception as e:  # noqa: BLE001 - a failed job is reported and its dependents skipped
                fh.write(f"{type(e).__name__}: {e}\n")  # the failure's message, where the lab's error points
                failed.add(job.key)
                progress.fail(job.key, f"{type(e).__name__}: {e}")
                continue
        progress.finish(job.key)
        ran.append(job.key)
    return ran


def _run_parallel(todo: list[Job], by_key: dict[str, Job], jobs: int, progress: Progress, poll_s: float,
                  start: Callable[[Job], Any] = _Process) -> list[str]:
    """Keep ``jobs`` jobs running, dependencies first; ``start`` launches one (a local worker process, or a Ray
    task) and returns a handle with ``poll()`` (``None`` while it runs, else its exit status) and ``stop()``."""
    pending = list(todo)
    running: dict[str, Any] = {}
    failed: set[str] = set()
    ran: list[str] = []
    try:
        while pending or running:
            for key, proc in list(running.items()):
                code = proc.poll()
                if code is None:
                    continue
                proc.stop()
                del running[key]
                if code == 0 and by_key[key].done():
                    progress.finish(key)
                    ran.append(key)
                else:
                    failed.add(key)
                    progress.fail(key, f"exit status {code}: {_tail(by_key[key].dir / LOG_FILE)}")
            for job in list(pending):
                if len(running) >= jobs:
                    break
                state = _ready(job, by_key, failed)
                if state == "blocked":
                    pending.remove(job)
                    failed.add(job.key)
                    progress.fail(job.key, "a job it depends on failed")
                elif state == "ready":
                    if job.done():  # finished meanwhile by a worker of an earlier lab
                        pending.remove(job)
                        progress.finish(job.key)
                        continue
                    if _locked(job.dir):
                        continue  # an orphaned worker of a killed lab still runs it: wait for its result
                    pending.remove(job)
                    running[job.key] = start(job)
                    progress.start(job.key)
            if not running and pending and all(_ready(j, by_key, failed) == "wait" for j in pending):
                if not any(_locked(j.dir) for j in pending) and not any(
                        _locked(by_key[d].dir) for j in pending for d in j.deps):
                    raise RunError("lab scheduler: jobs wait on dependencies that nothing runs: "
                                   + ", ".join(j.key for j in pending))
            progress.tick()
            time.sleep(poll_s)
    except BaseException:
        for proc in running.values():
            proc.stop()
        raise
    return ran


__all__ = ["LabResult", "run_lab"]
