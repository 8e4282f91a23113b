"""Shared helpers of the benchmark scripts: timing, tables, JSON results, command line.

A script builds a :class:`Report`, opens one :class:`Section` per measurement (each
with its own reference row, e.g. raw pynng or ``multiprocessing`` spawn), adds timed
rows to it, and calls :func:`finish`, which prints the tables and writes the JSON
document asked for with ``--json PATH``::

    args = parser("queue round-trip latency").parse_args()
    report = Report("queue_latency", quick=args.quick)
    section = report.section("roundtrip", "round trip", unit="round trip",
                             reference="pynng Pair0")
    section.add("pynng Pair0", timeit(ping, repeats=5, per=1000))
    finish(report, args)

Values are seconds per ``unit`` (bytes in a section of ``quantity="memory"``); tables
pick a readable scale. The pools every script compares (:func:`mp_runner`,
:func:`fiberlite_runner`) and their tasks live here too: a task defined here is imported
by name in both kinds of worker, so that neither imports more than the other.
"""
from __future__ import annotations

import argparse
import json
import multiprocessing
import os
import platform
import statistics
import sys
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Iterable

SCHEMA = 1


def compile_fiberlite() -> None:
    """Write fiberlite's bytecode files, as installing it does.

    The standard library and installed packages come with them; a source checkout run
    with ``PYTHONDONTWRITEBYTECODE`` set would otherwise compile fiberlite's modules
    again in every job it starts, and its start-up times would include that."""
    import compileall
    import importlib.util
    spec = importlib.util.find_spec("fiberlite")
    if spec is not None and spec.submodule_search_locations:
        for folder in spec.submodule_search_locations:
            compileall.compile_dir(folder, quiet=2)


# -- timing -------------------------------------------------------------------------------
@dataclass
class Stats:
    """Seconds (or bytes) per unit of work over ``samples`` repeats."""

    samples: list[float]

    @property
    def best(self) -> float:
        return min(self.samples)

    @property
    def median(self) -> float:
        return statistics.median(self.samples)

    @property
    def mean(self) -> float:
        return statistics.fmean(self.samples)

    @property
    def stdev(self) -> float:
        return statistics.stdev(self.samples) if len(self.samples) > 1 else 0.0

    def as_dict(self) -> dict[str, Any]:
        return {"best": self.best, "median": self.median, "mean": self.mean,
                "stdev": self.stdev, "repeats": len(self.samples), "samples": list(self.samples)}


def timeit(fn: Callable[[], Any], repeats: int = 5, warmup: int = 0, per: int = 1) -> Stats:
    """Call ``fn()`` ``warmup`` times untimed, then ``repeats`` times, each timed with
    ``time.perf_counter`` and divided by ``per`` (the units of work one call does)."""
    for _ in range(warmup):
        fn()
    samples = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        samples.append((time.perf_counter() - start) / per)
    return Stats(samples)


def interleave(measures: dict[str, Callable[[], Any]], rounds: int, warmup: int = 0,
               label: str = "") -> dict[str, list[Any]]:
    """Each of ``measures`` called once per round for ``rounds`` rounds (after ``warmup``
    untimed rounds), in an order that turns by one each round: a stretch of time when
    the machine is slower weighs on every row alike, not on the rows that ran then.
    Returns what each call returned, per name, in round order."""
    names = list(measures)
    samples: dict[str, list[Any]] = {name: [] for name in names}
    for round_ in range(warmup + rounds):
        if label:
            progress(f"{label}: round {round_ + 1}/{warmup + rounds}")
        shift = round_ % len(names)
        for name in names[shift:] + names[:shift]:
            sample = measures[name]()
            if round_ >= warmup:
                samples[name].append(sample)
    return samples


def from_samples(samples: Iterable[float], per: int = 1) -> Stats:
    """Stats of durations measured by the caller (seconds per call, divided by ``per``)."""
    values = [s / per for s in samples]
    if not values:
        raise ValueError("no samples")
    return Stats(values)


# -- pools ---------------------------------------------------------------------------------
MP = "mp spawn Pool"
MP_FORK = "mp fork Pool"
FIBERLITE = "fiberlite Pool"


def sleep_task(d: float) -> None:
    time.sleep(d)


def pid_after(d: float) -> int:
    time.sleep(d)
    return os.getpid()


WARM_ROUND = 60.0  # seconds one round of warming a pool may take


