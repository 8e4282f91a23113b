"""The jobs of the run as the page shows them: name (as ``fiberlite ps`` has it), backend,
host, state, exit code, and CPU and memory measured where the backend lets us: the
kernel's figures for local processes (with the workers a host job forked), the engine's stats on
Docker, the pod's node and requests on Kubernetes (its API has no usage without the
metrics server)."""
from __future__ import annotations

import os
import socket
import time

import psutil

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


PROC = "/proc"
HAS_PROC = os.path.isdir(PROC)  # Linux's
CLOCK_TICKS = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100
PAGE_SIZE = os.sysconf("SC_PAGE_SIZE") if hasattr(os, "sysconf") else 4096


def process_usage(pid: int, stat: int | None = None) -> tuple[float, int] | None:
    """CPU seconds and resident bytes of process ``pid`` (None: it is gone). On Linux
    from one read of ``/proc/PID/stat`` (``stat``: that file, open), the figures psutil
    reads there, at a tenth of its cost; elsewhere from psutil."""
    if HAS_PROC:
        try:
            if stat is not None:
                text = os.pread(stat, 1024, 0)
            else:
                with open(f"{PROC}/{pid}/stat", "rb") as file:
                    text = file.read()
            fields = text.rsplit(b")", 1)[1].split()
        except (OSError, IndexError):
            return None
        # after the name: state is field 3; utime 14, stime 15, rss (pages) 24
        return (int(fields[11]) + int(fields[12])) / CLOCK_TICKS, int(fields[21]) * PAGE_SIZE
    try:
        proc = psutil.Process(pid)
        with proc.oneshot():
            times = proc.cpu_times()
            return times.user + times.system, proc.memory_info().rss
    except psutil.Error:
        return None


class LocalProcesses:
    """The processes of local jobs: a job's own process and the pool workers it forked
    (a host job's), whose pids the pool's relay knows; nothing looks through the
    machine's process table. Each process's ``/proc/PID/stat`` stays open while it is
    measured (a read of an open file: one system call; a process gone, or its pid taken
    by another, makes it fail)."""

    def __init__(self) -> None:
        self.hosted: dict[str, list[int]] = {}  # job name -> pids of the workers it forked
        self._files: dict[int, int] = {}  # pid -> its /proc/PID/stat, open
        self._used: set[int] = set()  # the pids measured this round

    def start_round(self, hosted: dict[str, list[int]]) -> None:
        """A new round of samples, with the forked workers' pids of each host job."""
        for pid in [p for p in self._files if p not in self._used]:
            os.close(self._files.pop(pid))
        self._used = set()
        self.hosted = hosted

    def sample(self, record: JobRecord) -> tuple[float, int] | None:
        """CPU seconds and resident bytes of the job's processes."""
        cpu, memory, measured = 0.0, 0, False
        for pid in [record.launch.pid, *self.hosted.get(record.name, ())]:
            usage = process_usage(pid, self._file(pid))
            if usage is not None:
                cpu += usage[0]
                memory += usage[1]
                measured = True
        return (cpu, memory) if measured else None

    def _file(self, pid: int) -> int | None:
        self._used.add(pid)
        stat = self._files.get(pid)
        if stat is None and HAS_PROC:
            try:
                stat = self._files[pid] = os.open(f"{PROC}/{pid}/stat", os.O_RDONLY)
            except OSError:
                return None
        return stat

    def close(self) -> None:
        """Close the files kept open."""
        self._used = set()
        self.start_round({})


def hosted_workers(pools: list[PoolRecord]) -> dict[str, list[int]]:
    """For each job that hosts pool workers: its name and the pids of those workers, as
    the pool's relay knows them."""
    found: dict[str, list[int]] = {}
    for record in pools:
        core = getattr(record.pool(), "_core", None)
        relay = getattr(core, "relay", None)
        if relay is None:
            continue
        for hid, pids in relay.pids_by_host().items():
            launch = getattr(core.procs.get(hid), "_popen", None)
            if launch is not None:
                found[launch.job.spec.name] = pids
    return found


def docker_sample(record: JobRecord) -> tuple[float, int] | None:
    """CPU seconds and memory of a container, from one engine stats call."""
    try:
        stats = record.backend._client().stats(record.launch.job.id, stream=False, one_shot=True)
        cpu = stats["cpu_stats"]["cpu_usage"]["total_usage"] / 1e9
        memory = int(stats.get("memory_stats", {}).get("usage", 0))
    except Exception:
        return None
    return cpu, memory




HOST = socket.gethostname()  # this machine's, where local jobs and Docker containers run


def host_of(record: JobRecord) -> str:
    backend = record.backend.name
    if backend == "kubernetes":
        pod = getattr(record.launch.job.handle, "pod", None)
        node = getattr(getattr(pod, "spec", None), "node_name", None)
        return node or "(not scheduled)"
    if backend == "docker":
        return f"{HOST} (container {record.launch.job.id[:12]})"
    return HOST


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
        self.local = LocalProcesses()
        self.samplers = {"local": self.local.sample, "docker": docker_sample}

    def sample(self, records: list[JobRecord], hosted: dict[str, list[int]]) -> None:
        """Measure ``records``' jobs; ``hosted``: the pids of pool workers forked in each
        host job (:func:`hosted_workers`)."""
        now = time.monotonic()
        self.local.start_round(hosted)
        running = set()
        self.states = {}
        for record in records:
            state = self.states[record.name] = state_of(record)
            if state[0] != "running":
                continue
            sampler = self.samplers.get(record.backend.name)
            measured = sampler(record) if sampler is not None else None
            if measured is None:
                continue
            running.add(record.name)
            self.usage.setdefault(record.name, Usage()).update(*measured, now)
        for name in list(self.usage):
            if name not in running:
                self.usage[name].cpu = None

    def close(self) -> None:
        """Let go of what it keeps open."""
        self.local.close()
