"""What the dashboard knows of the run: the objects the API layer reported through
:mod:`fiberlite.observe`, and the counts it keeps of what happened to them. The tasks
done are not counted as results arrive: a pool call's result object knows how many are
in (``progress()``), read when the page is drawn, and once more when the call is over."""
from __future__ import annotations

import collections
import itertools
import threading
import time
import traceback
import weakref
from typing import Any, Callable

from .. import observe
from ..ring.report import REPORT_EVERY

KEEP_BATCHES = 50  # finished batches kept per pool
KEEP_ERRORS = 20  # task exceptions kept per pool
KEEP_JOBS = 500  # jobs kept, finished ones dropped first
HISTORY = 120  # points of each chart
# the call that made a batch, by the type of its result object
CALLS = {"MapResult": "map", "ApplyResult": "apply_async", "IMapIterator": "imap",
         "IMapUnorderedIterator": "imap_unordered"}


def _nothing() -> None:
    pass


class Batch:
    """One ``map``/``imap``/``apply_async`` call of a pool, its progress read from its
    result object."""

    def __init__(self, gid: int, call: str, function: str, sink: Any) -> None:
        self.gid = gid
        # a map's length is known now, an imap's once its input ends, an apply is one task
        self._total: int | None = sink.progress()[1]
        self.call = call
        self.function = function
        self.sink = weakref.ref(sink)
        self.failed = 0
        self.final: int | None = None  # the tasks done, once the call is over
        self._seen = 0  # the tasks done when last looked
        self.started = time.monotonic()
        self.finished: float | None = None

    @property
    def total(self) -> int | None:
        """The tasks of the call: a map's, an imap's once its input ended, or before that
        the input's length if it told it (``len`` or ``__length_hint__``)."""
        sink = self.sink()
        if sink is not None:
            self._total = sink.progress()[1]
        return self._total

    @property
    def done(self) -> int:
        """The tasks done so far, failed ones included."""
        if self.final is not None:
            return self.final
        sink = self.sink()
        if sink is not None:
            self._seen, total = sink.progress()
            if self.finished is None and total is not None and self._seen >= total:
                self.finished = time.monotonic()
        return self._seen

    def end(self, done: int) -> None:
        """The call is over, with ``done`` tasks done."""
        self.final = done
        if self.finished is None:
            self.finished = time.monotonic()


class PoolRecord:
    """A pool, its calls and the trouble it had."""

    def __init__(self, name: str, pool: Any) -> None:
        self.name = name
        self.pool = weakref.ref(pool)  # its view(): what the page shows of it
        self.batches: collections.deque[Batch] = collections.deque()
        self.losses = 0
        self.retries = 0
        self.errors: collections.deque[dict] = collections.deque(maxlen=KEEP_ERRORS)
        self.ended = 0  # tasks done by the calls that are over

    @property
    def done(self) -> int:
        """The tasks done, all calls."""
        return self.ended + sum(b.done for b in self.batches if b.final is None)

    def add_batch(self, batch: Batch) -> None:
        self.batches.append(batch)
        while len(self.batches) > KEEP_BATCHES and self.batches[0].final is not None:
            self.batches.popleft()


class JobRecord:
    """A started job: its process's launch, kept after the process object is gone."""

    def __init__(self, process: Any) -> None:
        self.process_name = process.name
        self.launch = process.launch
        self.name = self.launch.job.spec.name
        self.backend = self.launch.backend
        self.started = time.time()


