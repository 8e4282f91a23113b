"""Items per second through one queue on one machine, in the patterns scripts use:
``multiprocessing`` (spawn) and fiberlite side by side in one run.

For each of ``Queue``, ``SimpleQueue`` and ``JoinableQueue`` (whose consumers call
``task_done()`` for each item, and whose parent's ``join()`` ends the round), small items
(ints) go through one queue:

- N producer children -> the parent, N = 1, 2, 4, 8;
- the parent -> N consumer children, N = 1, 2, 4, 8;
- N producers -> N consumers, every one a child, N = 2, 4, 8;
- producers that come and go: 4 children one after another, each started once the one
  before has ended, putting its share and ending; the parent takes;
- 2 producers -> 2 consumers, every one a grandchild (two children start them);
- Pool workers: a ``Pool(4)`` whose initializer receives the queue, its tasks put into it.

Starting processes is never timed: they start, wait together at a ``Barrier`` (the Pool
runs a task on every worker first), and a round times from the moment the first process
of the round began its work after the barrier's release (the parent, when it puts or
takes; each child stamps its start on the machine's monotonic clock) until the last item
was taken (for a ``JoinableQueue``, until ``join()`` returns); each round checks that no
item was lost. (The parent's leaving the barrier is no common start: the stdlib's
barrier lets the parent leave only once every party it woke has answered, fiberlite's at
once.) For each row both libraries are set up, then take turns
for ``--rounds`` rounds (the order turning); a row's figure is its best round.

Beside items/s, the CPU time (user + system, every thread) that the parent and every
process of the pattern used in a round, per item: on a machine others load, a steadier
figure than the wall clock (read from each process's CPU-time clock, so Linux only;
not for the producers that come and go, which end within the round).

Run: ``python benchmarks/bench_patterns.py [--quick] [--items N] [--rounds R]
[--kinds Queue,...] [--json PATH]``
"""
from __future__ import annotations

import os
import sys
import time
from dataclasses import dataclass
from typing import Any, Callable

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _common import Report, Stats, finish, parser, progress, sized  # noqa: E402
from _pattern_rows import (FIBERLITE, KINDS, MP, ComeAndGo, Fixture, Pattern, PoolWorkers,  # noqa: E402
                           TIMEOUT)
from _primitive_rows import one_line  # noqa: E402

LIBRARIES = (MP, FIBERLITE)


@dataclass
class Case:
    """One pattern: its key, its title and how a library's fixture of it is made from
    ``(library, kind, items, rounds)``."""

    key: str
    title: str
    make: Callable[[str, str, int, int], Fixture]


def plural(n: int, word: str) -> str:
    return f"{n} {word}{'' if n == 1 else 's'}"


def cases(sizes: tuple[int, ...], pairs: tuple[int, ...], goers: int, workers: int) -> list[Case]:
    out = [Case(f"{n}_to_parent", f"{plural(n, 'producer')} -> parent",
                lambda lib, kind, items, rounds, n=n: Pattern(lib, kind, n, 1, items, rounds, parent="consumer"))
           for n in sizes]
    out += [Case(f"parent_to_{n}", f"parent -> {plural(n, 'consumer')}",
                 lambda lib, kind, items, rounds, n=n: Pattern(lib, kind, 1, n, items, rounds, parent="producer"))
            for n in sizes]
    out += [Case(f"{n}_to_{n}", f"{n} -> {n}, all children",
                 lambda lib, kind, items, rounds, n=n: Pattern(lib, kind, n, n, items, rounds))
            for n in pairs]
    out.append(Case("come_and_go", f"{goers} producers one after another -> parent",
                    lambda lib, kind, items, rounds: ComeAndGo(lib, kind, goers, items)))
    out.append(Case("grandchildren", "2 -> 2, all grandchildren",
                    lambda lib, kind, items, rounds: Pattern(lib, kind, 2, 2, items, rounds, grandchildren=True)))
    out.append(Case("pool", f"Pool({workers}) workers (initializer) -> parent",
                    lambda lib, kind, items, rounds: PoolWorkers(lib, kind, workers, items)))
    return out


