"""Managers: the cost of a proxy's call, next to the standard library's manager.

Each section is one use of a shared object, measured on ``multiprocessing``'s
``SyncManager`` (spawn start method; the reference) and on ``fiberlite.Manager()``,
both running at once and taking turns round by round (``interleave``), so that a stretch
of time when the machine is slower weighs on both alike: 31 rounds of ``--ops`` calls.

- ``Queue``: a child process puts 256-byte strings on a manager's ``Queue`` and the
  parent gets them (time per object passed);
- ``list[5]``: the parent reads an item of a manager's ``list``;
- ``Lock``: the parent acquires and releases a manager's ``Lock``;
- ``Condition``: the parent and a child take turns on a manager's ``Condition``, each
  notifying the other and waiting (time per wait).

These are the manager rows of CPython's ``Doc/includes/mp_benchmarks.py``.

Run: ``python benchmarks/bench_managers.py [--quick] [--ops N] [--only SECTION] [--json PATH]``
"""
from __future__ import annotations

import multiprocessing
import os
import sys
import time
from typing import Any, Callable

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _common import Report, finish, from_samples, interleave, parser, progress, sized  # noqa: E402

MP = "mp spawn Manager"
FIBERLITE = "fiberlite Manager"
ITEM = "0" * 256
STOP = "STOP"


# -- children (module level: the spawn start method imports them by name) ------------------
def queue_feeder(queue: Any, go: Any) -> None:
    """Each round: wait for a count on ``go``, then put that many items and ``STOP``."""
    while True:
        count = go.get()
        if count is None:
            return
        for _ in range(count):
            queue.put(ITEM)
        queue.put(STOP)


def condition_partner(cond: Any, go: Any) -> None:
    """Each round: wait for a count on ``go``, then notify, and that many times wait and
    notify (the parent does the opposite)."""
    while True:
        count = go.get()
        if count is None:
            return
        with cond:
            cond.notify()
            for _ in range(count):
                cond.wait()
                cond.notify()


class Side:
    """One manager, its shared objects and its children."""

    def __init__(self, name: str, manager: Any, process: Callable[..., Any]) -> None:
        self.name = name
        self.manager = manager
        self.queue, self.queue_go = manager.Queue(), manager.Queue()
        self.cond, self.cond_go = manager.Condition(), manager.Queue()
        self.items = manager.list(range(10))
        self.lock = manager.Lock()
        self.children = [process(target=queue_feeder, args=(self.queue, self.queue_go)),
                         process(target=condition_partner, args=(self.cond, self.cond_go))]
        for child in self.children:
            child.start()

    def queue_round(self, ops: int) -> float:
        get = self.queue.get
        start = time.perf_counter()
        self.queue_go.put(ops)
        while get() != STOP:
            pass
        return time.perf_counter() - start

    def list_round(self, ops: int) -> float:
        items = self.items
        start = time.perf_counter()
        for _ in range(ops):
            items[5]
        return time.perf_counter() - start

    def lock_round(self, ops: int) -> float:
        lock = self.lock
        start = time.perf_counter()
        for _ in range(ops):
            lock.acquire()
            lock.release()
        return time.perf_counter() - start

    def condition_round(self, ops: int) -> float:
        cond = self.cond
        turns = max(1, ops // 2)
        with cond:
            self.cond_go.put(turns)
            cond.wait()  # the partner is in
            start = time.perf_counter()
            for _ in range(turns):
                cond.notify()
                cond.wait()
            return time.perf_counter() - start

    def close(self) -> None:
        for go in (self.queue_go, self.cond_go):
            go.put(None)
        for child in self.children:
            child.join(30)
        self.manager.shutdown()


SECTIONS = {  # key: (title, unit, the round that measures it)
    "queue": ("manager Queue: child puts 256-byte strings, parent gets them", "object",
              Side.queue_round),
    "list": ("manager list[5] read by the parent", "read", Side.list_round),
    "lock": ("manager Lock acquire + release", "acquire+release", Side.lock_round),
    "condition": ("manager Condition: wait/notify between two processes", "wait",
                  Side.condition_round),
}


def main() -> None:
    p = parser("Managers: proxy calls vs the standard library's manager.")
    p.add_argument("--ops", type=int, default=None, help="calls per round (default 1,000)")
    p.add_argument("--only", choices=list(SECTIONS), action="append",
                   help="run only these sections (repeatable)")
    args = p.parse_args()
    ops = args.ops or sized(args, 1000, 200)
    rounds = sized(args, 31, 2)
    report = Report("managers", "manager proxy calls vs multiprocessing's manager", ops=ops,
                    rounds=rounds)
    import fiberlite
    spawn = multiprocessing.get_context("spawn")
    progress("starting both managers and their children ...")
    sides = [Side(MP, spawn.Manager(), spawn.Process),
             Side(FIBERLITE, fiberlite.Manager(), fiberlite.Process)]
    try:
        for key, (title, unit, run) in SECTIONS.items():
            if args.only and key not in args.only:
                continue
            section = report.section(key, title, unit=unit, reference=MP,
                                     note=f"{rounds} rounds of {ops:,}, the two managers taking turns")
            samples = interleave({side.name: (lambda side=side: run(side, ops)) for side in sides},
                                 rounds, warmup=1, label=key)
            for side in sides:
                per = ops if key != "condition" else 2 * max(1, ops // 2)
                stats = from_samples(samples[side.name], per=per)
                section.add(side.name, stats, per_second=1 / stats.median)
            section.note += "; per second: " + ", ".join(
                f"{row.name} {row.info['per_second']:,.0f}" for row in section.rows)
    finally:
        for side in sides:
            side.close()
    finish(report, args)


if __name__ == "__main__":
    main()
