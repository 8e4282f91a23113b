"""Soak: queues, pipes, a manager and a pool under steady load while workers,
consumers and whole pool hosts are SIGKILLed at random.

    python benchmarks/soak.py                       # 30 minutes, local backend
    python benchmarks/soak.py --minutes 5 --backend docker
    python benchmarks/soak.py --seconds 20          # the short mode the suite runs

Every item and task carries a sequence number; at the end each load counts what it
sent, what came back, what never came back (lost) and what came back more than once
(duplicated). Prints those counts, the kills survived, and the master's memory (RSS)
at the start, after warm-up and at the end. Targets: 0 lost (the queue: at most one per killed consumer), 0 duplicated, memory
growing < 5% from after warm-up to the end.

The loads, each on a thread of the master:

- pool: ``imap_unordered`` over numbered tasks on a pool whose workers are forked in
  host jobs (``workers_per_job=2``); the killer SIGKILLs workers and whole hosts.
- queue: consumer jobs move numbered items from one ``Queue`` to a results queue; the
  killer SIGKILLs consumers (a new one replaces each). An item a consumer had taken
  from the queue and not yet passed on when it died is lost, as with the standard
  library: at most one per killed consumer (``lost <= kills`` is this load's target).
- pipe: an echo job sends back every numbered message it receives on a ``Pipe``.
- manager: a job appends numbered batches to a managed list; the master checks each.
"""
from __future__ import annotations

import argparse
import collections
import json
import os
import random
import sys
import threading
import time
from typing import Any, Callable

import psutil

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import fiberlite  # noqa: E402
# the loads start their first objects on four threads at once; pynng imported for the
# first time by several threads at once can fail with a circular ImportError
import pynng  # noqa: E402,F401

STOP = None          # sent to a consumer or echo job: finish
DRAIN_SECONDS = 60   # how long the end may take to collect what is in flight


# -- what the jobs run ------------------------------------------------------------------------
def square(n: int) -> tuple[int, int]:
    time.sleep(0.002)
    return n, n * n


def consume(items, results) -> None:
    while True:
        n = items.get()
        if n is STOP:
            return
        results.put(n)


def echo(conn) -> None:
    while True:
        n = conn.recv()
        if n is STOP:
            return
        conn.send(n)


def append_batches(shared, orders, done) -> None:
    while True:
        batch = orders.get()
        if batch is STOP:
            return
        for n in batch:
            shared.append(n)
        done.put(batch[-1])


# -- counting ---------------------------------------------------------------------------------
class Tally:
    """Numbered things sent and received by one load; only the numbers still out are
    kept, so that the soak's own bookkeeping does not grow with the run."""

    def __init__(self, name: str) -> None:
        self.name = name
        self.sent = 0
        self.received = 0
        self.duplicated = 0   # received again, or never sent
        self.out: set[int] = set()
        self.killed = 0
        self.error: str | None = None

    def send(self, count: int) -> range:
        """The numbers of the next ``count`` things sent."""
        numbers = range(self.sent, self.sent + count)
        self.out.update(numbers)
        self.sent += count
        return numbers

    def receive(self, n: int) -> None:
        self.received += 1
        try:
            self.out.remove(n)
        except KeyError:
            self.duplicated += 1

    def row(self) -> dict[str, Any]:
        return {"load": self.name, "sent": self.sent, "received": self.received, "lost": len(self.out),
                "duplicated": self.duplicated, "kills": self.killed, "error": self.error}


class Load(threading.Thread):
    """One load: ``step()`` until told to stop, then ``finish()``; errors are kept."""

    def __init__(self, tally: Tally, ctx, stop: threading.Event) -> None:
        super().__init__(name=f"soak-{tally.name}", daemon=True)
        self.tally, self.ctx, self.stop = tally, ctx, stop
        self.lock = threading.Lock()
        self.running = threading.Event()  # set once the first step is done (or it failed)

    def run(self) -> None:
        try:
            self.start_load()
            while not self.stop.is_set():
                self.step()
                self.running.set()
            self.finish()
        except BaseException as exc:  # reported in the table, not hidden
            self.tally.error = f"{type(exc).__name__}: {exc}"
        finally:
            self.running.set()

    def start_load(self) -> None: ...

    def step(self) -> None: ...

    def finish(self) -> None: ...

    def kill_one(self, rng: random.Random) -> str | None:
        """SIGKILL one of this load's jobs; what was killed (None: nothing to kill)."""
        return None


def sigkill(process) -> bool:
    """SIGKILL a job (a container or pod through its backend); False if already gone."""
    if not process.is_alive():
        return False
    process.kill()
    return True