# -- measuring ----------------------------------------------------------------------------------
# seconds per item, CPU seconds per item, start lag in seconds (None: unknown)
Sample = tuple[float, float | None, float | None]


class CpuClock:
    """CPU seconds used so far by this process and by ``pids``, all their threads (those
    that ended too), to the nanosecond: each process's CPU-time clock (Linux), which
    any process may read; ``read()`` is None where it cannot be read."""

    def __init__(self, pids: list[int] | None) -> None:
        self.clocks = None if pids is None else [os.getpid(), *pids]

    def read(self) -> float | None:
        if self.clocks is None:
            return None
        try:  # the clock of process ``pid`` has the id (~pid << 3) | 2 (CPUCLOCK_SCHED)
            return sum(time.clock_gettime((~pid << 3) | 2) for pid in self.clocks)
        except (OSError, AttributeError, OverflowError):
            return None


def measure(case: Case, kind: str, items: int, rounds: int) -> dict[str, list[Sample] | str]:
    """Each library's seconds and CPU seconds (of every process) per item in each round
    of one row, or its one-line error."""
    progress(f"{kind}: {case.title} ...")
    fixtures: dict[str, Fixture] = {}
    clocks: dict[str, CpuClock] = {}
    cells: dict[str, list[Sample] | str] = {}
    for library in LIBRARIES:
        try:
            fixtures[library] = case.make(library, kind, items, rounds)
            clocks[library] = CpuClock(fixtures[library].lasting_pids())
            cells[library] = []
        except Exception as exc:
            cells[library] = one_line(exc)
    failed: set[str] = set()
    for round_ in range(rounds):
        shift = round_ % len(LIBRARIES)
        for library in LIBRARIES[shift:] + LIBRARIES[:shift]:
            if library not in fixtures or library in failed:
                continue
            try:
                before = clocks[library].read()
                seconds, count = fixtures[library].run()
                after = clocks[library].read()
                cpu = None if before is None or after is None else (after - before) / count
                cells[library].append((seconds / count, cpu, fixtures[library].lag))  # type: ignore[union-attr]
            except Exception as exc:
                cells[library] = one_line(exc)
                failed.add(library)
    for library, fixture in fixtures.items():
        try:
            fixture.close(failed=library in failed)
        except Exception as exc:
            progress(f"  {library}: {kind} {case.key} did not close cleanly: {one_line(exc)}")
    return cells


