"""Pool at scale: many workers on the local backend, fiberlite against ``multiprocessing``.

Sections (``multiprocessing.get_context("spawn").Pool`` is the reference row of each):

- ``start``: seconds from ``Pool(n)`` until every worker has run one task (a task that
  returns its pid; the distinct pids are counted), at 100 and 1,000 workers.
- ``map``: ``pool.map`` of 50,000 ``time.sleep(0.005)`` tasks, ``chunksize=1`` and the
  default chunksize, at 100 and 1,000 workers; the note gives the ideal wall time.
- ``cpu``: CPU seconds (user + system, psutil) per task over a ``chunksize=1`` map of
  20,000 such tasks at 200 and 1,000 workers: the master's, and that of all its
  descendants (the workers, at any depth) together.
- ``memory``: unique memory (USS) per worker, and the master's RSS, at 200 workers after
  the warm-up; each sample in a fresh master process.
- ``simulated``: the master's CPU per task in its relay and dispatcher, driven by 10, 1,000
  and 10,000 simulated hosted workers (``_simulate.py``), against 10.
- ``liveness``: what watching connections for silence costs the master, with 1,000 idle
  connections and over a map on 1,000 workers (``_liveness.py``).

One pool is alive at a time: a pool of each kind is started, warmed, measured, and
terminated and joined, whatever happens; a row that fails is reported as skipped.

Run: ``python benchmarks/bench_scale.py [--quick] [--json PATH] [--workers 100,1000] ...``
"""
from __future__ import annotations

import argparse
import json
import math
import os
import subprocess
import sys
import time
from typing import Any, Callable

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _common import (MP, Report, Runner, Section, finish, format_bytes, format_time,  # noqa: E402
                     from_samples, parser, progress, sized, sleep_task)
from _scale_pools import (RUNNERS, WARM_TIMEOUT, Failed, first_pools, interleaved,  # noqa: E402
                          one_at_a_time, raise_open_file_limit, repeated, run_size, warmed)

TASK_SECONDS = 0.005

# Worker counts and task counts of each section: (full run, --quick).
WORKERS = {
    "start": ([100, 1000], [20, 50]),
    "map": ([100, 1000], [20, 50]),
    "cpu": ([200, 1000], [20, 50]),
    "memory": ([200], [20]),
    "simulated": ([10, 1000, 10_000], [10, 1000]),
    "liveness": ([1000], [20]),
}
TASKS = {
    "map": (50_000, 2_000),
    "cpu": (20_000, 2_000),
    "simulated": (50_000, 5_000),
    "liveness": (20_000, 1_000),
}


# -- (1) pool start --------------------------------------------------------------------------
def start_sample(make: Callable[[int], Runner], workers: int) -> Callable[[], dict[str, float]]:
    """Seconds from ``make(workers)`` until every worker has run a task (closing not timed)."""
    def sample() -> dict[str, float]:
        started = time.perf_counter()
        with warmed(make, workers):
            return {"start": time.perf_counter() - started}
    return sample


def bench_start(report: Report, args: argparse.Namespace) -> None:
    rounds = repeats(args)
    for workers in workers_for(args, "start"):
        section = report.section(
            f"start_{workers}", f"Pool({workers}) until every worker has run a task",
            unit="pool", reference=MP,
            note=f"a task returning its pid, until {workers} distinct pids; terminate and "
                 f"join not timed; samples: {rounds}, rows interleaved")
        run_size({"start": section}, workers, "start",
                 lambda: interleaved({name: start_sample(make, workers) for name, make in RUNNERS.items()},
                                     rounds, label=f"start {workers}"))


# -- (2) map -----------------------------------------------------------------------------------
CHUNKSIZES = {"1": 1, "default": None}


def map_sample(tasks: int) -> Callable[[Runner], dict[str, float]]:
    """Wall seconds of a map of ``tasks`` sleeps with each chunksize, one after the other."""
    items = [TASK_SECONDS] * tasks

    def sample(runner: Runner) -> dict[str, float]:
        return {key: wall(lambda: runner.map(sleep_task, items, chunksize))
                for key, chunksize in CHUNKSIZES.items()}
    return sample