class PoolLoad(Load):
    BATCH = 400

    def start_load(self) -> None:
        self.pool = self.ctx.Pool(4)

    def step(self) -> None:
        for n, sq in self.pool.imap_unordered(square, self.tally.send(self.BATCH), 4):
            assert sq == n * n, f"task {n} returned {sq}"
            self.tally.receive(n)

    def finish(self) -> None:
        self.pool.close()
        self.pool.join()

    def kill_one(self, rng: random.Random) -> str | None:
        core = self.pool._core
        if rng.random() < 0.25 and core.procs:  # a whole host and every worker in it
            host = rng.choice(list(core.procs.values()))
            return "pool host" if sigkill(host) else None
        workers = [w for host in core.procs.values() for w in forked_workers(host)]
        if not workers:
            return None
        try:
            rng.choice(workers).kill()
        except psutil.NoSuchProcess:
            return None
        return "pool worker"


def forked_workers(host) -> list[psutil.Process]:
    """The workers forked in a pool host job, seen from this machine: the processes
    below the job's own (a container's too) that have no children of their own."""
    try:
        below = psutil.Process(host.pid).children(recursive=True) if host.pid else []
        return [p for p in below if not p.children()]
    except psutil.NoSuchProcess:
        return []


class QueueLoad(Load):
    CONSUMERS = 3
    BATCH = 200

    def start_load(self) -> None:
        self.items, self.results = self.ctx.Queue(), self.ctx.Queue()
        self.consumers = [self._consumer() for _ in range(self.CONSUMERS)]
        self.given_up: set[int] = set()  # not back by the end of their step (may come later)

    def _consumer(self):
        p = self.ctx.Process(target=consume, args=(self.items, self.results), daemon=True)
        p.start()
        return p

    def step(self) -> None:
        for n in self.tally.send(self.BATCH):
            self.items.put(n)
        self._collect(deadline=time.monotonic() + 2)

    def _collect(self, deadline: float) -> None:
        """Take results until every item but those given up on is back, or ``deadline``."""
        out = self.tally.out
        while not out <= self.given_up and time.monotonic() < deadline:
            try:
                n = self.results.get(timeout=max(0.05, min(1.0, deadline - time.monotonic())))
            except Exception:  # queue.Empty: a killed consumer's items may never come
                self._replace_dead()
                continue
            self.tally.receive(n)
        self.given_up = set(out)

    def _replace_dead(self) -> None:
        with self.lock:
            self.consumers = [p if p.is_alive() else self._consumer() for p in self.consumers]

    def finish(self) -> None:
        self._replace_dead()
        self.given_up = set()
        self._collect(time.monotonic() + 5)
        for _ in self.consumers:
            self.items.put(STOP)
        for p in self.consumers:
            p.join(DRAIN_SECONDS)

    def kill_one(self, rng: random.Random) -> str | None:
        with self.lock:
            victim = rng.choice(self.consumers)
            if not sigkill(victim):
                return None
            victim.join(10)
            self.consumers[self.consumers.index(victim)] = self._consumer()
        return "queue consumer"


class PipeLoad(Load):
    BATCH = 200

    def start_load(self) -> None:
        self.conn, child = self.ctx.Pipe()
        self.job = self.ctx.Process(target=echo, args=(child,), daemon=True)
        self.job.start()

    def step(self) -> None:
        for n in self.tally.send(self.BATCH):
            self.conn.send(n)
        for _ in range(self.BATCH):
            if not self.conn.poll(30):
                raise TimeoutError("the echo job answered nothing for 30 s")
            self.tally.receive(self.conn.recv())

    def finish(self) -> None:
        self.conn.send(STOP)
        self.job.join(DRAIN_SECONDS)


class ManagerLoad(Load):
    BATCH = 50

    def start_load(self) -> None:
        self.manager = self.ctx.Manager()
        self.shared = self.manager.list()
        self.orders, self.done = self.ctx.Queue(), self.ctx.Queue()
        self.job = self.ctx.Process(target=append_batches, args=(self.shared, self.orders, self.done),
                                    daemon=True)
        self.job.start()

    def step(self) -> None:
        batch = list(self.tally.send(self.BATCH))
        self.orders.put(batch)
        assert self.done.get(timeout=30) == batch[-1]
        for n in self.shared[:]:
            self.tally.receive(n)
        del self.shared[:]  # the list stays small however long the run

    def finish(self) -> None:
        self.orders.put(STOP)
        self.job.join(DRAIN_SECONDS)
        self.manager.shutdown()


