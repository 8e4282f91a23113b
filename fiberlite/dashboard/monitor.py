"""The dashboard's clock: while someone follows the page, it measures the jobs and
adds a point to each chart every two seconds and sends the page's data, if it changed,
to the pages that follow the run (:mod:`.push`), all on one thread. In between it
sleeps until something happens that the progress of the run does not explain: an event
the registry heard (a job started or ended, a pool, call, error, lost worker...) or a
queue's change wakes it (:attr:`.Registry.changed`), and the data goes out at once (no
sooner than half a second after the last message for a change). While calls run, once
a second, the counts they move (tasks done, rates, time left) go out alone, a small part
of the data that is cheap to build. Nobody looking: it sleeps, and only a look wakes it."""
from __future__ import annotations

import collections
import threading
import time
from typing import Any, Callable

from .jobs import Meter, hosted_workers
from .push import Follower, Followers, encode
from .registry import HISTORY, Registry
from .snapshot import calls_running, marks, progress, snapshot

TICK = 2.0  # seconds between samples of the jobs (and points of the charts)
PROGRESS = 1.0  # seconds between messages of the running calls' counts alone
GAP = 0.5  # least seconds between two messages sent for changes (a busy queue's)
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
        self._poked = False  # something changed since the clock last looked
        self._awake = False  # the clock follows changes (someone looks at the page)
        self._sending = threading.Lock()  # a page starting to follow, or the clock sending
        self._stopped = False
        self._stopping = threading.Event()
        self._lock = threading.Lock()
        self.followers = Followers()
        self._marks: tuple = ()  # what :func:`.snapshot.marks` gave when data was last sent
        registry.changed = self.poke
        self._thread = threading.Thread(target=self._loop, name="fiberlite-dashboard-monitor",
                                        daemon=True)
        self._thread.start()

    def state(self, charts: bool = True) -> dict:
        """What the page shows (without the charts' history if not ``charts``); marks
        the page as viewed."""
        self._viewed = time.monotonic()
        self._awake = True  # a change from now on wakes the clock
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
        with self._sending:  # the clock sends what changes after this state to it too
            follower.send(encode(self.state()))  # its charts have at least round ``ticks``
            self.followers.add(follower)
        return follower

    def poke(self) -> None:
        """Something changed (told on the thread that changed it): wake the clock, if
        someone looks at the page and it was not woken for a change already."""
        if self._awake and not self._poked:
            self._poked = True
            self._wake.set()

    def stop(self) -> None:
        self.registry.changed = lambda: None
        self._stopped = True
        self._stopping.set()
        self._wake.set()
        self.followers.end_all()
        self._thread.join(timeout=5)

    def _loop(self) -> None:
        next_tick = next_progress = 0.0
        changed_at = -GAP  # when the last message for a change went
        while not self._stopped:
            if self._unwatched():
                self._wake.clear()
                if self._unwatched():  # (a look in between has set the wake again)
                    self._awake = False
                    self._last_done = None
                    next_tick = 0.0
                    self._wake.wait()
                continue
            self._awake = True
            now = time.monotonic()
            try:
                sample = now >= next_tick
                if sample:  # (measuring can take long: a page may start to follow meanwhile)
                    next_tick = now + TICK
                    self._poked = False
                    self.tick()
                with self._sending:
                    if sample:
                        if self.followers:
                            self.send(self.meter.states)  # the jobs' states, just found
                        next_progress = self._next_progress(now, next_tick)
                    elif self._poked and now >= changed_at + GAP:
                        self._poked = False
                        if self.followers and marks(self.registry) != self._marks:
                            self.send()
                            changed_at = now
                            next_progress = self._next_progress(now, next_tick)
                    elif now >= next_progress:
                        self.followers.push_progress(progress(self.registry))
                        next_progress = self._next_progress(now, next_tick)
            except Exception:  # a page must never take the run down
                pass
            self._sleep(min(next_tick, next_progress), changed_at + GAP)

    def _unwatched(self) -> bool:
        """Nobody follows the page, nor looked at it lately."""
        return not self.followers and time.monotonic() - self._viewed > VIEWED_FOR

    def _next_progress(self, now: float, next_tick: float) -> float:
        """When the running calls' counts go out next: in a second, or with the next
        sample if no call runs (a call that starts is a change, which wakes the clock)."""
        return now + PROGRESS if calls_running(self.registry) else next_tick

    def _sleep(self, until: float, changes_from: float) -> None:
        """Sleep until ``until`` (monotonic) or a change; a change that came already
        waits until ``changes_from``."""
        now = time.monotonic()
        if self._poked:
            self._stopping.wait(max(0.0, min(until, changes_from) - now))
            return
        self._wake.clear()
        if not self._poked and not self._stopped:
            self._wake.wait(until - now)

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
