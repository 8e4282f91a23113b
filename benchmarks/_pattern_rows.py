"""The patterns of ``bench_patterns.py``: who puts into one queue and who gets from it.

A *fixture* is one pattern set up with one library: its queue, its processes (started
and waiting at a barrier, so that starting them is never timed) and the parent's part.
``run()`` times one round: from the moment the first process began its work after the
barrier's release until every item was taken (for a ``JoinableQueue``, until the
parent's ``join()`` returns), and checks that none was lost.

Each producer puts its items and then its share of stops (None); each consumer takes
items until it has its share of stops. Every item is ahead of its producer's stops, so
once every stop is taken every item is, with any number of producers and consumers and
no process in between. The children are module-level functions, imported by name by a
``multiprocessing`` spawn child and by a fiberlite job alike.
"""
from __future__ import annotations

import multiprocessing
import os
import signal
import threading
import time
from typing import Any

STOP = None
TIMEOUT = 120.0  # seconds any wait of the parent (or a child at its barrier) may last
MP = "mp spawn"
FIBERLITE = "fiberlite"
KINDS = ("Queue", "SimpleQueue", "JoinableQueue")


def context(library: str) -> Any:
    """The module-like object whose ``Process``, ``Queue``, ... a library's rows use."""
    if library == MP:
        return multiprocessing.get_context("spawn")
    import fiberlite
    return fiberlite


