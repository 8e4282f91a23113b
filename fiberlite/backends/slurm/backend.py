"""The slurm backend: every job a Slurm batch job, through Slurm's commands.

- A job is ``sbatch`` of a script that ``exec``s the job's command; ``python`` is this
  process's interpreter (the nodes share the filesystem it is on, as they share the
  user's home). Its name is the job's name, its ``--comment`` holds its labels (run,
  job, parent), both shown by ``squeue``.
- ``cpu``, ``memory`` and ``gpu`` become ``--cpus-per-task``, ``--mem`` and
  ``--gres=gpu:N`` (a pool's host job with no ``cpu`` asks for a CPU per worker); the ``slurm_partition``, ``slurm_account``, ``slurm_qos``,
  ``slurm_time`` and ``slurm_options`` settings add theirs (see :mod:`.commands`).
- The run's key is in a file readable by the user only, in the run's directory
  (``slurm_dir`` setting), which the job reads and removes; it is never in the
  job's environment, which Slurm keeps and shows.
- One thread (:mod:`.follow`) follows all of this process's jobs with one ``squeue``
  call per tick, copies their output files to this process's stdout, and fails a
  job still pending after ``start_timeout`` with Slurm's reason.
- A pool's workers fill a node: by default one job runs as many workers as the
  smallest node of the partition has CPUs (``workers_per_job`` or ``cpu`` say otherwise).
- ``terminate``/``kill`` are ``scancel --signal=TERM|KILL``; a job killed by signal N
  exits with ``-N``.
- No orphans: a running job exits when its parent's connection drops; the jobs still
  queued are cancelled by :mod:`.reaper` when this process dies, by :meth:`close`
  when it exits.
"""
from __future__ import annotations

import logging
import signal
import socket
import sys
import threading
import time
from pathlib import Path
from typing import Iterator

from ... import config
from ...errors import BackendError
from ..base import PARENT_LABEL, RUN_LABEL, SECRETS_FILE_ENV, Backend, Job, JobSpec, JobState
from . import commands, files, reaper
from .follow import Follower, SlurmJob

log = logging.getLogger("fiberlite.slurm")

FOLLOW_POLL = 0.25  # seconds between two reads of a followed output file


