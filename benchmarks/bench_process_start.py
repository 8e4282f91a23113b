"""Process start latency: fiberlite jobs against ``multiprocessing`` (spawn).

Sections:

- ``first message``: time from ``Process.start()`` until the parent receives the
  child's first message on a queue (what a user waits for before work begins);
- ``start+join x N``: N processes started one after the other, then all joined;
- ``one start+wait``: one process started and joined, next to a bare
  ``subprocess.Popen([python, "-c", ...])`` for the floor the interpreter sets.

Ratios are against ``multiprocessing`` with the spawn start method.

Run: ``python benchmarks/bench_process_start.py [--quick] [--json PATH]``
"""
from __future__ import annotations

import multiprocessing
import os
import subprocess
import sys
import time
from typing import Any, Callable

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _common import Report, finish, from_samples, interleave, optional_import, parser, sized  # noqa: E402

REFERENCE = "mp spawn"


# -- children (module level: the spawn start method imports them by name) ------------------
def say_hello(queue: Any) -> None:
    queue.put("hello")


def noop() -> None:
    pass


# -- measurements: each call times one sample, in seconds --------------------------------------
def first_message(ctx: Any) -> Callable[[], float]:
    """From start() to the child's first message on a queue made once for ``ctx``."""
    queue = ctx.Queue()

    def sample() -> float:
        child = ctx.Process(target=say_hello, args=(queue,))
        start = time.perf_counter()
        child.start()
        queue.get()
        elapsed = time.perf_counter() - start
        child.join()
        return elapsed
    return sample


def start_join_many(ctx: Any, count: int) -> Callable[[], float]:
    def sample() -> float:
        start = time.perf_counter()
        children = [ctx.Process(target=noop) for _ in range(count)]
        for child in children:
            child.start()
        for child in children:
            child.join()
            if child.exitcode != 0:
                raise RuntimeError(f"{child} exited with {child.exitcode}")
        return time.perf_counter() - start
    return sample


def start_join_one(ctx: Any) -> Callable[[], float]:
    def sample() -> float:
        start = time.perf_counter()
        child = ctx.Process(target=noop)
        child.start()
        child.join()
        return time.perf_counter() - start
    return sample


def popen(code: str) -> Callable[[], float]:
    def sample() -> float:
        start = time.perf_counter()
        subprocess.Popen([sys.executable, "-c", code]).wait()
        return time.perf_counter() - start
    return sample


def main() -> None:
    p = parser("Process start latency, fiberlite against multiprocessing (spawn).")
    p.add_argument("--count", type=int, default=None, help="processes in the start+join section (default 20)")
    args = p.parse_args()
    count = args.count or sized(args, 20, 4)
    repeats = sized(args, 15, 3)
    many_repeats = sized(args, 3, 1)
    warmup = 1
    report = Report("process_start", "time to start processes, fiberlite jobs vs multiprocessing spawn",
                    count=count, repeats=repeats, many_repeats=many_repeats, warmup=warmup)

    spawn = multiprocessing.get_context("spawn")
    import fiberlite
    contexts: list[tuple[str, Any]] = [("mp spawn", spawn), ("fiberlite", fiberlite)]
    loky = optional_import("loky.backend")
    if loky is not None:
        contexts.append(("loky", loky.get_context("loky")))

    note = "rows interleaved: each repeat times every row once, the order turning"
    first = report.section("first_message", "start() to first message on a queue", unit="process",
                           reference=REFERENCE, note=note)
    many = report.section("start_join_many", f"start {count} processes, then join them all",
                          unit=f"{count} processes", reference=REFERENCE, note=note)
    one = report.section("start_join_one", "start one process and join it", unit="process",
                         reference=REFERENCE,
                         note=note + "; Popen rows: a bare interpreter, no multiprocessing machinery")
    one_rows = {name: start_join_one(ctx) for name, ctx in contexts}
    one_rows['Popen python -c "import pynng"'] = popen("import pynng")
    one_rows['Popen python -c "pass"'] = popen("pass")
    runs: list[tuple[Any, dict[str, Callable[[], float]], int]] = [
        (first, {name: first_message(ctx) for name, ctx in contexts}, repeats),
        (many, {name: start_join_many(ctx, count) for name, ctx in contexts}, many_repeats),
        (one, one_rows, repeats),
    ]
    for section, rows, rounds in runs:
        for name, samples in interleave(rows, rounds, warmup, label=section.key).items():
            section.add(name, from_samples(samples))
    finish(report, args)


if __name__ == "__main__":
    main()
