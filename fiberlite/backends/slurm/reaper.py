"""The parent-death watch of a process's Slurm jobs.

A running job exits by itself when its parent's connection drops; a job still queued
has no connection yet, and would wait in the queue for its turn. So the first job a
process submits also starts ``python -m fiberlite.backends.slurm.reaper PID RUN PARENT``
in a session of its own: when process PID ends, however it ends (SIGKILL included),
it cancels the jobs of run RUN that PARENT submitted and that are still queued or
running, then exits.
"""
from __future__ import annotations

import os
import select
import subprocess
import sys
import time

from ..base import PARENT_LABEL, RUN_LABEL

POLL = 1.0  # seconds between two looks at the parent where no pidfd can wait for it


def start(run_id: str, parent: str) -> subprocess.Popen | None:
    """Start the watch of this process (in a new session: it outlives this process)."""
    try:
        return subprocess.Popen([sys.executable, "-m", __name__, str(os.getpid()), run_id, parent],
                                stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                                stderr=subprocess.DEVNULL, start_new_session=True, close_fds=True)
    except OSError:
        return None


def wait_for_exit(pid: int) -> None:
    try:
        fd = os.pidfd_open(pid)
    except (AttributeError, OSError):
        fd = None
    if fd is not None:
        select.select([fd], [], [])
        os.close(fd)
        return
    while True:
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return
        except PermissionError:
            pass
        time.sleep(POLL)


def reap(run_id: str, parent: str) -> int:
    """Cancel the queued and running jobs of ``run_id`` submitted by ``parent``."""
    from . import commands
    rows = [r for r in commands.squeue() if r.labels.get(RUN_LABEL) == run_id
            and r.labels.get(PARENT_LABEL) == parent and not r.ended]
    commands.scancel([r.id for r in rows])
    return len(rows)


def main(argv: list[str]) -> None:
    pid, run_id, parent = int(argv[0]), argv[1], argv[2]
    wait_for_exit(pid)
    reap(run_id, parent)


if __name__ == "__main__":
    main(sys.argv[1:])
