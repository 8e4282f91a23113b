"""The jobs of the run as the page shows them: name (as ``fiberlite ps`` has it), backend,
host, state, exit code, and CPU and memory measured where the backend lets us: psutil
for local processes (with the workers a host job forked), the engine's stats on
Docker, the pod's node and requests on Kubernetes (its API has no usage without the
metrics server)."""
from __future__ import annotations

import collections
import socket
import time
from typing import Any

import psutil

from .registry import JobRecord

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


class LocalProcesses:
    """The processes of local jobs: a job's process and those it forked (a host job's
    workers). Who forked whom is read from one look at all the machine's processes,
    every ``REFRESH`` samples, or every ``YOUNG_REFRESH`` while a job is younger than
    ``YOUNG`` seconds (its workers are being forked)."""

    REFRESH = 10
    YOUNG_REFRESH = 2
    YOUNG = 20.0

    def __init__(self) -> None:
        self._children: dict[int, list[int]] = {}
        self._since = self.REFRESH  # samples since the last look
        self._procs: dict[int, psutil.Process] = {}

    def tick(self) -> None:
        """A new round of samples."""
        self._since += 1

    def _look(self, young: bool) -> None:
        if self._since < (self.YOUNG_REFRESH if young else self.REFRESH):
            return
        children: dict[int, list[int]] = collections.defaultdict(list)
        for proc in psutil.process_iter(["ppid"]):
            if proc.info["ppid"]:
                children[proc.info["ppid"]].append(proc.pid)
        alive = {pid for kids in children.values() for pid in kids}
        self._procs = {pid: p for pid, p in self._procs.items() if pid in alive}
        self._children, self._since = children, 0

    def _family(self, pid: int) -> list[int]:
        family, todo = [pid], [pid]
        while todo:
            kids = self._children.get(todo.pop(), [])
            family.extend(kids)
            todo.extend(kids)
        return family

    def sample(self, record: JobRecord) -> tuple[float, int] | None:
        """CPU seconds and resident bytes of the job's processes."""
        self._look(time.time() - record.started < self.YOUNG)
        cpu, memory, measured = 0.0, 0, False
        for pid in self._family(record.launch.pid):
            try:
                proc = self._procs.get(pid) or self._procs.setdefault(pid, psutil.Process(pid))
                with proc.oneshot():
                    times = proc.cpu_times()
                    cpu += times.user + times.system
                    memory += proc.memory_info().rss
                measured = True
            except psutil.Error:
                self._procs.pop(pid, None)
        return (cpu, memory) if measured else None


def docker_sample(record: JobRecord) -> tuple[float, int] | None:
    """CPU seconds and memory of a container, from one engine stats call."""
    try:
        stats = record.backend._client().stats(record.launch.job.id, stream=False, one_shot=True)
        cpu = stats["cpu_stats"]["cpu_usage"]["total_usage"] / 1e9
        memory = int(stats.get("memory_stats", {}).get("usage", 0))
    except Exception:
        return None
    return cpu, memory




def host_of(record: JobRecord) -> str:
    backend = record.backend.name
    if backend == "kubernetes":
        pod = getattr(record.launch.job.handle, "pod", None)
        node = getattr(getattr(pod, "spec", None), "node_name", None)
        return node or "(not scheduled)"
    if backend == "docker":
        return f"{socket.gethostname()} (container {record.launch.job.id[:12]})"
    return socket.gethostname()


def state_of(record: JobRecord) -> tuple[str, int | None]:
    launch = record.launch
    code = launch.returncode if launch.returncode is not None else launch.job.exitcode
    if code is not None:
        return "exited", code
    try:
        state = record.backend.status(launch.job).value
    except Exception:
        state = "unknown"
    return state, None


def requested(record: JobRecord) -> str:
    spec = record.launch.job.spec
    parts = [f"cpu {spec.cpu:g}" if spec.cpu else "", f"memory {spec.memory}" if spec.memory else ""]
    return ", ".join(p for p in parts if p)


def log_tail(record: JobRecord, lines: int = LOG_LINES) -> str:
    """The last ``lines`` lines the job printed, as far as its backend keeps them."""
    if record.backend.name == "local":
        return ("(a local job prints straight to the master's own output; "
                "`fiberlite run` keeps it: `fiberlite logs <master job>`)")
    try:
        text = record.backend.logs(record.launch.job)
    except Exception as exc:
        return f"(cannot read the log of {record.name}: {exc})"
    return "\n".join(text.splitlines()[-lines:]) or "(no output yet)"


class Meter:
    """Measures the jobs that still run; one call per sampling tick."""

    def __init__(self) -> None:
        self.usage: dict[str, Usage] = {}
        self.local = LocalProcesses()
        self.samplers = {"local": self.local.sample, "docker": docker_sample}

    def sample(self, records: list[JobRecord]) -> None:
        now = time.monotonic()
        self.local.tick()
        running = set()
        for record in records:
            if state_of(record)[0] != "running":
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
