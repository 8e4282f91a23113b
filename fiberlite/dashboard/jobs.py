"""The jobs of the run as the page shows them: name (as ``fiberlite ps`` has it), backend,
host, state, exit code, and CPU and memory measured where the backend lets us. Each
backend says where a job runs (``Backend.location``) and what it uses
(``Backend.sample``: the kernel's figures for local processes, with the workers a host
job forked; the engine's stats on Docker; nothing on Kubernetes, whose API has no usage
without the metrics server, nor on Slurm without accounting): nothing here knows a
backend by name."""
from __future__ import annotations

import time

from .. import observe
from .registry import JobRecord, PoolRecord

LOG_LINES = 200


class Usage:
    """CPU (percent of one core) and memory (bytes) of one job, from two samples."""

    def __init__(self) -> None:
        self.cpu: float | None = None
        self.memory: int | None = None
        self._last: tuple[float, float] | None = None  # (wall time, CPU seconds)

    def update(self, cpu_seconds: float, memory: int, now: float) -> None:
        if self._last is not None and now > self._last[0]:
            self.cpu = max(0.0, 100.0 * (cpu_seconds - self._last[1]) / (now - self._last[0]))
        self._last = (now, cpu_seconds)
        self.memory = memory


def hosted_workers(pools: list[PoolRecord]) -> dict[str, list[int]]:
    """For each job that hosts pool workers: its name and the pids of those workers, as
    the pool's relay knows them."""
    found: dict[str, list[int]] = {}
    for record in pools:
        pool = record.pool()
        view = observe.view_of(pool) if pool is not None else None
        if view is not None:
            found.update(view.hosted_pids())
    return found


def host_of(record: JobRecord) -> str:
    """Where the job runs, as its backend says."""
    try:
        return record.backend.location(record.launch.job) or "(unknown)"
    except Exception:
        return "(unknown)"


def state_of(record: JobRecord) -> tuple[str, int | None]:
    launch = record.launch
    code = launch.returncode if launch.returncode is not None else launch.job.exitcode
    if code is None and launch.channel.lost.is_set():
        code = launch.channel.reported  # told by the job as it exited (None if killed)
    if code is not None:
        return "exited", code
    try:
        state = record.backend.status(launch.job).value
    except Exception:
        state = "unknown"
    if state == "running" and launch.channel.lost.is_set():
        state = "exiting"  # its connection ended, its exit code not known yet (killed?)
    return state, None


def requested(record: JobRecord) -> str:
    spec = record.launch.job.spec
    parts = [f"cpu {spec.cpu:g}" if spec.cpu else "", f"memory {spec.memory}" if spec.memory else ""]
    return ", ".join(p for p in parts if p)


def log_tail(record: JobRecord, lines: int = LOG_LINES) -> str:
    """The last ``lines`` lines the job printed, as far as its backend keeps them."""
    try:
        text = record.backend.logs(record.launch.job)
    except Exception as exc:
        return f"(cannot read the log of {record.name}: {exc})"
    return "\n".join(text.splitlines()[-lines:]) or "(no output yet)"


class Meter:
    """Measures the jobs that still run; one call per sampling tick."""

    def __init__(self) -> None:
        self.usage: dict[str, Usage] = {}
        self.states: dict[str, tuple[str, int | None]] = {}  # state_of each job, last sample

    def sample(self, records: list[JobRecord], hosted: dict[str, list[int]]) -> None:
        """Measure ``records``' jobs; ``hosted``: the pids of pool workers forked in each
        host job (:func:`hosted_workers`)."""
        now = time.monotonic()
        running = set()
        self.states = {}
        for record in records:
            state = self.states[record.name] = state_of(record)
            if state[0] != "running":
                continue
            try:
                measured = record.backend.sample(record.launch.job, hosted.get(record.name, ()))
            except Exception:
                measured = None
            if measured is None:
                continue
            running.add(record.name)
            self.usage.setdefault(record.name, Usage()).update(*measured, now)
        for name in list(self.usage):
            if name not in running:
                self.usage[name].cpu = None
