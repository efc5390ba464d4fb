"""``python -m lmpo.lab.worker JOB_DIR``: run one lab job in this process (the lab starts one per job).

The worker holds an exclusive lock on ``JOB_DIR/.lock`` while it runs (released when it exits, however it
exits), so that a lab restarted on the same directory never runs the job a second time at once. Exit status
0: the job finished and wrote its result file; 1: it failed (the traceback is in the log); 75: another
process holds the job.
"""

from __future__ import annotations

import sys
import traceback
from pathlib import Path


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if len(args) != 1:
        print("usage: python -m lmpo.lab.worker JOB_DIR", file=sys.stderr)
        return 2
    job_dir = Path(args[0])
    lock = open(job_dir / ".lock", "a")
    try:
        import fcntl

        try:
            fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            print(f"{job_dir}: another process runs this job", file=sys.stderr)
            return 75
    except ImportError:  # pragma: no cover - no advisory locks on this platform
        pass
    from lmpo.lab.jobs import run_job

    try:
        run_job(job_dir)
    except Exception:  # noqa: BLE001 - the lab reads the exit status and points at this log
        traceback.print_exc()
        return 1
    finally:
        lock.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