class Registry:
    """The watcher the dashboard registers with :func:`fiberlite.observe.watch`."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.jobs: collections.OrderedDict[str, JobRecord] = collections.OrderedDict()
        self.pools: list[PoolRecord] = []
        self._by_source: dict[int, PoolRecord] = {}  # by what the pool's events name
        self._by_sink: dict[int, tuple[Batch, PoolRecord]] = {}
        self.queues: "weakref.WeakValueDictionary[int, Any]" = weakref.WeakValueDictionary()
        self.managers: "weakref.WeakValueDictionary[int, Any]" = weakref.WeakValueDictionary()
        self.rings: "weakref.WeakValueDictionary[int, Any]" = weakref.WeakValueDictionary()
        self._gone_done = 0  # the tasks done by pools that are gone
        self.events = 0  # events heard
        # told of each event heard and each change of a queue's state (the monitor's wake):
        # called on the thread of the change, it must return at once
        self.changed: Callable[[], None] = _nothing
        self._names = collections.defaultdict(lambda: itertools.count(1))

    @property
    def tasks_done(self) -> int:
        """The tasks done, all pools (read with the lock held)."""
        return self._gone_done + sum(p.done for p in self.pools)

    def name(self, kind: str) -> str:
        return f"{kind}-{next(self._names[kind])}"

    def __call__(self, event: str, *details: Any) -> None:
        handler = getattr(self, "on_" + event, None)
        if handler is not None:
            with self.lock:
                handler(*details)
                self.events += 1
            self.changed()

    # -- events ----------------------------------------------------------------------------
    def on_process(self, process: Any) -> None:
        record = JobRecord(process)
        self.jobs[record.name] = record
        record.launch.channel.watcher = self._job_ended
        if len(self.jobs) > KEEP_JOBS:
            for name, old in list(self.jobs.items()):
                if old.launch.returncode is not None:
                    del self.jobs[name]
                    break

    def on_pool(self, pool: Any) -> None:
        record = PoolRecord(self.name("Pool"), pool)
        self.pools.append(record)
        self._by_source[id(observe.view_of(pool).source)] = record
        self._gone_done += sum(p.done for p in self.pools if p.pool() is None)
        self.pools = [p for p in self.pools if p.pool() is not None]

    def on_batch(self, dispatcher: Any, group: Any) -> None:
        record = self._by_source.get(id(dispatcher))
        if record is None:
            return
        sink = group.sink
        batch = Batch(group.gid, CALLS.get(type(sink).__name__, group.kind), group.name, sink)
        record.add_batch(batch)
        self._by_sink[id(sink)] = (batch, record)
        live = {id(b.sink()) for p in self.pools for b in p.batches if b.sink() is not None}
        for key in [k for k in self._by_sink if k not in live]:
            del self._by_sink[key]

    def _find(self, sink: Any) -> tuple[Batch, PoolRecord] | None:
        found = self._by_sink.get(id(sink))
        return found if found is not None and found[0].sink() is sink else None

    def on_tasks(self, sink: Any, count: int, error: BaseException) -> None:
        found = self._find(sink)
        if found is None:
            return
        batch, record = found
        batch.failed += count
        record.errors.append({
            "batch": batch.gid, "function": batch.function, "tasks": count,
            "error": f"{type(error).__name__}: {error}",
            "traceback": "".join(traceback.format_exception(error))})

    def on_finished(self, sink: Any) -> None:
        found = self._find(sink)
        if found is not None and found[0].final is None:
            batch, record = found
            batch.end(sink.progress()[0])
            record.ended += batch.final

    def on_worker_lost(self, dispatcher: Any, wid: int, cause: str, retried: int) -> None:
        record = self._by_source.get(id(dispatcher))
        if record is not None:
            record.losses += 1
            record.retries += retried

    def on_queue(self, queue: Any) -> None:
        self.queues[id(queue)] = queue
        observe.view_of(queue).watch(self._queue_changed)

    def _queue_changed(self) -> None:
        self.changed()

    def _job_ended(self) -> None:
        self("job_ended")

    def on_job_ended(self) -> None:
        """A job's connection ended: it exited or is exiting (an event, so that the page
        shows its state at once)."""

    def on_manager(self, manager: Any) -> None:
        self.managers[id(manager)] = manager

    def on_ring(self, ring: Any) -> None:
        self.rings[id(ring)] = ring
        ring.ask_reports(REPORT_EVERY)  # its members report their collectives to it
