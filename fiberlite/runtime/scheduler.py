"""One background thread per process for deadlines and deferred work of the hub."""
from __future__ import annotations

import heapq
import itertools
import logging
import threading
import time
from typing import Callable

log = logging.getLogger(__name__)


class Timer:
    """A scheduled call that can be cancelled before it runs."""

    __slots__ = ("fn", "cancelled")

    def __init__(self, fn: Callable[[], None]) -> None:
        self.fn = fn
        self.cancelled = False

    def cancel(self) -> None:
        self.cancelled = True


class Scheduler:
    """Runs callables soon or after a delay, in order, on a daemon thread."""

    def __init__(self, name: str = "fiberlite-scheduler") -> None:
        self._heap: list[tuple[float, int, Timer]] = []
        self._counter = itertools.count()
        self._cond = threading.Condition()
        self._stopped = False
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)
        self._thread.start()

    def call_later(self, delay: float, fn: Callable[[], None]) -> Timer:
        timer = Timer(fn)
        with self._cond:
            heapq.heappush(self._heap, (time.monotonic() + max(0.0, delay), next(self._counter), timer))
            self._cond.notify()
        return timer

    def call_soon(self, fn: Callable[[], None]) -> Timer:
        return self.call_later(0.0, fn)

    def stop(self) -> None:
        """End the thread; what is scheduled and not yet due never runs."""
        with self._cond:
            self._stopped = True
            self._cond.notify()

    def _run(self) -> None:
        while True:
            with self._cond:
                while True:
                    if self._stopped:
                        return
                    now = time.monotonic()
                    if self._heap and self._heap[0][0] <= now:
                        _, _, timer = heapq.heappop(self._heap)
                        break
                    self._cond.wait(self._heap[0][0] - now if self._heap else None)
            if timer.cancelled:
                continue
            try:
                timer.fn()
            except Exception:
                log.exception("scheduled call failed")