def wall(fn: Callable[[], Any]) -> float:
    """Seconds ``fn()`` takes."""
    started = time.perf_counter()
    fn()
    return time.perf_counter() - started


def bench_map(report: Report, args: argparse.Namespace) -> None:
    tasks, rounds = tasks_for(args, "map"), repeats(args)
    for turn, workers in enumerate(workers_for(args, "map")):
        ideal = math.ceil(tasks / workers) * TASK_SECONDS
        sections = {
            key: report.section(
                f"map_{workers}_{key}", f"map of {tasks:,} x sleep(5 ms), {label}, {workers} workers",
                unit="map call", reference=MP,
                note=f"ideal wall time {format_time(ideal)} ({tasks:,} tasks x 5 ms / {workers} workers, "
                     f"in whole tasks)")
            for key, label in zip(CHUNKSIZES, ("chunksize=1", "default chunksize"))}
        run_size(sections, workers, "map",
                 lambda: one_at_a_time(workers, turn, "map", repeated(rounds, map_sample(tasks))),
                 tasks=tasks, ideal_seconds=ideal)
        for section in sections.values():
            add_to_note(section, "wall / ideal", [f"{row.name} {section.value(row) / ideal:.2f}"
                                                  for row in section.rows if row.stats])


def add_to_note(section: Section, label: str, parts: list[str]) -> None:
    """``label: part, part, ...`` appended to the section's note (nothing if no parts)."""
    if parts:
        section.note += f"; {label}: " + ", ".join(parts)


# -- (3) CPU per task --------------------------------------------------------------------------
def cpu_seconds(process: Any) -> float:
    times = process.cpu_times()
    return times.user + times.system


def descendants(read: Callable[[Any], float]) -> dict[tuple[int, float], float]:
    """``read(process)`` of every descendant of this process (any depth, psutil), by pid
    and start time; one that ends meanwhile is left out."""
    import psutil
    out = {}
    for process in psutil.Process().children(recursive=True):
        try:
            with process.oneshot():
                out[(process.pid, process.create_time())] = read(process)
        except psutil.Error:
            pass
    return out


def cpu_over(fn: Callable[[], Any]) -> tuple[float, float]:
    """CPU seconds of this process, and of all its descendants together, while ``fn()`` runs.

    A descendant is read before and after; one that started in between counts from
    zero, one that ended in between counts up to the last read (nothing of the call)."""
    import psutil
    master = psutil.Process()
    before = descendants(cpu_seconds)
    master_before = cpu_seconds(master)
    fn()
    master_after = cpu_seconds(master)
    after = descendants(cpu_seconds)
    workers = sum(seconds - before.get(key, 0.0) for key, seconds in after.items())
    return master_after - master_before, workers


def cpu_sample(tasks: int) -> Callable[[Runner], dict[str, float]]:
    """CPU seconds per task of the master and of the workers over a chunksize=1 map."""
    items = [TASK_SECONDS] * tasks

    def sample(runner: Runner) -> dict[str, float]:
        master, workers = cpu_over(lambda: runner.map(sleep_task, items, 1))
        return {"master": master / tasks, "workers": workers / tasks}
    return sample


def bench_cpu(report: Report, args: argparse.Namespace) -> None:
    tasks, rounds = tasks_for(args, "cpu"), repeats(args)
    for turn, workers in enumerate(workers_for(args, "cpu")):
        title = f"map of {tasks:,} x sleep(5 ms), chunksize=1, {workers} workers"
        sections = {
            "master": report.section(
                f"cpu_master_{workers}", f"master CPU per task: {title}", unit="task", reference=MP,
                note="user + system seconds of the master process (all threads, psutil) over the map"),
            "workers": report.section(
                f"cpu_workers_{workers}", f"workers' CPU per task: {title}", unit="task", reference=MP,
                note="user + system seconds of all the master's descendants (any depth, psutil), "
                     "read before and after the map; a process that ended in between counts up "
                     "to the last read"),
        }
        run_size(sections, workers, "cpu",
                 lambda: one_at_a_time(workers, turn, "cpu", repeated(rounds, cpu_sample(tasks))),
                 tasks=tasks)


