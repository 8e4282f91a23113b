"""Runs of the local backend seen from outside: which processes belong to which run
(their environment carries ``FIBERLITE_RUN_ID`` and ``FIBERLITE_JOB_NAME``), stopping
them, and the log files ``fiberlite run`` keeps of a run's master job."""
from __future__ import annotations

import os
import time
from pathlib import Path
from typing import BinaryIO, Iterator

import psutil

RUN_ENV = "FIBERLITE_RUN_ID"
JOB_ENV = "FIBERLITE_JOB_NAME"


def log_dir() -> Path:
    """Where ``fiberlite run`` keeps the output of local master jobs."""
    base = os.environ.get("XDG_STATE_HOME") or os.path.join(os.path.expanduser("~"), ".local", "state")
    return Path(base) / "fiberlite" / "logs"


def private_log_dir() -> Path:
    """:func:`log_dir`, made if missing and readable by this user only (0700): a run's
    output may hold anything its script printed."""
    directory = log_dir()
    directory.mkdir(mode=0o700, parents=True, exist_ok=True)
    if directory.stat().st_uid != os.getuid():
        raise PermissionError(f"the log directory {directory} belongs to another user; "
                              "set XDG_STATE_HOME to a directory of yours")
    directory.chmod(0o700)  # made by an older version with the default mode
    return directory


def open_private(path: Path) -> BinaryIO:
    """``path`` opened for writing from its start, readable by this user only (0600)."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW, 0o600)
    os.fchmod(fd, 0o600)  # it existed with another mode
    return os.fdopen(fd, "wb")


def log_path(job_name: str) -> Path:
    return log_dir() / f"{job_name}.log"


def done_path(job_name: str) -> Path:
    """Written (with the exit code) when the job has ended: followers stop there."""
    return log_dir() / f"{job_name}.exit"


def _environ(proc: psutil.Process) -> dict[str, str] | None:
    try:
        return proc.environ()
    except (psutil.Error, OSError):
        return None


def run_processes(run_id: str | None = None) -> Iterator[tuple[psutil.Process, dict[str, str]]]:
    """Processes of run ``run_id`` (any run when None), with their start environment."""
    me = os.getpid()
    for proc in psutil.process_iter():
        if proc.pid == me:
            continue
        env = _environ(proc)
        if not env or RUN_ENV not in env or (run_id is not None and env[RUN_ENV] != run_id):
            continue
        yield proc, env


def _state(proc: psutil.Process) -> str:
    try:
        status = proc.status()
    except psutil.Error:
        return "exited"
    return "exited" if status in (psutil.STATUS_ZOMBIE, psutil.STATUS_DEAD) else "running"


def list_jobs(run_id: str | None = None) -> list[tuple[str, str, str]]:
    """One entry per job: the top process carrying a job name (its own subprocesses,
    which inherit the name, are not listed again)."""
    found = {proc.pid: (proc, env) for proc, env in run_processes(run_id)}
    jobs = []
    for pid, (proc, env) in sorted(found.items()):
        name = env.get(JOB_ENV)
        if not name:
            continue
        try:
            parent = proc.ppid()
        except psutil.Error:
            continue
        if parent in found and found[parent][1].get(JOB_ENV) == name:
            continue
        jobs.append((name, env[RUN_ENV], _state(proc)))
    return jobs


def cleanup_run(run_id: str | None = None, grace: float = 3.0) -> int:
    """SIGTERM every process of the run (never this process or its ancestors), SIGKILL
    those still there after ``grace`` seconds; returns how many jobs were stopped."""
    try:
        protected = {p.pid for p in psutil.Process().parents()}
    except psutil.Error:
        protected = set()
    procs, jobs = [], set()
    for proc, env in run_processes(run_id):
        if proc.pid in protected:
            continue
        procs.append(proc)
        jobs.add((env[RUN_ENV], env.get(JOB_ENV) or proc.pid))
    for proc in procs:
        try:
            proc.terminate()
        except psutil.Error:
            pass
    _, alive = psutil.wait_procs(procs, timeout=grace)
    for proc in alive:
        try:
            proc.kill()
        except psutil.Error:
            pass
    psutil.wait_procs(alive, timeout=grace)
    return len(jobs)


def remove_logs(run_id: str | None = None) -> int:
    """Delete the log files of finished local runs (of ``run_id`` only when given)."""
    removed = 0
    directory = log_dir()
    if not directory.is_dir():
        return 0
    for done in directory.glob("*.exit"):
        name = done.name[:-len(".exit")]
        if run_id is not None and not name.startswith(f"fl-{run_id}-"):
            continue
        for path in (log_path(name), done):
            try:
                path.unlink()
                removed += path.suffix == ".log"
            except OSError:
                pass
    return removed


def stream_logs(job_name: str, follow: bool = False, poll: float = 0.2) -> Iterator[str]:
    """The output ``fiberlite run`` recorded for a local master job."""
    path = log_path(job_name)
    if not path.is_file():
        raise LookupError(f"no log for local job {job_name} (fiberlite keeps the output of master "
                          "jobs started with `fiberlite run`; other local jobs print to their "
                          "run's terminal)")
    return _read(path, done_path(job_name), follow, poll)


def _read(path: Path, done: Path, follow: bool, poll: float) -> Iterator[str]:
    with open(path, encoding="utf-8", errors="replace") as fh:
        while True:
            text = fh.read(65536)
            if text:
                yield text
                continue
            if not follow or done.exists():
                text = fh.read()
                if text:
                    yield text
                return
            time.sleep(poll)  # tail -f: nothing to wait on but the file
