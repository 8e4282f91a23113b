"""Following a process's Slurm jobs: one ``squeue`` call for all of them per tick
(never one per job), their new output copied to this process's stdout, the exit code
of each that ended, and the ones pending past the ``start_timeout`` setting cancelled
with the reason Slurm gave."""
from __future__ import annotations

import logging
import re
import signal
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

from ..base import JobState
from . import commands, files
from .commands import Row

log = logging.getLogger("fiberlite.slurm")

INTERVAL = 0.3  # seconds between two squeue calls while jobs are followed
MISSING_TICKS = 5  # squeue calls a job may be absent from before it counts as lost
START_FAILED = 1  # exit code of a job that never started
_CANCEL_NOTE = re.compile(rb"slurmstepd[^\n]*: \*\*\* JOB \d+ ON \S+ CANCELLED AT [^\n]*\*\*\*\n?")


@dataclass(eq=False)
class SlurmJob:
    """What the backend knows about one Slurm job (``Job.handle``)."""

    id: str
    name: str
    output: Path
    key_file: Path | None = None
    row: Row | None = None
    exitcode: int | None = None
    requested: int | None = None  # the signal terminate() asked for
    echoed: int = 0  # bytes of its output copied to stdout
    taken: bool = False  # a reader of stream_logs copies its output instead
    missing: int = 0
    created: float = field(default_factory=time.monotonic)

    def state(self) -> JobState:
        if self.exitcode is not None:
            return JobState.EXITED
        if self.row is None or self.row.waiting:
            return JobState.PENDING
        return JobState.RUNNING


def ended_code(job: SlurmJob, row: Row) -> int:
    """The exit code of an ended job: its own status, the signal that killed it, ``-N``
    for a job this process cancelled with signal N."""
    if job.requested is not None and row.state == "CANCELLED":
        return -job.requested
    return row.exitcode()


def end_message(job: SlurmJob, row: Row) -> str | None:
    """Why the job ended, when Slurm ended it (time limit, memory, node failure...)."""
    if job.requested is not None or row.state in ("COMPLETED", "FAILED", "CANCELLED"):
        return None
    reason = f", {row.reason}" if row.reason not in ("", "None") else ""
    return f"Slurm job {job.id} ({job.name}) ended {row.state}{reason}"


class Follower:
    """A thread that follows the jobs ``jobs()`` returns while any is unfinished; it
    sets their ``row`` and ``exitcode`` under ``cond`` and notifies it."""

    def __init__(self, cond: threading.Condition, jobs: Callable[[], list[SlurmJob]],
                 start_timeout: Callable[[], float]) -> None:
        self.cond = cond
        self.jobs = jobs
        self.start_timeout = start_timeout
        self.wake = threading.Event()
        self.closed = False
        self.failures = 0
        self.thread = threading.Thread(target=self._run, name="fiberlite-slurm-follow", daemon=True)
        self.thread.start()

    def _run(self) -> None:
        while not self.closed:
            live = [j for j in self.jobs() if j.exitcode is None]
            if live:
                try:
                    self.tick(live)
                    self.failures = 0
                except Exception as exc:  # a failing squeue must not stop the watch
                    self.failures += 1
                    (log.warning if self.failures == 5 else log.debug)(
                        "following Slurm jobs failed (%s); retrying", exc)
            self.wake.wait(INTERVAL if live else None)
            self.wake.clear()

    def tick(self, live: list[SlurmJob]) -> None:
        """One squeue call; the jobs that ended get their exit code, after what is said
        about them is logged (a caller woken by the code finds the message there)."""
        rows = {row.id: row for row in commands.squeue([j.id for j in live])}
        now = time.monotonic()
        late: list[SlurmJob] = []
        ended: list[tuple[SlurmJob, int, str | None]] = []
        for job in live:
            row = rows.get(job.id)
            if row is not None and not row.waiting:
                self.copy_output(job)
            with self.cond:
                if job.exitcode is not None:
                    continue
                if row is None:
                    job.missing += 1
                    if job.missing >= MISSING_TICKS:
                        code = -(job.requested or signal.SIGKILL)
                        ended.append((job, code, f"Slurm job {job.id} ({job.name}) is gone and its "
                                                 f"exit code was not seen; reporting {code}"))
                    continue
                job.missing = 0
                job.row = row
                if row.ended:
                    ended.append((job, ended_code(job, row), end_message(job, row)))
                elif row.waiting and job.requested is None and now - job.created >= self.start_timeout():
                    late.append(job)
        for _, _, message in ended:
            if message:
                log.warning("%s", message)
        with self.cond:
            for job, code, _ in ended:
                if job.exitcode is None:
                    job.exitcode = code
            self.cond.notify_all()
        for job in late:
            self.fail_start(job)

    def copy_output(self, job: SlurmJob) -> None:
        if job.taken:
            return
        data = files.read_from(job.output, job.echoed)
        if data:
            job.echoed += len(data)
            if job.requested is not None:  # Slurm's note that it cancelled the job, as asked
                data = _CANCEL_NOTE.sub(b"", data)
            files.echo(data)

    def fail_start(self, job: SlurmJob) -> None:
        """Cancel a job pending past ``start_timeout``; it ends with :data:`START_FAILED`."""
        reason = job.row.reason if job.row is not None else "unknown"
        message = (f"Slurm job {job.id} ({job.name}) did not start within {self.start_timeout():g} s "
                   f"(start_timeout setting): it was pending, reason {reason}")
        try:
            commands.scancel([job.id])
        except Exception as exc:
            message += f"; cancelling it failed: {exc}"
        with self.cond:
            job.requested = job.requested or signal.SIGTERM
        log.error("%s", message)
        with self.cond:
            if job.exitcode is None:
                job.exitcode = START_FAILED
                self.cond.notify_all()

    def close(self) -> None:
        self.closed = True
        self.wake.set()
