"""The libraries people parallelize with, on fiberlite, next to what they use without it.

- ``map``: ``fiberlite.futures.ProcessPoolExecutor.map`` of 1 ms tasks (``sleep``) against
  fiberlite's ``Pool.map`` of the same tasks (the reference), both of 5 workers, each with
  its default chunksize; the standard library's executor (spawn) in the same rounds;
- ``round trip``: ``submit(f, x).result()`` one at a time, against the standard
  library's ``ProcessPoolExecutor`` (spawn), 2 workers each;
- ``GridSearchCV``: 20 candidates x 5 folds of a ``LogisticRegression`` through joblib
  with ``n_jobs`` = the CPUs, on the fiberlite backend (``fiberlite.joblib``) against
  joblib's default, loky; the workers' start is included (both pools are shut down
  before each round);
- ``DataLoader``: an epoch of PyTorch's ``DataLoader`` with 2 workers on a fiberlite
  context and on the standard library's spawn context, against ``num_workers=0`` (torch
  limited to one thread, as in the workers): the first epoch (workers start) and a later
  one of persistent workers.

Each section's rows run in the same rounds, taking turns (``interleave``), so a stretch
of time when the machine is slower weighs on all of them alike.

Run: ``python benchmarks/bench_futures.py [--quick] [--rounds N] [--only SECTION] [--json PATH]``
"""
from __future__ import annotations

import concurrent.futures
import multiprocessing
import os
import sys
import time
from typing import Any, Callable

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _common import (Report, finish, from_samples, interleave, optional_import, parser,  # noqa: E402
                     progress, sized, sleep_task)

SECTIONS = ("map", "roundtrip", "gridsearch", "dataloader")
SPAWN = "mp spawn"


def identity(x: Any) -> Any:
    return x


class Images:
    """A map-style dataset: item i is a 3x128x128 image made and normalized (torch is
    imported where the items are made, so that a worker that never makes one does not)."""

    def __init__(self, count: int) -> None:
        self.count = count

    def __len__(self) -> int:
        return self.count

    def __getitem__(self, i: int):
        import torch
        image = torch.sin(torch.arange(3 * 128 * 128, dtype=torch.float32).reshape(3, 128, 128) + i)
        return (image - image.mean()) / (image.std() + 1e-6), i % 10


def timed(fn: Callable[[], Any]) -> Callable[[], float]:
    def run() -> float:
        start = time.perf_counter()
        fn()
        return time.perf_counter() - start
    return run


def measure(section: Any, measures: dict[str, Callable[[], float]], rounds: int, warmup: int,
            label: str) -> None:
    """Each row of ``section`` from its ``measures``, taking turns for ``rounds`` rounds."""
    for name, values in interleave(measures, rounds, warmup=warmup, label=label).items():
        section.add(name, from_samples(values))


# -- sections ----------------------------------------------------------------------------------
def bench_map(report: Report, args: Any) -> None:
    import fiberlite
    from fiberlite.futures import ProcessPoolExecutor
    tasks = sized(args, 5000, 300)
    section = report.section("map", f"map of {tasks} tasks of sleep(1 ms), 5 workers", unit="map",
                             reference="fiberlite Pool.map")
    items = [0.001] * tasks
    with fiberlite.Pool(5) as pool, ProcessPoolExecutor(5) as executor, \
            concurrent.futures.ProcessPoolExecutor(5, mp_context=multiprocessing.get_context("spawn")) as std:
        measures = {
            "fiberlite Pool.map": timed(lambda: pool.map(sleep_task, items)),
            "fiberlite executor.map": timed(lambda: list(executor.map(sleep_task, items))),
            f"{SPAWN} executor.map": timed(lambda: list(std.map(sleep_task, items))),
        }
        measure(section, measures, sized(args, args.rounds, 2), 1, "map")


def _round_trips(executor: Any, count: int) -> Callable[[], float]:
    def run() -> float:
        start = time.perf_counter()
        for i in range(count):
            executor.submit(identity, i).result()
        return (time.perf_counter() - start) / count
    return run


def bench_roundtrip(report: Report, args: Any) -> None:
    from fiberlite.futures import ProcessPoolExecutor
    count = sized(args, 300, 30)
    section = report.section("roundtrip", "submit(identity, i).result(), one at a time, 2 workers",
                             unit="round trip", reference=f"{SPAWN} executor")
    with ProcessPoolExecutor(2) as executor, \
            concurrent.futures.ProcessPoolExecutor(2, mp_context=multiprocessing.get_context("spawn")) as std:
        measures = {f"{SPAWN} executor": _round_trips(std, count),
                    "fiberlite executor": _round_trips(executor, count)}
        measure(section, measures, sized(args, args.rounds, 2), 1, "round trip")