# -- (4) memory --------------------------------------------------------------------------------
def memory_probe(name: str, workers: int) -> dict[str, float]:
    """In this (fresh) master: a warmed pool's mean USS per worker, the master's RSS, and
    the USS of the master's other descendants (e.g. mp's resource tracker)."""
    import psutil
    with warmed(RUNNERS[name], workers) as (_runner, pids):
        master = psutil.Process()
        rss = master.memory_info().rss
        uss = {pid: value for (pid, _start), value in descendants(unique_memory).items()}
    if not pids <= uss.keys():
        raise RuntimeError("the workers are not processes of this machine (local backend only)")
    return {"uss": sum(uss[pid] for pid in pids) / len(pids), "rss": rss,
            "other_uss": sum(value for pid, value in uss.items() if pid not in pids)}


def unique_memory(process: Any) -> float:
    return process.memory_full_info().uss


def probe_sample(name: str, workers: int) -> Callable[[], dict[str, float]]:
    """One :func:`memory_probe` in a new interpreter running this script."""
    def sample() -> dict[str, float]:
        done = subprocess.run([sys.executable, os.path.abspath(__file__), "--probe", name, str(workers)],
                              capture_output=True, text=True, timeout=WARM_TIMEOUT + 120)
        if done.returncode != 0:
            lines = done.stderr.strip().splitlines() or [f"exit code {done.returncode}"]
            raise RuntimeError(f"memory probe: {lines[-1]}")
        return json.loads(done.stdout.strip().splitlines()[-1])
    return sample


def bench_memory(report: Report, args: argparse.Namespace) -> None:
    rounds = repeats(args)
    for workers in workers_for(args, "memory"):
        sections = {
            "uss": report.section(
                f"memory_uss_{workers}", f"unique memory (USS) per worker, {workers} workers, after warm-up",
                unit="worker", reference=MP, quantity="memory",
                note="psutil memory_full_info().uss, mean over the workers (the pids the warm-up "
                     "tasks returned); each sample in a fresh master"),
            "rss": report.section(
                f"memory_rss_{workers}", f"master RSS with a pool of {workers} workers, after warm-up",
                unit="master process", reference=MP, quantity="memory",
                note="the master (a fresh process per sample) holds only this pool"),
        }
        results = run_size(sections, workers, "memory", lambda: interleaved(
            {name: probe_sample(name, workers) for name in RUNNERS}, rounds, label=f"memory {workers}"))
        add_to_note(sections["uss"], "USS of the other descendants, all together",
                    [f"{name} {format_bytes(from_samples(result['other_uss']).median)}"
                     for name, result in results.items() if not isinstance(result, Failed)])


def bench_simulated(report: Report, args: argparse.Namespace) -> None:
    import _simulate  # imports fiberlite: not at the top, where mp's spawned workers import it too
    counts_ = workers_for(args, "simulated")
    tasks = tasks_for(args, "simulated")
    rows = {f"{workers} workers": workers for workers in counts_}
    section = report.section(
        "simulated", f"master CPU per task with simulated workers, {tasks:,} tasks",
        unit="task", reference=next(iter(rows)),
        note=f"hosted workers ({_simulate.WORKERS_PER_HOST} a host) driving the master's relay "
             "and dispatcher in this process, without sockets (see benchmarks/_simulate.py)")
    samples: dict[str, list[float]] = {name: [] for name in rows}
    for turn in range(repeats(args)):
        for name in (list(rows) if turn % 2 == 0 else list(reversed(rows))):
            progress(f"simulated: {name}, round {turn + 1}")
            samples[name].append(_simulate.master_cpu_per_task(rows[name], tasks))
    for name, values in samples.items():
        section.add(name, from_samples(values))


