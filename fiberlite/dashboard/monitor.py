"""The dashboard's clock: while someone looks at the page, it measures the jobs and
adds a point to each chart every two seconds and sends the page's data, if it changed,
to the pages that follow the run (:mod:`.push`), all on one thread. Every half second
it looks for what the progress of the run does not explain: a queue's change or an
event the registry heard (a job, pool, call, error, lost worker...); those are sent at
once, so that every change shows within a second. Once a second in between, the counts
that running calls move (tasks done, rates, time left) go out alone, a small part of
the data that is cheap to build. Nobody looking: it sleeps."""
from __future__ import annotations

import collections
import threading
import time
from typing import Any, Callable

from .jobs import Meter, hosted_workers
from .push import Follower, Followers, encode
from .registry import HISTORY, Registry
from .snapshot import marks, progress, snapshot

CHECK = 0.5  # seconds between looks for a change to send to the pages that follow
ROUNDS_PER_TICK = 4  # looks per sample of the jobs and point of the charts (2 seconds)
ROUNDS_PER_PROGRESS = 2  # looks per message of the calls' counts alone (one a second)
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
        self.ticks = 0  # rounds of points added to the charts
        self.points: dict = {"tasks_per_second": [], "cpu": {}}  # those of the last round
        self._viewed = 0.0
        self._wake = threading.Event()
        self._stopped = False
        self._stopping = threading.Event()
        self._lock = threading.Lock()
        self.followers = Followers()
        self._marks: tuple = ()  # what :func:`.snapshot.marks` gave when data was last sent
        self._thread = threading.Thread(target=self._loop, name="fiberlite-dashboard-monitor",
                                        daemon=True)
        self._thread.start()

    def state(self, charts: bool = True) -> dict:
        """What the page shows (without the charts' history if not ``charts``); marks
        the page as viewed."""
        self._viewed = time.monotonic()
        self._wake.set()
        return snapshot(self.registry, self.meter, self.history() if charts else None,
                        self.meta)

    def history(self) -> dict:
        """The charts' points."""
        with self._lock:
            return {"tasks_per_second": list(self.rates),
                    "cpu": {name: list(points) for name, points in self.cpu.items()}}

    def follow(self, write: Callable[[bytes], None]) -> Follower:
        """A page follows the run from now on: it gets what the page shows at once
        through ``write``, then each change (until its ``ended`` is set)."""
        with self._lock:
            ticks = self.ticks
        follower = Follower(write, ticks)
        follower.send(encode(self.state()))  # its charts have at least round ``ticks``
        self.followers.add(follower)
        return follower

    def stop(self) -> None:
        self._stopped = True
        self._stopping.set()
        self._wake.set()
        self.followers.end_all()
        self._thread.join(timeout=5)
        self.meter.close()

    def _loop(self) -> None:
        rounds = 0
        while not self._stopped:
            if not self.followers and time.monotonic() - self._viewed > VIEWED_FOR:
                self._wake.clear()
                self._last_done = None
                rounds = 0
                self._wake.wait()
                continue
            try:
                if rounds % ROUNDS_PER_TICK == 0:
                    self.tick()
                    if self.followers:
                        self.send(self.meter.states)  # the jobs' states, just found
                elif self.followers and marks(self.registry) != self._marks:
                    self.send()
                elif self.followers and rounds % ROUNDS_PER_PROGRESS == 0:
                    self.followers.push_progress(progress(self.registry))
            except Exception:  # a page must never take the run down
                pass
            rounds += 1
            self._stopping.wait(CHECK)

    def send(self, states: dict | None = None) -> None:
        """Send what the page shows to the pages that follow the run, if it changed
        (``states``: the jobs' states, if just found)."""
        with self._lock:
            ticks, points = self.ticks, self.points
        self._marks = marks(self.registry)
        state = snapshot(self.registry, self.meter, None, self.meta, states)
        self.followers.push(state, ticks, points, self.history)

    def tick(self) -> None:
        """Measure the running jobs and add one point to each chart."""
        with self.registry.lock:
            records = list(self.registry.jobs.values())
            pools = list(self.registry.pools)
            done = self.registry.tasks_done
        self.meter.sample(records, hosted_workers(pools))
        now, stamp = time.monotonic(), round(time.time(), 2)  # short points: less to send
        with self._lock:
            points: dict = {"tasks_per_second": [], "cpu": {}}
            if self._last_done is not None:
                then, before = self._last_done
                points["tasks_per_second"].append(
                    (stamp, round((done - before) / max(now - then, 1e-9), 1)))
                self.rates.extend(points["tasks_per_second"])
            self._last_done = (now, done)
            for name, usage in self.meter.usage.items():
                if usage.cpu is not None:
                    points["cpu"][name] = [(stamp, round(usage.cpu, 1))]
                    self.cpu.setdefault(name, collections.deque(maxlen=HISTORY)).extend(
                        points["cpu"][name])
            for name in [n for n in self.cpu if n not in points["cpu"]]:
                del self.cpu[name]
            self.points = points
            self.ticks += 1
