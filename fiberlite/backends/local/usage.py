"""What a local job uses: the CPU seconds and resident bytes of its process and of the
pool workers it forked, read from the kernel for the run's page.

On Linux each figure is one read of ``/proc/PID/stat`` (the figures psutil reads there,
at a tenth of its cost), from a file kept open while the process is measured: a read
fails once the process is gone, even if its pid was taken by another, and the file is
then closed. Elsewhere psutil measures.
"""
from __future__ import annotations

import os
import threading
from typing import Iterable

import psutil

PROC = "/proc"
HAS_PROC = os.path.isdir(PROC)  # Linux's
CLOCK_TICKS = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100
PAGE_SIZE = os.sysconf("SC_PAGE_SIZE") if hasattr(os, "sysconf") else 4096


def process_usage(pid: int, stat: int | None = None) -> tuple[float, int] | None:
    """CPU seconds and resident bytes of process ``pid`` (None: it is gone); ``stat``:
    its ``/proc/PID/stat``, open."""
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


class UsageMeter:
    """Measures groups of processes, each under a key (a job's id), keeping their stat
    files open between two measures; :meth:`forget` closes a group's."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._files: dict[str, dict[int, int]] = {}  # key -> pid -> its /proc/PID/stat, open

    def measure(self, key: str, pids: Iterable[int]) -> tuple[float, int] | None:
        """The summed CPU seconds and resident bytes of ``pids``; None if none is alive."""
        cpu, memory, measured = 0.0, 0, False
        with self._lock:
            files = self._files.setdefault(key, {})
            for pid in pids:
                stat = self._open(files, pid)
                usage = process_usage(pid, stat)
                if usage is None:
                    if stat is not None:
                        os.close(files.pop(pid))
                    continue
                cpu += usage[0]
                memory += usage[1]
                measured = True
        return (cpu, memory) if measured else None

    @staticmethod
    def _open(files: dict[int, int], pid: int) -> int | None:
        stat = files.get(pid)
        if stat is None and HAS_PROC:
            try:
                stat = files[pid] = os.open(f"{PROC}/{pid}/stat", os.O_RDONLY)
            except OSError:
                return None
        return stat

    def forget(self, key: str) -> None:
        """Close the files of ``key``'s processes."""
        with self._lock:
            for stat in self._files.pop(key, {}).values():
                os.close(stat)

    def close(self) -> None:
        for key in list(self._files):
            self.forget(key)