class SlurmBackend(Backend):
    """Jobs are Slurm batch jobs; see the module docstring."""

    name = "slurm"

    def __init__(self) -> None:
        self._cond = threading.Condition()
        self._jobs: dict[str, SlurmJob] = {}
        self._follower: Follower | None = None
        self._lock = threading.Lock()
        self._dirs: set[Path] = set()
        self._reapers: dict[tuple[str, str], object] = {}
        self._node_cpus: dict[str | None, int | None] = {}  # partition -> CPUs of its smallest node

    def shares_working_dir(self) -> bool:
        return True  # a cluster's nodes share the filesystem jobs run from (see the docs)

    def preflight(self) -> None:
        """Slurm's commands must be here: without them nothing can be submitted."""
        commands.tool("sbatch")

    def listen_host(self) -> str:
        """The ``listen_host`` setting, else the address this host's name resolves to
        (what the nodes of a cluster use to reach it), else loopback."""
        host = config.get("listen_host")
        if host:
            return host
        try:
            return socket.gethostbyname(socket.gethostname())
        except OSError:
            return "127.0.0.1"

    def workers_per_job(self, processes: int, cpu: float | None) -> int:
        """A job's ``cpu`` request, else as many workers as the smallest node of the
        partition has CPUs: a pool fills whole nodes, a job per node, not a job per worker."""
        if cpu:
            return max(1, int(cpu))
        partition = config.get("slurm_partition")
        if partition not in self._node_cpus:
            self._node_cpus[partition] = commands.node_cpus(partition)
        return self._node_cpus[partition] or 1

    def location(self, job: Job) -> str | None:
        """The node Slurm runs the job on, as squeue last said."""
        with self._cond:
            row = job.handle.row
        return (row.node or None) if row is not None else None

    # -- creating jobs -----------------------------------------------------------------------
    def create_job(self, spec: JobSpec) -> Job:
        self.check_options(spec)
        settings = config.settings()
        run_id = spec.labels.get(RUN_LABEL) or spec.env.get("FIBERLITE_RUN_ID") or "run"
        try:
            directory = files.run_dir(settings.get("slurm_dir"), run_id)
        except OSError as exc:
            raise BackendError(f"cannot make the directory for Slurm job {spec.name}'s files: {exc}; "
                               "set slurm_dir to a directory of yours that every node sees") from None
        self._dirs.add(directory)
        output = directory / f"{spec.name}.out"
        command = list(spec.command)
        if command and command[0] == "python":
            command[0] = sys.executable  # the nodes see this interpreter and its packages
        env = dict(spec.env)
        key_file = None
        if spec.secret_env:
            key_file = directory / f"{spec.name}.key"
            files.write_key_file(key_file, spec.secret_env)
            env[SECRETS_FILE_ENV] = str(key_file)
        files.remove(output)  # a job of the same name before: its output is not this job's
        try:
            job_id = commands.submit(spec, command, settings, str(output), env)
        except BaseException:
            files.remove(key_file)
            raise
        job = SlurmJob(job_id, spec.name, output, key_file)
        with self._cond:
            self._jobs[job_id] = job
        self._follow()
        self._watch_parent(run_id, spec.labels.get(PARENT_LABEL, ""))
        return Job(self, job_id, spec, pid=None, handle=job)

    def _follow(self) -> None:
        with self._lock:
            if self._follower is None or self._follower.closed:
                self._follower = Follower(self._cond, self._live, lambda: float(config.get("start_timeout")))
            self._follower.wake.set()

    def _watch_parent(self, run_id: str, parent: str) -> None:
        """Once per run and parent: the watch that cancels the jobs if this process dies."""
        with self._lock:
            if (run_id, parent) not in self._reapers:
                self._reapers[(run_id, parent)] = reaper.start(run_id, parent)

    def _live(self) -> list[SlurmJob]:
        with self._cond:
            return list(self._jobs.values())

    # -- following jobs ---------------------------------------------------------------------
    def status(self, job: Job) -> JobState:
        with self._cond:
            return job.handle.state()

    def wait(self, job: Job, timeout: float | None = None) -> int | None:
        sj: SlurmJob = job.handle
        with self._cond:
            self._cond.wait_for(lambda: sj.exitcode is not None, timeout)
            return sj.exitcode

    def terminate(self, job: Job, force: bool = False) -> None:
        sj: SlurmJob = job.handle
        sig = signal.SIGKILL if force else signal.SIGTERM
        with self._cond:
            if sj.exitcode is not None:
                return
            if sj.requested != signal.SIGKILL:
                sj.requested = sig
            queued = sj.state() is JobState.PENDING
        try:  # a signal reaches a running job's processes; a queued job is just cancelled
            commands.scancel([sj.id], None if queued else sig.name[3:])
        except BackendError:
            commands.scancel([sj.id])  # it was still queued, or is ending
        if self._follower is not None:
            self._follower.wake.set()

    def logs(self, job: Job) -> str:
        return files.tail(job.handle.output)

    def cleanup(self, job: Job) -> None:
        """Forget the ended job and remove its files (its output was copied to stdout)."""
        sj: SlurmJob = job.handle
        with self._cond:
            self._jobs.pop(sj.id, None)
        files.remove(sj.output if not sj.taken else None, sj.key_file)

    def close(self) -> None:
        """Cancel the jobs still queued or running (at exit, once the children are gone)."""
        with self._lock:
            follower, self._follower = self._follower, None
        if follower is not None:
            follower.close()
        with self._cond:
            left = [j for j in self._jobs.values() if j.exitcode is None]
            for job in left:
                job.requested = job.requested or signal.SIGKILL
        try:
            commands.scancel([j.id for j in left])
        except BackendError as exc:
            log.warning("%s", exc)
        for job in left:
            files.remove(job.key_file)
        for directory in self._dirs:
            files.remove_if_empty(directory)

    # -- for the command line ---------------------------------------------------------------
    def _rows(self, run_id: str | None) -> list[commands.Row]:
        rows = [r for r in commands.squeue() if RUN_LABEL in r.labels]
        return [r for r in rows if run_id is None or r.labels[RUN_LABEL] == run_id]

    def list_jobs(self, run_id: str | None = None) -> list[tuple[str, str, str]]:
        return [(r.name, r.labels[RUN_LABEL], r.describe()) for r in self._rows(run_id)]

    def cleanup_run(self, run_id: str | None = None) -> int:
        """Cancel the run's queued and running jobs (this user's: Slurm lets no one else)
        and remove the run's files."""
        rows = self._rows(run_id)
        live = [r for r in rows if not r.ended]
        commands.scancel([r.id for r in live])
        runs = {r.labels[RUN_LABEL] for r in rows} | ({run_id} if run_id else set())
        files.remove_run_dirs(config.get("slurm_dir"), sorted(runs))
        return len(live)

    def stream_logs(self, job_name: str, follow: bool = False) -> Iterator[str]:
        with self._cond:
            mine = [j for j in self._jobs.values() if job_name in (j.id, j.name)]
            if mine and follow:
                mine[0].taken = True  # the reader prints it from now on, not the follower
        if mine:
            return _read(mine[0].output, mine[0].echoed if follow else 0,
                         lambda: mine[0].exitcode is not None, follow)
        rows = [r for r in self._rows(None) if job_name in (r.id, r.name)]
        if not rows:
            raise LookupError(f"no Slurm job {job_name} of a fiberlite run in squeue")
        row = rows[-1]
        return _read(Path(row.stdout), 0, _ended_probe(row.id), follow)


def _ended_probe(job_id: str):
    """A function telling whether job ``job_id`` has ended, asking squeue at most once a second."""
    last = [0.0, False]

    def ended() -> bool:
        if not last[1] and time.monotonic() - last[0] >= 1.0:
            last[0] = time.monotonic()
            rows = commands.squeue([job_id])
            last[1] = not rows or rows[0].ended
        return bool(last[1])
    return ended


def _read(path: Path, offset: int, ended, follow: bool) -> Iterator[str]:
    """The text of ``path`` from ``offset``; with ``follow``, until ``ended()`` and drained."""
    import codecs
    decoder = codecs.getincrementaldecoder("utf-8")("replace")
    while True:
        done = not follow or ended()
        data = files.read_from(path, offset)
        offset += len(data)
        text = decoder.decode(data)
        if text:
            yield text
        if done:
            tail = decoder.decode(b"", final=True)
            if tail:
                yield tail
            return
        if not data:
            time.sleep(FOLLOW_POLL)  # tail -f: Slurm writes the file, nothing to wait on