class Runner:
    """``map(func, items, chunksize)`` on one kind of pool, ``warm()`` and ``close()``."""

    def __init__(self, name: str, map_fn: Callable, close: Callable[[], None], workers: int,
                 map_async: Callable | None = None) -> None:
        self.name, self.map, self.close, self.workers = name, map_fn, close, workers
        self.map_async = map_async

    def warm(self, task: Callable[[float], int] = pid_after, timeout: float = 300.0) -> set[int]:
        """Until every worker has run ``task`` (pool start stays out of the timings), for
        ``timeout`` seconds at most; the pids ``task`` returned, one a worker.
        ``TimeoutError`` when one round gets no answer in time (a ``multiprocessing``
        pool whose worker died with a task waits for it for ever)."""
        seen: set[int] = set()
        deadline = time.monotonic() + timeout
        while len(seen) < self.workers and time.monotonic() < deadline:
            if self.map_async is None:
                seen.update(self.map(task, [0.05] * self.workers, 1))
                continue
            left = max(1.0, deadline - time.monotonic())
            try:
                seen.update(self.map_async(task, [0.05] * self.workers, 1).get(min(left, WARM_ROUND)))
            except multiprocessing.TimeoutError as exc:
                raise TimeoutError(f"{self.name}: no answer to a warming round within "
                                   f"{min(left, WARM_ROUND):g} s") from exc
        if len(seen) < self.workers:
            progress(f"  warning: {self.name}: only {len(seen)} of {self.workers} workers answered")
        return seen


def pool_runner(name: str, pool: Any, workers: int) -> Runner:
    """A :class:`Runner` for a ``multiprocessing``-style ``pool``; ``close()`` terminates and joins it."""
    def map_fn(func, items, chunksize):
        return pool.map(func, items) if chunksize is None else pool.map(func, items, chunksize)

    def close():
        pool.terminate()
        pool.join()
    return Runner(name, map_fn, close, workers, pool.map_async)


def mp_runner(workers: int) -> Runner:
    """A ``multiprocessing`` Pool of ``workers``, spawn start method."""
    return pool_runner(MP, multiprocessing.get_context("spawn").Pool(workers), workers)


def mp_fork_runner(workers: int) -> Runner | None:
    """A ``multiprocessing`` Pool of ``workers``, fork start method (None where there is none)."""
    if "fork" not in multiprocessing.get_all_start_methods():
        return None
    return pool_runner(MP_FORK, multiprocessing.get_context("fork").Pool(workers), workers)


def fiberlite_runner(workers: int) -> Runner:
    """A fiberlite Pool of ``workers`` on the configured backend."""
    import fiberlite
    return pool_runner(FIBERLITE, fiberlite.Pool(workers), workers)


# -- starting a job ----------------------------------------------------------------------
def say_hello(queue: Any) -> None:
    queue.put("hello")


def first_message(ctx: Any, repeats: int, warmup: int, timeout: float = 120.0) -> tuple[Stats, Stats]:
    """Jobs of ``ctx`` started one at a time: the seconds from ``start()`` until the job's
    first message on a queue, and until ``join()`` returns."""
    queue = ctx.Queue()
    first, whole = [], []
    for i in range(warmup + repeats):
        child = ctx.Process(target=say_hello, args=(queue,))
        start = time.perf_counter()
        child.start()
        queue.get(timeout=timeout)
        got = time.perf_counter()
        child.join(timeout)
        done = time.perf_counter()
        if child.exitcode != 0:
            raise RuntimeError(f"{child} exited with {child.exitcode}")
        if i >= warmup:
            first.append(got - start)
            whole.append(done - start)
    return from_samples(first), from_samples(whole)


def command_hello(command: list[str], repeats: int, warmup: int, timeout: float = 120.0) -> tuple[Stats, Stats]:
    """``command`` (which prints ``hello``) run one at a time: the seconds until its first
    output line, and until it exits."""
    import subprocess
    first, whole = [], []
    for i in range(warmup + repeats):
        start = time.perf_counter()
        proc = subprocess.Popen(command, stdout=subprocess.PIPE, stdin=subprocess.DEVNULL)
        line = proc.stdout.readline()
        got = time.perf_counter()
        proc.stdout.read()
        code = proc.wait(timeout)
        done = time.perf_counter()
        if code != 0 or line.strip() != b"hello":
            raise RuntimeError(f"{' '.join(command)} failed with exit status {code}")
        if i >= warmup:
            first.append(got - start)
            whole.append(done - start)
    return from_samples(first), from_samples(whole)


