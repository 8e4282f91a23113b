"""The pools of ``bench_scale.py``: whether a size can run here, a pool warmed until every
worker has run a task (and closed whatever happens), and the rows of one size measured
pool after pool or interleaved, a row that fails kept as its reason."""
from __future__ import annotations

import contextlib
import resource
from typing import Any, Callable, Iterator

from _common import (FIBERLITE, MP, Runner, Section, fiberlite_runner, format_bytes, from_samples,
                     interleave, mp_runner, progress)

RUNNERS: dict[str, Callable[[int], Runner]] = {MP: mp_runner, FIBERLITE: fiberlite_runner}
"""The pools compared, the reference first."""

WARM_TIMEOUT = 300.0  # seconds a pool may take until every worker has run a task
FDS_PER_WORKER = 4  # the master's descriptors per worker (about 2 used), with room to spare
FDS_RESERVED = 64
MEMORY_PER_WORKER = 16 << 20  # about one idle worker's unique memory, for the check before a start


# -- limits ----------------------------------------------------------------------------------
def raise_open_file_limit() -> None:
    """Lift the soft limit on open files to the hard limit (a pool holds a few per worker)."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft == hard:
        return
    try:
        resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    except (ValueError, OSError) as exc:
        progress(f"could not raise the open-file limit from {soft} to {hard}: {exc}")


def capacity_problem(workers: int) -> str | None:
    """Why a pool of ``workers`` cannot run here (open files, memory), or None."""
    import psutil
    soft, _hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    files = FDS_RESERVED + FDS_PER_WORKER * workers
    if soft != resource.RLIM_INFINITY and files > soft:
        return (f"{workers} workers need about {files:,} open files and the limit is {soft:,} "
                f"(raise the hard limit: ulimit -Hn)")
    memory = MEMORY_PER_WORKER * workers
    available = psutil.virtual_memory().available
    if memory > available:
        return (f"{workers} workers need about {format_bytes(memory)} of memory and "
                f"{format_bytes(available)} is available")
    return None


# -- pools -----------------------------------------------------------------------------------
@contextlib.contextmanager
def warmed(make: Callable[[int], Runner], workers: int) -> Iterator[tuple[Runner, set[int]]]:
    """A pool whose every worker has run a task, and the workers' pids; terminated and
    joined however the block ends."""
    runner = make(workers)
    try:
        try:
            pids = runner.warm(timeout=WARM_TIMEOUT)
        except TimeoutError:  # a worker died with its task (the stdlib's pool then waits for
            progress(f"  {runner.name}: a warming round got no answer; a new pool")  # ever)
            runner.close()
            runner = make(workers)
            pids = runner.warm(timeout=WARM_TIMEOUT)
        if len(pids) < workers:
            raise RuntimeError(f"only {len(pids)} of {workers} workers ran a task "
                               f"within {WARM_TIMEOUT:g} s")
        yield runner, pids
    finally:
        runner.close()


class Failed:
    """What a row got instead of samples: the reason it could not be measured."""

    def __init__(self, exc: BaseException) -> None:
        self.reason = f"{type(exc).__name__}: {exc}".strip().splitlines()[0]


def first_pools() -> None:
    """A small pool of each kind, started and closed before anything is timed: the first
    pays for what is done once (imports, fiberlite's hub, mp's resource tracker)."""
    for name, make in RUNNERS.items():
        progress(f"starting a first {name} ...")
        try:
            with warmed(make, 2):
                pass
        except Exception as exc:  # its rows will fail too, and say why
            progress(f"  {name} failed: {Failed(exc).reason}")


Results = dict[str, "dict[str, list[float]] | Failed"]
"""Per row: its samples per section key, or why it failed."""


class Guarded:
    """A row's one-sample function for :func:`interleave` that keeps its first failure
    instead of raising, and is not called again after it."""

    def __init__(self, name: str, measure: Callable[[], Any]) -> None:
        self.name, self.measure = name, measure
        self.failure: Failed | None = None

    def __call__(self) -> Any:
        if self.failure is None:
            try:
                return self.measure()
            except Exception as exc:
                self.failure = Failed(exc)
                progress(f"  {self.name} failed: {self.failure.reason}")
        return None


def interleaved(measures: dict[str, Callable[[], dict[str, float]]], rounds: int,
                label: str) -> Results:
    """Each row's samples (``measure()`` returns one value per section key) over
    ``rounds`` interleaved rounds, or its failure."""
    guards = {name: Guarded(name, measure) for name, measure in measures.items()}
    samples = interleave(guards, rounds, label=label)
    return {name: guard.failure or by_key(samples[name]) for name, guard in guards.items()}


def one_at_a_time(workers: int, turn: int, label: str,
                  measure: Callable[[Runner], dict[str, list[float]]]) -> Results:
    """``measure(runner)`` on a warmed pool of each kind, one pool alive at a time,
    the order turning with ``turn``; a failure kept as its reason."""
    names = list(RUNNERS)
    shift = turn % len(names)
    results: Results = {}
    for name in names[shift:] + names[:shift]:
        progress(f"{label}: {name}, {workers} workers ...")
        try:
            with warmed(RUNNERS[name], workers) as (runner, _pids):
                results[name] = measure(runner)
        except Exception as exc:
            results[name] = Failed(exc)
            progress(f"  {name} failed: {results[name].reason}")
    return {name: results[name] for name in names}


def repeated(rounds: int, sample: Callable[[Runner], dict[str, float]]
             ) -> Callable[[Runner], dict[str, list[float]]]:
    """``sample(runner)`` taken ``rounds`` times: the values per key."""
    return lambda runner: by_key([sample(runner) for _ in range(rounds)])


def by_key(samples: list[dict[str, float]]) -> dict[str, list[float]]:
    """Samples of dicts turned into a list of values per key."""
    return {key: [sample[key] for sample in samples] for key in samples[0]}


def add_rows(sections: dict[str, Section], results: Results,
             **info: Any) -> None:
    """Every row of ``results`` into the section of each key (skipped where it failed)."""
    for name, result in results.items():
        for key, section in sections.items():
            if isinstance(result, Failed):
                section.skip(name, result.reason)
            else:
                section.add(name, from_samples(result[key]), **info)


def skip_rows(sections: dict[str, Section], reason: str) -> None:
    for section in sections.values():
        for name in RUNNERS:
            section.skip(name, reason)


def run_size(sections: dict[str, Section], workers: int, label: str,
             measure: Callable[[], Results], **info: Any) -> Results:
    """The rows of one size, measured; or all skipped, and nothing returned, with the
    reason the size cannot run here."""
    problem = capacity_problem(workers)
    if problem:
        progress(f"{label}: cannot run {workers} workers: {problem}")
        skip_rows(sections, problem)
        return {}
    results = measure()
    add_rows(sections, results, workers=workers, **info)
    return results