def shares(total: int, parts: int) -> list[int]:
    """``total`` split into ``parts`` shares as even as can be."""
    return [total // parts + (1 if i < total % parts else 0) for i in range(parts)]


# -- the two roles, in a child or in the parent ----------------------------------------------
def put_items(items: Any, count: int, stops: int) -> None:
    put = items.put
    for i in range(count):
        put(i)
    for _ in range(stops):
        put(STOP)


def take_items(items: Any, stops: int, joinable: bool) -> int:
    """Items taken until ``stops`` stops were (each marked done in a JoinableQueue)."""
    get, got = items.get, 0
    done = items.task_done if joinable else None
    while stops:
        if get() is STOP:
            stops -= 1
        else:
            got += 1
        if done is not None:
            done()
    return got


def producer(items: Any, count: int, stops: int, barrier: Any, reports: Any, rounds: int) -> None:
    """Ready, then each round: at the barrier's release, put; say so (and when it
    began). Ends at the barrier too."""
    barrier.wait(TIMEOUT)
    for _ in range(rounds):
        barrier.wait(TIMEOUT)
        began = time.monotonic()
        put_items(items, count, stops)
        reports.put(("put", count, began))
    barrier.wait(TIMEOUT)  # ends with the others: its CPU time is read after the last round


def consumer(items: Any, stops: int, joinable: bool, barrier: Any, reports: Any, rounds: int) -> None:
    """Ready, then each round: at the barrier's release, take; say how many (and when it
    began). Ends at the barrier too."""
    barrier.wait(TIMEOUT)
    for _ in range(rounds):
        barrier.wait(TIMEOUT)
        began = time.monotonic()
        reports.put(("taken", take_items(items, stops, joinable), began))
    barrier.wait(TIMEOUT)


def middle(library: str, role: str, items: Any, shares_: list[tuple], common: tuple) -> None:
    """A child that starts one grandchild of ``role`` (producer or consumer) a share,
    says their pids (killed by the parent on failure) and waits for them."""
    ctx = context(library)
    target = producer if role == "producer" else consumer
    kids = [ctx.Process(target=target, args=(items, *share, *common)) for share in shares_]
    for kid in kids:
        kid.start()
    barrier, reports, rounds = common
    reports.put(("pids", [kid.pid for kid in kids]))
    for kid in kids:
        kid.join()


_POOL_QUEUE: Any = None


def keep_queue(items: Any) -> None:
    """A pool worker's initializer: keep the queue its tasks put into."""
    global _POOL_QUEUE
    _POOL_QUEUE = items


def pool_put(count: int) -> int:
    put_items(_POOL_QUEUE, count, 0)
    return os.getpid()


def pool_pid(_: Any) -> int:
    time.sleep(0.02)
    return os.getpid()


def joined(items: Any, timeout: float = TIMEOUT) -> None:
    """``items.join()`` within ``timeout`` seconds (a JoinableQueue's join has none)."""
    waiter = threading.Thread(target=items.join, daemon=True)
    waiter.start()
    waiter.join(timeout)
    if waiter.is_alive():
        raise TimeoutError(f"join() did not return within {timeout:g} s")


# -- fixtures ---------------------------------------------------------------------------------
class Fixture:
    """A pattern set up with one library; ``run()`` is one timed round's (seconds, items)."""

    def __init__(self, library: str, kind: str) -> None:
        self.ctx = context(library)
        self.library = library
        self.kind = kind
        self.joinable = kind == "JoinableQueue"
        self.items = getattr(self.ctx, kind)()
        self.reports = self.ctx.Queue()
        self.processes: list[Any] = []
        self.pids: list[int] = []
        # the last round's start lag: how long after the first process of the round began its
        # work the last one did (a barrier's release, not the queue; None: no barrier)
        self.lag: float | None = None

    def start(self, target: Any, *args: Any) -> Any:
        process = self.ctx.Process(target=target, args=args)
        process.start()
        self.processes.append(process)
        return process

    def report(self) -> tuple:
        what = self.reports.get(timeout=TIMEOUT)
        if what[0] == "pids":
            self.pids.extend(what[1])
            return ("pids", 0, None)
        return what

    def run(self) -> tuple[float, int]:
        raise NotImplementedError

    def kill_grandchildren(self) -> None:
        """Kill the grandchildren still there, known by their pid and their parent (one
        of this fixture's children, so that no other process is hit)."""
        import psutil
        ours = {process.pid for process in self.processes}
        for pid in self.pids:
            try:
                if psutil.Process(pid).ppid() in ours:
                    os.kill(pid, signal.SIGKILL)
            except (psutil.Error, OSError, TypeError):
                pass

    def lasting_pids(self) -> list[int] | None:
        """The pids of the processes that live through every round (None: processes
        start and end within a round, so their CPU time cannot be read around it)."""
        return [process.pid for process in self.processes] + self.pids

    def close(self, failed: bool = False) -> None:
        """Wait for the processes to end (they end after their rounds); kill them if
        the fixture ``failed`` or they do not end in time."""
        deadline = time.monotonic() + (1.0 if failed else TIMEOUT)
        for process in self.processes:
            process.join(max(0.1, deadline - time.monotonic()))
        if failed:
            self.kill_grandchildren()
        for process in self.processes:
            if process.is_alive():
                process.terminate()
                process.join(10)


class Pattern(Fixture):
    """Producers and consumers, each the parent, a child or a grandchild."""

    def __init__(self, library: str, kind: str, producers: int, consumers: int, items: int,
                 rounds: int, parent: str = "", grandchildren: bool = False) -> None:
        super().__init__(library, kind)
        self.parent = parent  # "producer", "consumer" or "" (every producer and consumer a child)
        self.total = items
        stops = max(producers, consumers)
        puts = list(zip(shares(items, producers), shares(stops, producers)))
        takes = shares(stops, consumers)
        self.mine = puts.pop() if parent == "producer" else takes.pop() if parent == "consumer" else None
        self.child_producers, self.child_consumers = len(puts), len(takes)
        self.barrier = self.ctx.Barrier(len(puts) + len(takes) + 1)
        common = (self.barrier, self.reports, rounds)
        if grandchildren:
            self.start(middle, library, "producer", self.items, puts, common)
            self.start(middle, library, "consumer", self.items, [(n, self.joinable) for n in takes], common)
        else:
            for count, stop in puts:
                self.start(producer, self.items, count, stop, *common)
            for stop in takes:
                self.start(consumer, self.items, stop, self.joinable, *common)
        self.barrier.wait(TIMEOUT)  # every process is running
        while grandchildren and len(self.pids) < len(puts) + len(takes):
            self.report()  # (each middle says its grandchildren's pids)

    def run(self) -> tuple[float, int]:
        self.barrier.wait(TIMEOUT)
        released = time.monotonic()
        began = [released] if self.parent else []  # when each process of the round began its work
        got = 0
        if self.parent == "producer":
            put_items(self.items, *self.mine)
        elif self.parent == "consumer":
            got = take_items(self.items, self.mine, self.joinable)
        puts, takes = self.child_producers, self.child_consumers
        while puts if self.joinable else (puts or takes):
            what, count, when = self.report()
            if what == "put":
                puts -= 1
            elif what == "taken":
                takes, got = takes - 1, got + count
            if when is not None:
                began.append(when)
        if self.joinable:
            joined(self.items)
        ended = time.monotonic()
        while takes:
            what, count, when = self.report()
            if what == "taken":
                takes, got = takes - 1, got + count
                began.append(when)
        if got != self.total:
            raise RuntimeError(f"{got} items taken of {self.total} put")
        self.lag = max(began) - min(began)
        return ended - min(began), self.total

    def close(self, failed: bool = False) -> None:
        if not failed:
            self.barrier.wait(TIMEOUT)  # every process is done
        super().close(failed)


class ComeAndGo(Fixture):
    """Producers one after another on one queue, each started, putting its items and
    ending before the next starts; the parent takes. A round times the puts of all."""

    def __init__(self, library: str, kind: str, producers: int, items: int) -> None:
        super().__init__(library, kind)
        self.counts = shares(items, producers)
        self.barrier = self.ctx.Barrier(2)

    def lasting_pids(self) -> None:
        return None

    def run(self) -> tuple[float, int]:
        elapsed, lags = 0.0, []
        for count in self.counts:
            process = self.start(producer, self.items, count, 1, self.barrier, self.reports, 1)
            self.barrier.wait(TIMEOUT)  # running
            self.barrier.wait(TIMEOUT)
            released = time.monotonic()
            got = take_items(self.items, 1, self.joinable)
            if self.joinable:
                joined(self.items)
            ended = time.monotonic()
            began = self.report()[2]
            elapsed += ended - min(released, began)
            lags.append(abs(began - released))
            self.barrier.wait(TIMEOUT)
            process.join(TIMEOUT)
            self.processes.remove(process)
            if got != count or process.exitcode != 0:
                raise RuntimeError(f"a producer put {count} items, {got} taken, exit code {process.exitcode}")
        self.lag = max(lags)
        return elapsed, sum(self.counts)


class PoolWorkers(Fixture):
    """A Pool whose initializer receives the queue; its tasks put into it, the parent takes."""

    def __init__(self, library: str, kind: str, workers: int, items: int) -> None:
        super().__init__(library, kind)
        self.counts = shares(items, 2 * workers)
        self.pool = self.ctx.Pool(workers, initializer=keep_queue, initargs=(self.items,))
        seen: set[int] = set()
        deadline = time.monotonic() + TIMEOUT
        while len(seen) < workers and time.monotonic() < deadline:  # every worker is running
            seen.update(self.pool.map(pool_pid, range(workers), chunksize=1))
        if len(seen) < workers:
            raise RuntimeError(f"only {len(seen)} of {workers} pool workers started")
        self.pids = sorted(seen)

    def run(self) -> tuple[float, int]:
        start = time.perf_counter()
        tasks = self.pool.map_async(pool_put, self.counts, chunksize=1)
        get, total = self.items.get, sum(self.counts)
        for _ in range(total):
            get()
            if self.joinable:
                self.items.task_done()
        if self.joinable:
            joined(self.items)
        elapsed = time.perf_counter() - start
        tasks.get(TIMEOUT)
        return elapsed, total

    def lasting_pids(self) -> list[int]:
        return self.pids  # the workers (killed by terminate())

    def close(self, failed: bool = False) -> None:
        if failed:
            self.pool.terminate()
        else:
            self.pool.close()
        self.pool.join()