# -- results -------------------------------------------------------------------------------
@dataclass
class Row:
    name: str
    stats: Stats | None
    info: dict[str, Any] = field(default_factory=dict)
    skipped: str | None = None


class Section:
    """One table: rows measured in the same unit, compared with the ``reference`` row.

    ``quantity`` is what the rows measure, a key of :data:`QUANTITIES`."""

    def __init__(self, key: str, title: str, unit: str, reference: str | None,
                 stat: str = "median", note: str = "", quantity: str = "time") -> None:
        if quantity not in QUANTITIES:
            raise ValueError(f"quantity {quantity!r} is not one of {sorted(QUANTITIES)}")
        self.key = key
        self.title = title
        self.unit = unit
        self.reference = reference
        self.stat = stat
        self.note = note
        self.quantity = quantity
        self.rows: list[Row] = []

    def format(self, value: float) -> str:
        """``value`` printed with a readable unit of the section's quantity."""
        return QUANTITIES[self.quantity][1](value)

    def add(self, name: str, stats: Stats, **info: Any) -> Row:
        """Record ``stats`` for the row ``name``; ``info`` is kept in the JSON (sizes, notes)."""
        row = Row(name, stats, info)
        self.rows.append(row)
        return row

    def skip(self, name: str, reason: str) -> Row:
        """A row that could not be measured here (peer not installed, ...)."""
        row = Row(name, None, skipped=reason)
        self.rows.append(row)
        return row

    def value(self, row: Row) -> float | None:
        return None if row.stats is None else getattr(row.stats, self.stat)

    def reference_value(self) -> float | None:
        for row in self.rows:
            if row.name == self.reference and row.stats is not None:
                return self.value(row)
        return None

    def ratio(self, row: Row) -> float | None:
        ref = self.reference_value()
        value = self.value(row)
        if ref is None or value is None or ref <= 0:
            return None
        return value / ref

    def results(self) -> list[dict[str, Any]]:
        out = []
        for row in self.rows:
            entry: dict[str, Any] = {"section": self.key, "section_title": self.title,
                                     "name": row.name, "unit": self.unit,
                                     "reference": self.reference, "stat": self.stat}
            if row.stats is None:
                entry["skipped"] = row.skipped
            else:
                entry.update(row.stats.as_dict())
                entry[QUANTITIES[self.quantity][0]] = self.value(row)
                entry["ratio"] = self.ratio(row)
            if row.info:
                entry["info"] = row.info
            out.append(entry)
        return out


class Report:
    """All sections of one benchmark run, with the machine it ran on."""

    def __init__(self, benchmark: str, description: str = "", **params: Any) -> None:
        self.benchmark = benchmark
        self.description = description
        self.params = params
        self.sections: list[Section] = []
        self.started = time.time()

    def section(self, key: str, title: str, unit: str, reference: str | None,
                stat: str = "median", note: str = "", quantity: str = "time") -> Section:
        section = Section(key, title, unit, reference, stat, note, quantity)
        self.sections.append(section)
        return section

    def to_dict(self) -> dict[str, Any]:
        return {
            "schema": SCHEMA,
            "benchmark": self.benchmark,
            "description": self.description,
            "timestamp": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(self.started)),
            "params": self.params,
            "machine": machine_info(),
            "sections": [{"key": s.key, "title": s.title, "unit": s.unit,
                          "reference": s.reference, "stat": s.stat, "note": s.note,
                          "quantity": s.quantity}
                         for s in self.sections],
            "results": [entry for s in self.sections for entry in s.results()],
        }

    def write_json(self, path: str) -> None:
        folder = os.path.dirname(os.path.abspath(path))
        os.makedirs(folder, exist_ok=True)
        with open(path, "w") as out:
            json.dump(self.to_dict(), out, indent=2)
            out.write("\n")

    def table(self) -> str:
        return "\n\n".join(format_section(s) for s in self.sections)


# -- printing ------------------------------------------------------------------------------
def format_time(seconds: float) -> str:
    """``seconds`` with a readable unit: ``12.3 us``, ``4.56 ms``, ``1.20 s``."""
    if seconds < 1e-3:
        return f"{seconds * 1e6:.1f} us"
    if seconds < 1:
        return f"{seconds * 1e3:.2f} ms"
    return f"{seconds:.2f} s"


def format_bytes(count: float) -> str:
    """``count`` bytes with a readable unit: ``512 B``, ``12.3 KiB``, ``4.56 MiB``, ``1.20 GiB``."""
    if count < 1024:
        return f"{count:.0f} B"
    if count < 1 << 20:
        return f"{count / 1024:.1f} KiB"
    if count < 1 << 30:
        return f"{count / (1 << 20):.2f} MiB"
    return f"{count / (1 << 30):.2f} GiB"


