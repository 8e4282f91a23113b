"""The dashboard's clock: once a second, while someone looks at the page, it measures
the jobs and adds a point to each chart. Nobody looking: it sleeps."""
from __future__ import annotations

import collections
import threading
import time
from typing import Any, Iterator

from .jobs import Meter, hosted_workers
from .registry import HISTORY, Registry
from .snapshot import snapshot

TICK = 1.0  # seconds between samples
CHECK = 0.5  # seconds between looks for a change to push to an open page
VIEWED_FOR = 10.0  # seconds a look at the page keeps the sampling on


class Monitor:
    """The registry, the job meter and the charts' history, sampled on a thread."""

    def __init__(self, registry: Registry, meta: dict[str, Any]) -> None:
        self.registry = registry
        self.meta = meta
        self.meter = Meter()
        self.rates: collections.deque = collections.deque(maxlen=HISTORY)
        self.cpu: dict[str, collections.deque] = {}
        self._last_done: tuple[float, int] | None = None
        self._viewed = 0.0
        self._wake = threading.Event()
        self._stopped = False
        self._stopping = threading.Event()
        self._lock = threading.Lock()
        self._thread = threading.Thread(target=self._loop, name="fiberlite-dashboard-monitor",
                                        daemon=True)
        self._thread.start()

    def state(self) -> dict:
        """What the page shows; marks the page as viewed."""
        self._viewed = time.monotonic()
        self._wake.set()
        with self._lock:
            charts = {"tasks_per_second": list(self.rates),
                      "cpu": {name: list(points) for name, points in self.cpu.items()}}
        return snapshot(self.registry, self.meter, charts, self.meta)

    def changes(self, every: float = CHECK) -> Iterator[dict]:
        """What the page shows, each time it changed (looked at every ``every`` seconds),
        until the monitor stops; the first at once."""
        last = None
        while not self._stopped:
            state = self.state()
            stamp = state.pop("time")
            if state != last:
                last = state
                yield {**state, "time": stamp}
            self._stopping.wait(every)

    def stop(self) -> None:
        self._stopped = True
        self._stopping.set()
        self._wake.set()

    def _loop(self) -> None:
        while not self._stopped:
            if time.monotonic() - self._viewed > VIEWED_FOR:
                self._wake.clear()
                self._last_done = None
                self._wake.wait()
                continue
            try:
                self.tick()
            except Exception:  # a page must never take the run down
                pass
            time.sleep(TICK)

    def tick(self) -> None:
        """Measure the running jobs and add one point to each chart."""
        with self.registry.lock:
            records = list(self.registry.jobs.values())
            pools = list(self.registry.pools)
            done = self.registry.tasks_done
        self.meter.sample(records, hosted_workers(pools))
        now, stamp = time.monotonic(), round(time.time(), 2)  # short points: less to send
        with self._lock:
            if self._last_done is not None:
                then, before = self._last_done
                self.rates.append((stamp, round((done - before) / max(now - then, 1e-9), 1)))
            self._last_done = (now, done)
            for name, usage in self.meter.usage.items():
                if usage.cpu is not None:
                    self.cpu.setdefault(name, collections.deque(maxlen=HISTORY)).append(
                        (stamp, round(usage.cpu, 1)))
            for name in [n for n in self.cpu if self.meter.usage.get(n) is None
                         or self.meter.usage[n].cpu is None]:
                del self.cpu[name]