def bench_liveness(report: Report, args: argparse.Namespace) -> None:
    import _liveness  # imports fiberlite when run, as _simulate does
    _liveness.bench_liveness(report, args, workers_for(args, "liveness"), tasks_for(args, "liveness"),
                             repeats(args))


# -- command line --------------------------------------------------------------------------------
SECTIONS: dict[str, Callable[[Report, argparse.Namespace], None]] = {
    "start": bench_start,
    "map": bench_map,
    "cpu": bench_cpu,
    "memory": bench_memory,
    "simulated": bench_simulated,
    "liveness": bench_liveness,
}
"""The sections, in the order they run; each adds its tables to the report."""


def counts(text: str) -> list[int]:
    """``"100,1000"`` as ``[100, 1000]`` (positive integers)."""
    try:
        values = [int(part) for part in text.split(",") if part.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a comma-separated list of integers: {text!r}") from None
    if not values or min(values) < 1:
        raise argparse.ArgumentTypeError(f"expected positive integers: {text!r}")
    return values


def count(text: str) -> int:
    """One positive integer."""
    values = counts(text)
    if len(values) > 1:
        raise argparse.ArgumentTypeError(f"expected one integer: {text!r}")
    return values[0]


def workers_for(args: argparse.Namespace, section: str) -> list[int]:
    """The worker counts of ``section``: its own option, else ``--workers``, else its default."""
    return getattr(args, f"{section}_workers") or args.workers or sized(args, *WORKERS[section])


def tasks_for(args: argparse.Namespace, section: str) -> int:
    """The tasks per map of ``section``: its own option, else ``--tasks``, else its default."""
    return getattr(args, f"{section}_tasks") or args.tasks or sized(args, *TASKS[section])


def repeats(args: argparse.Namespace) -> int:
    return args.repeats or sized(args, 3, 1)


def make_parser() -> argparse.ArgumentParser:
    p = parser("Pool at scale: start, map, CPU and memory with many workers, fiberlite against "
               "multiprocessing (spawn).")
    p.add_argument("--only", choices=list(SECTIONS), action="append",
                   help="run only these sections (repeatable)")
    p.add_argument("--workers", type=counts, metavar="N,N,...",
                   help="worker counts of every section (default: per section, see below)")
    for section, (full, quick) in WORKERS.items():
        p.add_argument(f"--{section}-workers", type=counts, metavar="N,N,...",
                       help=f"worker counts of the {section} section (default {format_counts(full)}, "
                            f"--quick {format_counts(quick)})")
    p.add_argument("--tasks", type=count, metavar="N", help="tasks per map of every section")
    for section, (full, quick) in TASKS.items():
        p.add_argument(f"--{section}-tasks", type=count, metavar="N",
                       help=f"tasks per map of the {section} section (default {full:,}, --quick {quick:,})")
    p.add_argument("--repeats", type=count, metavar="N",
                   help="samples per row (default 3, --quick 1)")
    p.add_argument("--probe", nargs=2, metavar=("POOL", "WORKERS"), help=argparse.SUPPRESS)
    return p


def format_counts(values: list[int]) -> str:
    return ",".join(str(v) for v in values)


def main() -> None:
    raise_open_file_limit()
    os.environ["FIBERLITE_BACKEND"] = "local"  # psutil reads the workers: processes of this machine
    args = make_parser().parse_args()
    if args.probe:
        print(json.dumps(memory_probe(args.probe[0], int(args.probe[1]))))
        return
    chosen = [key for key in SECTIONS if not args.only or key in args.only]
    report = Report("scale", "Pool with many workers on the local backend vs multiprocessing spawn",
                    sections=chosen, repeats=repeats(args),
                    workers={key: workers_for(args, key) for key in chosen},
                    tasks={key: tasks_for(args, key) for key in TASKS if key in chosen},
                    task_seconds=TASK_SECONDS)
    first_pools()
    for key in chosen:
        SECTIONS[key](report, args)
    finish(report, args)


if __name__ == "__main__":
    main()