QUANTITIES: dict[str, tuple[str, Callable[[float], str]]] = {
    "time": ("seconds", format_time),
    "memory": ("bytes", format_bytes),
}
"""What a section can measure: the key of its values in the JSON results, and how one prints."""


def format_section(section: Section) -> str:
    header = f"{section.title}  ({section.stat} {section.quantity} per {section.unit}"
    header += f"; ratio vs {section.reference})" if section.reference else ")"
    lines = [header]
    rows = [("name", section.stat, "best", "ratio")]
    for row in section.rows:
        if row.stats is None:
            rows.append((row.name, "skipped", "", row.skipped or ""))
            continue
        ratio = section.ratio(row)
        rows.append((row.name, section.format(section.value(row)), section.format(row.stats.best),
                     "-" if ratio is None else f"{ratio:.2f}x"))
    widths = [max(len(r[i]) for r in rows) for i in range(4)]
    for i, r in enumerate(rows):
        lines.append(f"  {r[0]:<{widths[0]}} | {r[1]:>{widths[1]}} | {r[2]:>{widths[2]}} | {r[3]}".rstrip())
        if i == 0:
            lines.append("  " + "-+-".join("-" * w for w in widths))
    if section.note:
        lines.append(f"  note: {section.note}")
    return "\n".join(lines)


# -- machine -------------------------------------------------------------------------------
def _cpu_model() -> str:
    try:
        with open("/proc/cpuinfo") as info:
            for line in info:
                if line.lower().startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def _version(module: str) -> str | None:
    try:
        from importlib.metadata import version
        return version(module)
    except Exception:
        return None


def machine_info() -> dict[str, Any]:
    """What the numbers depend on: CPU, cores, memory, Python, OS, library versions."""
    info: dict[str, Any] = {
        "cpu_model": _cpu_model(),
        "cores_logical": os.cpu_count(),
        "python": platform.python_version(),
        "python_implementation": platform.python_implementation(),
        "os": platform.platform(),
        "machine": platform.machine(),
    }
    if hasattr(os, "sched_getaffinity"):
        info["cores_available"] = len(os.sched_getaffinity(0))
    try:
        import psutil
        info["cores_physical"] = psutil.cpu_count(logical=False)
        info["memory_bytes"] = psutil.virtual_memory().total
    except Exception:
        pass
    info["packages"] = {name: v for name in ("fiberlite", "pynng", "cloudpickle", "loky", "ray",
                                             "dask", "distributed", "numpy")
                        if (v := _version(name)) is not None}
    return info


# -- command line ----------------------------------------------------------------------------
def parser(description: str) -> argparse.ArgumentParser:
    """An argument parser with the options every benchmark takes: ``--json``, ``--quick``.

    Also compiles fiberlite (:func:`compile_fiberlite`): here rather than at import, so
    that the workers which import this module do not do it again."""
    compile_fiberlite()
    p = argparse.ArgumentParser(description=description)
    p.add_argument("--json", metavar="PATH", help="also write the results as JSON to PATH")
    p.add_argument("--quick", action="store_true",
                   help="small sizes and few repeats: a smoke run, not a measurement")
    return p


def sized(args: argparse.Namespace, full: Any, quick: Any) -> Any:
    """``quick`` under ``--quick``, else ``full``."""
    return quick if getattr(args, "quick", False) else full


def optional_import(name: str) -> Any | None:
    """The module ``name``, or None when it is not installed (peers are optional)."""
    import importlib
    try:
        return importlib.import_module(name)
    except Exception:
        return None


def progress(message: str) -> None:
    """A progress line on stderr (the table goes to stdout)."""
    sys.stderr.write(message + "\n")
    sys.stderr.flush()


def finish(report: Report, args: argparse.Namespace) -> None:
    """Print the tables; write the JSON document when ``--json`` was given."""
    print(f"# {report.benchmark}: {report.description}")
    m = machine_info()
    print(f"# {m['cpu_model']}, {m.get('cores_available', m['cores_logical'])} cores, "
          f"Python {m['python']}, {m['os']}" + ("  [--quick: not a measurement]" if args.quick else ""))
    print()
    print(report.table())
    sys.stdout.flush()
    if args.json:
        report.write_json(args.json)
        progress(f"wrote {args.json}")
