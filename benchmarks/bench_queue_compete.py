"""Items per second through a queue that several consumer jobs compete for.

The parent puts N small items into one queue; C consumer jobs (default 3) get them and
put each into a results queue, which the parent empties. With several consumers no
link is made: every get goes through the queue's owner (the parent's hub), where an
item stays lent to its reader until the reader's receipt comes back. Rows:

- ``mp Queue (spawn)``: ``multiprocessing`` (the reference);
- ``fiberlite Queue``: this checkout;
- ``fiberlite Queue, <DIR>`` with ``--before DIR`` (repeatable): the same, in a process
  that imports fiberlite from another checkout ``DIR`` (an earlier commit, e.g. from
  ``git archive <rev> fiberlite | tar -x -C DIR``), kept running and measured in the
  same rounds.

Run: ``python benchmarks/bench_queue_compete.py [--quick] [--consumers 3] [--before DIR ...] [--json PATH]``
"""
from __future__ import annotations

import multiprocessing
import os
import subprocess
import sys
import time
from typing import Any, Callable

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _common import Report, Stats, finish, interleave, parser, progress, sized  # noqa: E402
from bench_queue_latency import STOP, queue_echo  # noqa: E402  (a consumer: get, put into results)

REFERENCE = "mp Queue (spawn)"
READY = "ready"


def consume(items: Any, results: Any) -> None:
    """Say it is running, then move items from ``items`` to ``results`` until STOP."""
    results.put(READY)
    queue_echo(items, results)


class Consumers:
    """A queue, its consumer jobs and their results queue, set up once for every batch."""

    def __init__(self, ctx: Any, consumers: int) -> None:
        self.items, self.results = ctx.Queue(), ctx.Queue()
        self.jobs = [ctx.Process(target=consume, args=(self.items, self.results)) for _ in range(consumers)]
        for job in self.jobs:
            job.start()
        for _ in self.jobs:  # every consumer runs before anything is measured (a consumer alone
            assert self.results.get(timeout=300) == READY  # would soon read over a link)

    def batch(self, count: int) -> tuple[float, float]:
        """Seconds to move ``count`` items through the consumers and back, and the CPU
        seconds this process (the queues' owner, all its threads) used meanwhile."""
        items, results = self.items, self.results
        cpu = time.process_time()
        start = time.perf_counter()
        for i in range(count):
            items.put(i)
        for _ in range(count):
            results.get()
        return time.perf_counter() - start, time.process_time() - cpu

    def stop(self) -> None:
        for _ in self.jobs:
            self.items.put(STOP)
        for job in self.jobs:
            job.join()


class Elsewhere:
    """:class:`Consumers` of fiberlite in a process of its own that imports it from ``root``."""

    def __init__(self, root: str, consumers: int) -> None:
        env = dict(os.environ, PYTHONPATH=os.pathsep.join([root, os.environ.get("PYTHONPATH", "")]))
        self.process = subprocess.Popen([sys.executable, os.path.abspath(__file__), "--serve",
                                         "--consumers", str(consumers)],
                                        stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, env=env, cwd=root)
        origin = self.process.stdout.readline().strip()  # type: ignore[union-attr]
        if not origin.startswith(os.path.realpath(root)):
            self.stop()
            raise RuntimeError(f"the process for {root} imported fiberlite from {origin}")

    def batch(self, count: int) -> tuple[float, float]:
        self.process.stdin.write(f"{count}\n")  # type: ignore[union-attr]
        self.process.stdin.flush()  # type: ignore[union-attr]
        wall, cpu = self.process.stdout.readline().split()  # type: ignore[union-attr]
        return float(wall), float(cpu)

    def stop(self) -> None:
        self.process.stdin.close()  # type: ignore[union-attr]
        self.process.wait(60)


def serve(consumers: int) -> None:
    """(``--serve``) Say where fiberlite comes from, then time a batch per line of stdin."""
    import fiberlite
    print(os.path.realpath(os.path.dirname(fiberlite.__file__)), flush=True)
    row = Consumers(fiberlite, consumers)
    try:
        for line in sys.stdin:
            print(*row.batch(int(line)), flush=True)
    finally:
        row.stop()


def main() -> None:
    p = parser("Items per second through a queue that several consumer jobs compete for.")
    p.add_argument("--consumers", type=int, default=3, help="consumer jobs (default 3)")
    p.add_argument("--before", metavar="DIR", action="append", default=[],
                   help="also measure fiberlite imported from the checkout DIR (may be repeated)")
    p.add_argument("--serve", action="store_true", help=argparse_hidden())
    args = p.parse_args()
    if args.serve:
        return serve(args.consumers)
    count, rounds, warmup = sized(args, 2000, 200), sized(args, 10, 2), sized(args, 1, 1)
    report = Report("queue_compete", f"items through a queue, {args.consumers} competing consumer jobs",
                    consumers=args.consumers, items=count, rounds=rounds, warmup=warmup)
    section = report.section("item", f"time per item, {args.consumers} consumers", unit="item",
                             reference=REFERENCE,
                             note=f"the parent puts {count} small items, the consumers get each and put it "
                                  f"into a results queue, the parent takes every result; rows interleaved, "
                                  f"{rounds} rounds")
    cpu = report.section("parent_cpu", f"CPU time of the queues' owner per item, {args.consumers} consumers",
                         unit="item", reference=REFERENCE, note="user + system time of the parent, all its threads")
    import fiberlite
    rows: dict[str, Callable[[], Any]] = {
        REFERENCE: lambda: Consumers(multiprocessing.get_context("spawn"), args.consumers),
        "fiberlite Queue": lambda: Consumers(fiberlite, args.consumers),
    }
    for root in args.before:
        rows[f"fiberlite Queue, {root}"] = lambda root=root: Elsewhere(root, args.consumers)
    started: dict[str, Any] = {}
    try:
        for name, make in rows.items():
            progress(f"starting {name} ...")
            started[name] = make()
        samples = interleave({name: (lambda r=row: r.batch(count)) for name, row in started.items()},
                             rounds, warmup, label="batches")
    finally:
        for row in started.values():
            row.stop()
    for name, pairs in samples.items():
        section.add(name, Stats([wall / count for wall, _ in pairs]))
        cpu.add(name, Stats([used / count for _, used in pairs]))
    finish(report, args)


def argparse_hidden() -> str:
    import argparse
    return argparse.SUPPRESS


if __name__ == "__main__":
    main()