def bench_gridsearch(report: Report, args: Any) -> None:
    if optional_import("sklearn") is None:
        progress("gridsearch: scikit-learn is not installed, skipped")
        return
    import joblib
    import numpy as np
    from joblib.externals.loky import get_reusable_executor
    from sklearn.datasets import make_classification
    from sklearn.linear_model import LogisticRegression
    from sklearn.model_selection import GridSearchCV

    import fiberlite.joblib
    fiberlite.joblib.register()
    n_jobs = os.cpu_count() or 1
    candidates, folds = sized(args, (20, 5), (4, 2))
    section = report.section(
        "gridsearch", f"GridSearchCV, {candidates} candidates x {folds} folds, n_jobs={n_jobs}, "
        "workers' start included", unit="search", reference="joblib loky")
    X, y = make_classification(n_samples=sized(args, 2000, 200), n_features=20, random_state=0)
    grid = {"C": list(np.logspace(-3, 3, candidates))}

    def search(backend: str, stop: Callable[[], None]) -> Callable[[], float]:
        def run() -> float:
            stop()  # the workers start within the timing
            start = time.perf_counter()
            with joblib.parallel_config(backend=backend, n_jobs=n_jobs):
                GridSearchCV(LogisticRegression(max_iter=500), grid, cv=folds).fit(X, y)
            return time.perf_counter() - start
        return run

    measures = {"joblib loky": search("loky", lambda: get_reusable_executor().shutdown(wait=True)),
                "fiberlite joblib backend": search("fiberlite", fiberlite.joblib.shutdown)}
    measure(section, measures, sized(args, args.rounds, 1), 0, "GridSearchCV")
    fiberlite.joblib.shutdown()


def bench_dataloader(report: Report, args: Any) -> None:
    if optional_import("torch") is None:
        progress("dataloader: torch is not installed, skipped")
        return
    import torch
    from torch.utils.data import DataLoader

    import fiberlite
    torch.set_num_threads(1)  # as the DataLoader's workers do: the reference uses one core too
    items = sized(args, 1024, 64)
    dataset = Images(items)
    contexts = {"fiberlite, 2 workers": fiberlite.get_context(),
                f"{SPAWN}, 2 workers": multiprocessing.get_context("spawn")}
    first = report.section("dataloader_first", f"DataLoader epoch of {items} images, batch 32, "
                           "workers started for it", unit="epoch", reference="num_workers=0")
    later = report.section("dataloader_later", f"DataLoader epoch of {items} images, batch 32, "
                           "persistent workers (a later epoch)", unit="epoch", reference="num_workers=0")

    def epoch(loader: Any) -> Callable[[], float]:
        return timed(lambda: sum(1 for _ in loader))

    serial = DataLoader(dataset, batch_size=32)
    measures = {"num_workers=0": epoch(serial)}
    measures.update({name: epoch(DataLoader(dataset, batch_size=32, num_workers=2,
                                            multiprocessing_context=ctx))
                     for name, ctx in contexts.items()})
    rounds = sized(args, args.rounds, 1)
    measure(first, measures, rounds, 0, "DataLoader, first epoch")
    loaders = {name: DataLoader(dataset, batch_size=32, num_workers=2, persistent_workers=True,
                                multiprocessing_context=ctx) for name, ctx in contexts.items()}
    measures = {"num_workers=0": epoch(serial)}
    measures.update({name: epoch(loader) for name, loader in loaders.items()})
    measure(later, measures, rounds, 1, "DataLoader, later epoch")
    del loaders


def main() -> None:
    p = parser("concurrent.futures, joblib/scikit-learn and PyTorch's DataLoader on fiberlite")
    p.add_argument("--rounds", type=int, default=5, help="rounds of each section (default 5)")
    p.add_argument("--only", choices=SECTIONS, action="append", help="run only this section")
    args = p.parse_args()
    report = Report("futures", "the libraries people parallelize with, on fiberlite",
                    quick=args.quick, rounds=args.rounds)
    for name in args.only or SECTIONS:
        globals()[f"bench_{name}"](report, args)
    finish(report, args)


if __name__ == "__main__":
    main()