def killer(loads: list[Load], stop: threading.Event, rng: random.Random, every: float,
           survived: collections.Counter) -> None:
    """SIGKILL a random job of a random load every ``every`` seconds on average."""
    killable = [load for load in loads if type(load).kill_one is not Load.kill_one]
    if not killable:
        return
    while not stop.wait(rng.expovariate(1 / every)):
        load = rng.choice(killable)
        try:
            what = load.kill_one(rng)
        except Exception:  # the load is starting or ending: nothing to kill right now
            continue
        if what:
            load.tally.killed += 1
            survived[what] += 1


def rss() -> int:
    return psutil.Process().memory_info().rss


LOADS = {"pool": ("pool tasks", lambda: PoolLoad), "queue": ("queue items", lambda: QueueLoad),
         "pipe": ("pipe messages", lambda: PipeLoad), "manager": ("manager list items", lambda: ManagerLoad)}


def soak(seconds: float, backend: str, kill_every: float, seed: int, only: list[str] | None = None,
         report: Callable[[str], None] = print) -> dict[str, Any]:
    rss_start = rss()
    fiberlite.init(workers_per_job=2)
    ctx = fiberlite.get_context(backend)
    stop = threading.Event()
    loads: list[Load] = [LOADS[name][1]()(Tally(LOADS[name][0]), ctx, stop) for name in only or LOADS]
    survived: collections.Counter[str] = collections.Counter()
    started = time.monotonic()
    for load in loads:
        load.start()
    for load in loads:  # every job started and every load through once: warm
        load.running.wait(max(1.0, started + seconds - time.monotonic()))
    time.sleep(max(0.0, min(60.0, seconds / 5) - (time.monotonic() - started)))
    rss_warm = rss()
    kills = threading.Thread(target=killer, args=(loads, stop, random.Random(seed), kill_every, survived),
                             daemon=True)
    kills.start()
    time.sleep(max(0.0, started + seconds - time.monotonic()))
    stop.set()
    kills.join()
    for load in loads:
        load.join(DRAIN_SECONDS * 3)
    rss_end = rss()
    result = {"backend": backend, "seconds": round(time.monotonic() - started, 1),
              "loads": [load.tally.row() for load in loads], "kills": dict(survived),
              "rss_start": rss_start, "rss_after_warm_up": rss_warm, "rss_end": rss_end,
              "rss_growth_percent": round(100 * (rss_end - rss_warm) / rss_warm, 2)}
    report(table(result))
    return result


def table(result: dict[str, Any]) -> str:
    lines = [f"soak on {result['backend']}: {result['seconds']} s, "
             f"{os.cpu_count()} cores (load from other users not controlled)",
             f"{'load':<20}{'sent':>10}{'received':>10}{'lost':>8}{'duplicated':>12}{'kills':>8}"]
    for row in result["loads"]:
        lines.append(f"{row['load']:<20}{row['sent']:>10}{row['received']:>10}{row['lost']:>8}"
                     f"{row['duplicated']:>12}{row['kills']:>8}" + (f"  ERROR {row['error']}" if row["error"] else ""))
    lines.append("kills survived: " + (", ".join(f"{n} {what}" for what, n in sorted(result["kills"].items()))
                                       or "none"))
    lines.append(f"master RSS at the start {result['rss_start'] / 2**20:.1f} MiB, "
                 f"after warm-up {result['rss_after_warm_up'] / 2**20:.1f} MiB, at the end "
                 f"{result['rss_end'] / 2**20:.1f} MiB ({result['rss_growth_percent']:+.1f}%)")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--minutes", type=float, default=30.0)
    parser.add_argument("--seconds", type=float, help="the run's length in seconds (overrides --minutes)")
    parser.add_argument("--backend", default="local", help="local or docker (default: local)")
    parser.add_argument("--kill-every", type=float, default=2.0, help="mean seconds between kills")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--loads", default=",".join(LOADS),
                        help=f"the loads to run, comma-separated (default: {','.join(LOADS)})")
    parser.add_argument("--json", help="also write the figures to this file")
    args = parser.parse_args()
    seconds = args.seconds if args.seconds is not None else args.minutes * 60
    if seconds <= 0:
        parser.error("the run's length must be positive")
    only = [name.strip() for name in args.loads.split(",") if name.strip()]
    unknown = sorted(set(only) - set(LOADS))
    if unknown or not only:
        parser.error(f"unknown load(s) {', '.join(unknown) or '(none given)'}: choose from {', '.join(LOADS)}")
    result = soak(seconds, args.backend, args.kill_every, args.seed, only)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(result, f, indent=1)


if __name__ == "__main__":
    main()
