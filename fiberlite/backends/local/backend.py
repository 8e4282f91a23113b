"""The local backend: every job a process of this machine."""
from __future__ import annotations

import math
import os
import select
import signal
import socket
import subprocess
import sys
from typing import Iterator, Sequence

import psutil

from ... import config
from ...errors import BackendError
from ..base import SECRETS_FD_ENV, Backend, Job, JobSpec, JobState, MasterRun, encode_secrets
from .output import OutputTail, copier
from .usage import UsageMeter


BOOTSTRAP_MODULE = "fiberlite.runtime.bootstrap"  # in the command line of every job
DRAIN = 0.5  # seconds an ended job's output may take to be copied (what it forked may hold it)


class JobProcess(subprocess.Popen):
    """A local job's process; ``tail`` is the end of its output when that is kept."""

    tail: OutputTail | None = None


def _is_job(process: psutil.Process) -> bool:
    """Whether ``process`` is a fiberlite job (started by another job)."""
    try:
        return BOOTSTRAP_MODULE in process.cmdline()
    except psutil.Error:
        return False


class LocalBackend(Backend):
    """Jobs are child OS processes; resources requests are not enforced."""

    name = "local"

    def __init__(self) -> None:
        self._usage = UsageMeter()

    def shares_working_dir(self) -> bool:
        return True  # the same machine, the same files

    def workers_per_job(self, processes: int, cpu: float | None) -> int:
        """The pool's workers shared among this machine's CPUs: one host job per CPU."""
        return math.ceil(processes / (os.cpu_count() or 1))

    def sample(self, job: Job, forked: Sequence[int] = ()) -> tuple[float, int] | None:
        """The job's process and the pool workers it forked, as the kernel counts them."""
        return self._usage.measure(job.id, [job.pid, *forked])

    def location(self, job: Job) -> str | None:
        return socket.gethostname()

    def create_job(self, spec: JobSpec) -> Job:
        """Start the process; its secret environment travels on a pipe, so that it is in
        neither its environment nor /proc/PID/environ. With the ``dashboard`` setting on,
        its output goes through this process (:mod:`.output`), which keeps its end."""
        self.check_options(spec)
        env = dict(os.environ)
        env.update(spec.env)
        try:
            pipes = _output_pipes(env) if config.get("dashboard") is not None else None
        except OSError as exc:
            raise BackendError(f"cannot start local job {spec.name}: no pipes for its output "
                               f"({exc}); raise the open files limit (ulimit -n)") from None
        command = list(spec.command)
        if command and command[0] == "python":
            command[0] = sys.executable  # the same interpreter as the parent
        secrets = _secrets_pipe(spec.secret_env) if spec.secret_env else None
        if secrets is not None:
            env[SECRETS_FD_ENV] = str(secrets)
        try:
            proc = JobProcess(command, env=env, cwd=spec.cwd or None,
                              stdin=subprocess.DEVNULL, close_fds=True,
                              stdout=pipes[0][1] if pipes else None,
                              stderr=pipes[1][1] if pipes else None,
                              pass_fds=() if secrets is None else (secrets,))
        except OSError as exc:
            for read_end, _ in pipes or ():
                os.close(read_end)
            raise BackendError(f"cannot start local job {spec.name}: {exc}") from None
        finally:
            if secrets is not None:
                os.close(secrets)
            for _, write_end in pipes or ():
                os.close(write_end)
        if pipes is not None:
            proc.tail = OutputTail()
            copier().follow(pipes[0][0], pipes[1][0], proc.tail)
        return Job(self, str(proc.pid), spec, pid=proc.pid, handle=proc)

    def status(self, job: Job) -> JobState:
        return JobState.RUNNING if job.handle.poll() is None else JobState.EXITED

    def wait(self, job: Job, timeout: float | None = None) -> int | None:
        try:
            return job.handle.wait(timeout)
        except subprocess.TimeoutExpired:
            return None

    def terminate(self, job: Job, force: bool = False) -> None:
        """Signal the job and every process it started, except the jobs it started:
        those see their parent gone (``parent_process().is_alive()`` is False, as in
        ``multiprocessing``) and exit by themselves moments later."""
        sig = signal.SIGKILL if force else signal.SIGTERM
        if job.handle.poll() is not None:
            return
        try:
            descendants = [child for child in psutil.Process(job.pid).children(recursive=True)
                           if not _is_job(child)]
        except psutil.Error:
            descendants = []
        try:
            job.handle.send_signal(sig)
        except ProcessLookupError:
            pass
        for child in descendants:
            try:
                child.send_signal(sig)
            except psutil.Error:
                pass

    def logs(self, job: Job) -> str:
        """The end of the job's output when it is kept (the ``dashboard`` setting is on),
        else nothing: the job writes straight to this process's stdout and stderr."""
        tail = getattr(job.handle, "tail", None)
        return tail.text() if tail is not None else ""

    def cleanup(self, job: Job) -> None:
        """The job ended: let what it wrote last reach this process's output first."""
        self._usage.forget(job.id)
        tail = getattr(job.handle, "tail", None)
        if tail is not None:
            tail.wait_closed(DRAIN)

    def close(self) -> None:
        self._usage.close()

    def listen_host(self) -> str:
        return "127.0.0.1"

    def sentinel(self, job: Job) -> int | None:
        if job.handle.poll() is not None or not hasattr(os, "pidfd_open"):
            return None
        try:
            return os.pidfd_open(job.pid)
        except OSError:
            return None

    # -- for the command line (processes found by their FIBERLITE_RUN_ID) ------------------
    def list_jobs(self, run_id: str | None = None) -> list[tuple[str, str, str]]:
        from . import runs as local_runs
        return local_runs.list_jobs(run_id)

    def cleanup_run(self, run_id: str | None = None) -> int:
        from . import runs as local_runs
        return local_runs.cleanup_run(run_id)

    def stream_logs(self, job_name: str, follow: bool = False) -> Iterator[str]:
        from . import runs as local_runs
        return local_runs.stream_logs(job_name, follow)

    def clean(self, run_id: str | None = None) -> int:
        """The run's processes, and the logs ``fiberlite run`` kept of its master."""
        from . import runs as local_runs
        removed = local_runs.cleanup_run(run_id)
        local_runs.remove_logs(run_id)
        return removed

    def run_master(self, run: MasterRun) -> int:
        """The master is a child process of the command (:mod:`.master`)."""
        from .master import run_master
        return run_master(run)


def _output_pipes(env: dict[str, str]) -> tuple[tuple[int, int], tuple[int, int]]:
    """Pipes for a job's stdout and stderr. A job writing to a terminal flushes each
    line; writing into a pipe it would hold its output back, so it is told not to buffer
    when this process writes to a terminal."""
    if os.isatty(1) or os.isatty(2):
        env.setdefault("PYTHONUNBUFFERED", "1")
    out = os.pipe()
    try:
        return out, os.pipe()
    except OSError:
        os.close(out[0])
        os.close(out[1])
        raise


def _secrets_pipe(secret_env: dict[str, str]) -> int:
    """The reading end of a pipe that holds ``secret_env``, its writing end closed."""
    data = encode_secrets(secret_env)
    if len(data) > select.PIPE_BUF:  # written at once, before the job reads
        raise BackendError(f"a job's secret environment is limited to {select.PIPE_BUF} bytes")
    read_end, write_end = os.pipe()
    try:
        os.write(write_end, data)
    finally:
        os.close(write_end)
    return read_end
