"""Looking for a message awake before sleeping on it (local links and lanes).

Falling asleep and being woken costs more than a round trip's other work, so a reader
first tries for up to :data:`SPIN_SECONDS` without sleeping: a reply that comes within
microseconds is taken awake. A look that finds nothing makes the next ones rarer (1, 2,
4, ... up to :data:`SPIN_SKIP_MAX` reads sleep at once), and one that found something
halves that, so a reader that waits long, or competes with others for few messages,
spends next to nothing on it. None of this on a machine with one CPU for this process,
where the peer could not run meanwhile, nor while the machine has no CPU to spare
(:func:`spare_cpu`: more threads ready to run than CPUs), where a look takes the CPU
from the peer it waits for, or from other work.
"""
from __future__ import annotations

import os
import time
from typing import Any, Callable

SPIN_SECONDS = 50e-6 if len(getattr(os, "sched_getaffinity", lambda _: range(os.cpu_count() or 1))(0)) > 1 else 0.0
SPIN_SKIP_MAX = 64
BUSY_CHECK_SECONDS = 0.05  # how long the machine's load, as last read, holds
_clock = time.perf_counter
_CPUS = len(getattr(os, "sched_getaffinity", lambda _: range(os.cpu_count() or 1))(0))


class _Load:
    """Whether the machine has a CPU to spare, read from ``/proc/loadavg`` (the threads
    ready to run now, this one included) at most every :data:`BUSY_CHECK_SECONDS`."""

    def __init__(self) -> None:
        self._fd: int | None = None
        self._until = 0.0
        self._spare = True
        try:
            self._fd = os.open("/proc/loadavg", os.O_RDONLY | getattr(os, "O_CLOEXEC", 0))
        except OSError:
            pass  # (not Linux: assume there is)

    def spare(self) -> bool:
        """Whether a CPU is to spare (not Linux: always)."""
        now = _clock()
        if now < self._until or self._fd is None:
            return self._spare
        self._until = now + BUSY_CHECK_SECONDS
        try:  # "0.52 0.58 0.59 2/345 6789": 2 ready to run
            running = int(os.pread(self._fd, 128, 0).split()[3].split(b"/")[0])
        except (OSError, ValueError, IndexError):
            return self._spare
        self._spare = running <= _CPUS
        return self._spare


_load = _Load()


# whether no more threads are ready to run than there are CPUs (as of the last
# BUSY_CHECK_SECONDS): asked before each look
spare_cpu = _load.spare


class Awake:
    """The look-awake state of one reader."""

    __slots__ = ("_skip", "_misses")

    def __init__(self) -> None:
        self._skip = self._misses = 0

    def look(self, attempt: Callable[[], Any], ready: Callable[[], Any] | None = None) -> Any:
        """What ``attempt()`` returned once it did not raise ``BlockingIOError`` (or
        ``InterruptedError``) within the look; None when nothing came (then sleep).
        ``ready()``, when given, is asked first each time: a cheaper look than a failed
        attempt. A look that found something makes the next ones half as rare as they
        were, so that readers that compete for a few messages (most looks find nothing)
        keep looking rarely."""
        if self._skip or not SPIN_SECONDS:
            self._skip = max(0, self._skip - 1)
            return None
        if not spare_cpu():
            return None
        end = _clock() + SPIN_SECONDS
        while True:
            try:
                if ready is not None and not ready():
                    raise BlockingIOError
                got = attempt()
            except (BlockingIOError, InterruptedError):
                if _clock() < end:
                    continue
                self._misses = min(SPIN_SKIP_MAX, 2 * self._misses or 1)
                self._skip = self._misses
                return None
            self._misses //= 2
            return got