# -- the table ------------------------------------------------------------------------------
def median(values: list[float]) -> float | None:
    """The median of ``values`` (the higher middle one), None when empty."""
    return sorted(values)[len(values) // 2] if values else None


def rate(seconds: float) -> str:
    items = 1 / seconds
    return f"{items / 1000:,.1f}k/s" if items >= 10_000 else f"{items:,.0f}/s"


class PatternsReport(Report):
    """One section per row (seconds per item, as every script's JSON has them); the
    table shows items/s and the ratio fiberlite / stdlib of items/s."""

    def __init__(self, *args: Any, **params: Any) -> None:
        super().__init__(*args, **params)
        self.lines: list[list[str]] = []

    def record(self, kind: str, case: Case, cells: dict[str, list[Sample] | str]) -> None:
        section = self.section(f"{kind}.{case.key}", f"{kind}: {case.title}", unit="item", reference=MP,
                               stat="best", note="seconds per item; the table shows items/s, and their ratio "
                                                 "(this one inverted); info: CPU seconds per item of every "
                                                 "process, the least of the rounds; start lag: how long after the "
                                                 "first process of a round began its work the last one did (the "
                                                 "barrier's release, not the queue), the median of the rounds")
        rates, cpus, lags = [], [], []
        for library in LIBRARIES:
            cell = cells[library]
            if isinstance(cell, str) or not cell:
                section.skip(library, cell or "not measured")  # type: ignore[arg-type]
                rates.append(f"fails: {cell}")
                cpus.append(None)
                lags.append("-")
                continue
            wall = min(seconds for seconds, _, _ in cell)
            cpu = None if None in (c for _, c, _ in cell) else min(c for _, c, _ in cell)  # type: ignore[type-var]
            lag = median([lag for _, _, lag in cell if lag is not None])
            section.add(library, Stats([seconds for seconds, _, _ in cell]), items_per_second=1 / wall,
                        cpu_seconds_per_item=cpu, start_lag_seconds=lag)
            rates.append(rate(wall))
            cpus.append(cpu)
            lags.append("-" if lag is None else f"{1000 * lag:.1f}")
        mp, fl = cells[MP], cells[FIBERLITE]
        ok = not isinstance(mp, str) and not isinstance(fl, str) and mp and fl
        ratio = f"{min(x for x, _, _ in mp) / min(x for x, _, _ in fl):.2f}x" if ok else "-"  # type: ignore[misc]
        cpu_cells = [f"{c * 1e6:.1f}" if c is not None else "-" for c in cpus]
        cpu_ratio = f"{cpus[0] / cpus[1]:.2f}x" if None not in cpus and cpus[1] else "-"  # type: ignore[operator]
        self.lines.append([kind, case.title, *rates, ratio, *cpu_cells, cpu_ratio, "/".join(lags)])

    def table(self) -> str:
        rows = [["queue", "pattern", f"{MP} items/s", f"{FIBERLITE} items/s", "ratio",
                 f"{MP} CPU us/item", f"{FIBERLITE} CPU us/item", "CPU ratio",
                 "start lag ms"], *self.lines]
        widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
        out = ["One queue on one machine: items/s with each library, in one run"]
        for i, row in enumerate(rows):
            out.append("  " + " | ".join([row[0].ljust(widths[0]), row[1].ljust(widths[1])]
                                         + [c.rjust(w) for c, w in zip(row[2:], widths[2:])]))
            if i == 0:
                out.append("  " + "-+-".join("-" * w for w in widths))
        out.append(f"  note: {self.params['items']} small items (ints) a round; best of {self.params['rounds']} "
                   "rounds per row and library, the libraries taking turns; ratio = fiberlite / stdlib of "
                   "items/s (higher is better). CPU: user + system seconds of the parent (all its threads) "
                   "and of every process of the pattern during a round, per item, the least of the rounds "
                   "(less depends on the machine's load); CPU ratio = stdlib / fiberlite (higher is better); "
                   "'-' where processes come and go within the round. Start lag: stdlib/fiberlite, how long "
                   "after the first process of a round began its work the last one did (the median of the "
                   "rounds; the barrier's release, counted in the round's time, not the queue's)")
        return "\n".join(out)


def main() -> None:
    p = parser("Items/s through one queue in the patterns scripts use: multiprocessing (spawn) and fiberlite.")
    p.add_argument("--items", type=int, help="items a round (20000; --quick 1000)")
    p.add_argument("--rounds", type=int, help="rounds per row and library; a row's figure is its best (2; --quick 1)")
    p.add_argument("--kinds", help="only these queues, comma-separated: " + ",".join(KINDS))
    p.add_argument("--rows", help="only the rows whose key contains one of these, comma-separated "
                                  "(e.g. to_parent,pool)")
    args = p.parse_args()
    items = args.items or sized(args, 20000, 1000)
    rounds = args.rounds or sized(args, 2, 1)
    kinds = args.kinds.split(",") if args.kinds else list(KINDS)
    unknown = [k for k in kinds if k not in KINDS]
    if unknown:
        p.error(f"unknown queues {', '.join(unknown)}; they are {', '.join(KINDS)}")
    rows = sized(args, cases((1, 2, 4, 8), (2, 4, 8), goers=4, workers=4),
                 cases((2,), (2,), goers=2, workers=2))
    if args.rows:
        wanted = args.rows.split(",")
        rows = [case for case in rows if any(w in case.key for w in wanted)]
    report = PatternsReport("patterns", "items/s through one queue on one machine, multiprocessing spawn "
                                        "and fiberlite", items=items, rounds=rounds, kinds=kinds,
                            rows=[case.key for case in rows], timeout=TIMEOUT)
    for kind in kinds:
        for case in rows:
            report.record(kind, case, measure(case, kind, items, rounds))
    finish(report, args)


if __name__ == "__main__":
    main()
