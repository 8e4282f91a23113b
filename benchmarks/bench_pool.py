"""Pool: framework overhead, task throughput, result bandwidth, dispatch cost.

Sections (``multiprocessing.get_context("spawn").Pool`` is the reference unless noted):

- ``overhead``: the Fiber paper's test. A pool of 5 workers runs ``time.sleep(d)`` tasks
  (chunksize=1), d = 1 s, 100 ms, 10 ms, 1 ms, as many as make 1 s of ideal wall time
  (5, 50, 500, 5,000 tasks). fiberlite, mp spawn, and loky / Ray / Dask when importable.
  A summary table compares every row with the ideal 1.0 s.
- ``throughput``: ``pool.map`` of a trivial function over 100,000 items, chunksize=1
  and the default chunksize, on ``--throughput-workers`` workers (the CPU count); the
  pools (fiberlite, mp spawn and, where it exists, mp fork) live at once and take
  turns, repeat by repeat. The note gives fiberlite's throughput over mp fork's.
- ``bandwidth``: 200 results of 1 MiB each (``bytes`` and a numpy array), next to a raw
  pynng Pair0 push of 200 1-MiB messages between two processes (the reference: the
  raw one-way bandwidth, measured in the same run). numpy is imported at module level
  and every worker has used it before timing.
- ``imap``: the calls of CPython's ``mp_pool.py`` example with big chunks, on a pool of
  4 workers: ``map(noop, L)`` with ``L = [None] * 1,000,000``, ``imap`` and
  ``imap_unordered`` of the same with ``chunksize=125,000``, and ``imap(pow3,
  range(100,000), chunksize=12,500)``; time per call, both pools taking turns.
- ``dispatch``: the master's cost per task with 10, 100 and 1,000 connected workers.
  The workers are simulated: threads in a few helper jobs, each with its own
  authenticated connection, speaking the real worker protocol (``next`` carrying the
  previous result, asking for one chunk) to a real ``Pool`` whose worker jobs are
  stubs. Wall time and master CPU time per task; the reference is 10 workers.

Pools are created and warmed (every worker has run a task) before timing.

Run: ``python benchmarks/bench_pool.py [--quick] [--json PATH]``
"""
from __future__ import annotations

import contextlib
import multiprocessing
import os
import sys
import threading
import time
from collections.abc import Callable
from typing import Any

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _common import (
                     FIBERLITE,
                     MP,
                     MP_FORK,
                     Report,
                     Runner,
                     Stats,
                     fiberlite_runner,
                     mp_fork_runner,
                     finish,
                     from_samples,
                     mp_runner,
                     optional_import,
                     parser,
                     pid_after,
                     pool_runner,
                     progress,
                     sized,
                     sleep_task,
                     )

numpy = optional_import("numpy")  # imported here, never inside a timed task

MIB = 1 << 20


# -- tasks (module level: the spawn start method imports them by name) ----------------------
def noop(x: Any) -> Any:
    return x


def pow3(x: int) -> int:
    return x ** 3


def mib_bytes(_: Any) -> bytes:
    return bytes(MIB)


def mib_array(_: Any) -> Any:
    return numpy.zeros(MIB, dtype=numpy.uint8)


def numpy_pid(d: float) -> int:
    """:func:`pid_after` that also needs numpy: warms the numpy rows (the import of numpy
    in a fiberlite worker happens when the first function that uses it arrives)."""
    numpy.zeros(1)
    return pid_after(d)


def pynng_pusher(address: str, count: int, size: int) -> None:
    """Dial ``address``; on each b"go" send ``count`` messages of ``size`` bytes; stop on b"stop"."""
    import pynng
    message = bytes(size)
    with pynng.Pair0(recv_max_size=0) as sock:
        sock.dial(address, block=True)
        while sock.recv() == b"go":
            for _ in range(count):
                sock.send(message)


# -- pools ---------------------------------------------------------------------------------
def make_runners(workers: int) -> list[tuple[str, Callable[[], Runner]]]:
    """(name, factory) for fiberlite, mp spawn and the peers that are importable."""
    out: list[tuple[str, Callable[[], Runner]]] = [
        (FIBERLITE, lambda: fiberlite_runner(workers)),
        (MP, lambda: mp_runner(workers)),
    ]
    loky = optional_import("loky")
    if loky is not None:
        def make_loky() -> Runner:
            executor = loky.ProcessPoolExecutor(max_workers=workers)

            def map_fn(func, items, chunksize):
                return list(executor.map(func, items, chunksize=chunksize or 1))
            return Runner("loky", map_fn, lambda: executor.shutdown(wait=True), workers)
        out.append(("loky", make_loky))
    ray = optional_import("ray")
    if ray is not None:
        def make_ray() -> Runner:
            from ray.util.multiprocessing import Pool as RayPool
            pool = RayPool(workers)
            return pool_runner("Ray Pool", pool, workers)
        out.append(("Ray Pool", make_ray))
    distributed = optional_import("dask.distributed")
    if distributed is not None:
        def make_dask() -> Runner:
            cluster = distributed.LocalCluster(n_workers=workers, threads_per_worker=1,
                                               processes=True, dashboard_address=None)
            client = distributed.Client(cluster)

            def map_fn(func, items, chunksize):
                return client.gather(client.map(func, items, pure=False))

            def close():
                client.close()
                cluster.close()
            return Runner("Dask", map_fn, close, workers)
        out.append(("Dask", make_dask))
    return out


def timed(fn: Callable[[], Any], repeats: int, per: float) -> Stats:
    samples = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        samples.append(time.perf_counter() - start)
    return from_samples(samples, per=per)


# -- (a) framework overhead --------------------------------------------------------------------
def bench_overhead(report: Report, args: Any) -> None:
    workers = 5
    ideal = sized(args, 1.0, 0.2)  # seconds of ideal wall time per row
    durations = sized(args, [1.0, 0.1, 0.01, 0.001], [0.01, 0.001])
    repeats = sized(args, 3, 1)
    runners = make_runners(workers)
    sections = {}
    for d in durations:
        tasks = round(workers * ideal / d)
        label = _duration(d)
        sections[d] = report.section(
            f"overhead_{label.replace(' ', '')}", f"{tasks} x sleep({label}) on 5 workers",
            unit="map call", reference=MP,
            note=f"chunksize=1; ideal wall time {ideal:.1f} s")
    summary = report.section(
        "overhead_vs_ideal", f"framework overhead: wall time / ideal {ideal:.1f} s",
        unit="ideal second", reference="ideal",
        note="1.00 s per ideal second means no overhead")
    summary.add("ideal", Stats([1.0]))
    for name, factory in runners:
        progress(f"overhead: starting {name} ...")
        runner = factory()
        try:
            runner.warm()
            for d in durations:
                tasks = round(workers * ideal / d)
                progress(f"  {name}: {tasks} x sleep({_duration(d)})")
                items = [d] * tasks
                stats = timed(lambda r=runner, i=items: r.map(sleep_task, i, 1), repeats, per=1)
                sections[d].add(name, stats, tasks=tasks, task_seconds=d, ideal_seconds=ideal)
                summary.add(f"{name}, {_duration(d)} tasks", from_samples(stats.samples, per=ideal),
                            tasks=tasks, task_seconds=d)
        finally:
            runner.close()


def _duration(d: float) -> str:
    return f"{d:g} s" if d >= 1 else f"{d * 1000:g} ms"


# -- (b) throughput ------------------------------------------------------------------------------
def bench_throughput(report: Report, args: Any) -> None:
    items = list(range(sized(args, 100_000, 10_000)))
    workers = args.throughput_workers or os.cpu_count() or 2
    # a default-chunksize map takes milliseconds: many repeats, or the median is noise
    repeats = {1: sized(args, 3, 1), None: sized(args, 40, 1)}
    sections = {}
    for chunksize in (1, None):
        label = "chunksize=1" if chunksize == 1 else "default chunksize"
        sections[chunksize] = report.section(
            f"throughput_{'1' if chunksize == 1 else 'default'}",
            f"map(noop, {len(items):,} items), {label}, {workers} workers", unit="task", reference=MP,
            note=f"{repeats[chunksize]} repeats, the pools taking turns")
    progress("throughput: starting the pools ...")
    runners: list[Runner] = []
    try:
        runners.append(fiberlite_runner(workers))
        runners.append(mp_runner(workers))
        fork = mp_fork_runner(workers)
        if fork is not None:
            runners.append(fork)
        for runner in runners:
            runner.warm()
            runner.map(noop, items, None)
        for chunksize, section in sections.items():
            progress(f"throughput: chunksize={chunksize} ...")
            samples: dict[str, list[float]] = {runner.name: [] for runner in runners}
            for _ in range(repeats[chunksize]):  # alternate, so that drift hits both alike
                for runner in runners:
                    start = time.perf_counter()
                    runner.map(noop, items, chunksize)
                    samples[runner.name].append(time.perf_counter() - start)
            for runner in runners:
                stats = from_samples(samples[runner.name], per=len(items))
                section.add(runner.name, stats, items=len(items), tasks_per_s=1 / stats.median)
    finally:
        for runner in runners:
            runner.close()
    for section in sections.values():
        rates = {row.name: row.info["tasks_per_s"] for row in section.rows}
        section.note += "; tasks/s: " + ", ".join(f"{name} {rate:,.0f}" for name, rate in rates.items())
        if MP_FORK in rates:
            section.note += f"; fiberlite / mp fork throughput: {rates[FIBERLITE] / rates[MP_FORK]:.2f}x"


# -- imap with big chunks ---------------------------------------------------------------------
def bench_imap(report: Report, args: Any) -> None:
    size = sized(args, 1_000_000, 40_000)
    nones, numbers = [None] * size, range(size // 10)
    calls: dict[str, Callable[[Any], Any]] = {
        f"map(noop, [None] * {size:,})": lambda pool: pool.map(noop, nones),
        f"imap(noop, same, chunksize={size // 8:,})":
            lambda pool: list(pool.imap(noop, nones, chunksize=size // 8)),
        f"imap_unordered(noop, same, chunksize={size // 8:,})":
            lambda pool: list(pool.imap_unordered(noop, nones, chunksize=size // 8)),
        f"imap(pow3, range({size // 10:,}), chunksize={size // 80:,})":
            lambda pool: list(pool.imap(pow3, numbers, chunksize=size // 80)),
    }
    repeats = sized(args, 15, 1)
    sections = {name: report.section(f"imap_{i}", f"{name}, 4 workers", unit="call", reference=MP,
                                     note=f"{repeats} repeats, the two pools taking turns")
                for i, name in enumerate(calls)}
    progress("imap: starting both pools ...")
    pools = [(FIBERLITE, __import__("fiberlite").Pool(4)),
             (MP, multiprocessing.get_context("spawn").Pool(4))]
    try:
        for _, pool in pools:
            pool_runner("", pool, 4).warm()
        for name, call in calls.items():
            progress(f"imap: {name} ...")
            samples: dict[str, list[float]] = {label: [] for label, _ in pools}
            for _ in range(repeats):  # alternate, so that drift hits both alike
                for label, pool in pools:
                    start = time.perf_counter()
                    call(pool)
                    samples[label].append(time.perf_counter() - start)
            items = size // 10 if "pow3" in name else size
            for label, _ in pools:
                sections[name].add(label, from_samples(samples[label]), items=items)
    finally:
        for _, pool in pools:
            pool.terminate()
            pool.join()


# -- (c) bandwidth -------------------------------------------------------------------------------
def bench_bandwidth(report: Report, args: Any) -> None:
    count = sized(args, 200, 20)
    repeats = sized(args, 3, 1)
    workers = os.cpu_count() or 2
    section = report.section(
        "bandwidth", f"{count} results of 1 MiB, {workers} workers", unit="MiB", reference="pynng Pair0",
        note="")
    progress("bandwidth: pynng Pair0 ...")
    section.add("pynng Pair0", pynng_bandwidth(count, repeats), messages=count)
    kinds = [("bytes", mib_bytes)]
    if numpy is not None:
        kinds.append(("numpy", mib_array))
    for name, make in ((FIBERLITE, fiberlite_runner), (MP, mp_runner)):
        progress(f"bandwidth: {name} ...")
        runner = make(workers)
        try:
            runner.warm(pid_after if numpy is None else numpy_pid)
            for kind, func in kinds:
                stats = timed(lambda r=runner, f=func: r.map(f, range(count), 1), repeats, per=count)
                section.add(f"{name}, {kind}", stats, results=count)
        finally:
            runner.close()
    section.note = "MiB/s (share of the raw pynng one-way bandwidth): " + ", ".join(
        f"{row.name} {1 / section.value(row):,.0f} ({1 / section.ratio(row):.2f}x)"
        for row in section.rows if row.stats is not None)


def pynng_bandwidth(count: int, repeats: int) -> Stats:
    import pynng
    spawn = multiprocessing.get_context("spawn")
    with pynng.Pair0(recv_max_size=0) as sock:
        sock.listen("tcp://127.0.0.1:0")
        address = "tcp://" + str(sock.listeners[0].local_address)
        child = spawn.Process(target=pynng_pusher, args=(address, count, MIB))
        child.start()
        try:
            samples = []
            for i in range(repeats + 1):  # the first push warms the connection
                start = time.perf_counter()
                sock.send(b"go")
                for _ in range(count):
                    sock.recv()
                if i:
                    samples.append(time.perf_counter() - start)
            sock.send(b"stop")
        finally:
            child.join(30)
            if child.exitcode is None:
                child.kill()
    return from_samples(samples, per=count)


# -- (d) dispatch cost with simulated workers --------------------------------------------------
class _StubProcess:
    """A worker 'job' that starts nothing: the benchmark runs a simulated worker instead."""

    def __init__(self, ctx: _StubContext, target: Any = None, name: str = "", daemon: bool = True,
                 args: tuple = ()) -> None:
        self._ctx, self._args = ctx, args
        self.launch_options = ctx.launch_options  # what the pool marks on its jobs
        self.sentinel = ctx.sentinel
        self.exitcode: int | None = None

    def start(self) -> None:
        upstream, wid = self._args[0], self._args[1]  # how a worker job reaches its master
        self._ctx.started.append((upstream.ref, wid))

    def terminate(self) -> None:
        self.exitcode = -15

    kill = terminate

    def join(self, timeout: float | None = None) -> None:
        pass

    def close(self) -> None:
        pass


class _StubContext:
    def __init__(self) -> None:
        self._read, self._write = os.pipe()  # never written: the stubs never 'exit'
        self.sentinel = self._read
        self.started: list[tuple[Any, int]] = []
        from fiberlite.runtime.launch_options import LaunchOptions
        self.launch_options = LaunchOptions()

    def Process(self, **kwargs: Any) -> _StubProcess:
        return _StubProcess(self, **kwargs)

    def close(self) -> None:
        os.close(self._read)
        os.close(self._write)


def simulated_worker(address: str, oid: int, wid: int, key: bytes) -> None:
    """The real worker protocol, minus the work: return each chunk's items as its results."""
    from fiberlite.pool.chunks import pack, unpack
    from fiberlite.wire.client import Client
    client = Client(address, key, connect_timeout=60)
    entries: list = []
    values: Any = None
    try:
        while True:
            ok, reply = client.request((oid, "next", (wid, entries, values, 1)))
            if not ok or reply is None:
                return
            chunks = reply[0]
            entries = [(cid, None) for cid, _gid, _data in chunks]
            values = pack([unpack(data) for _cid, _gid, data in chunks]) if chunks else None
    except ConnectionError:
        return  # the pool was terminated under us
    finally:
        with contextlib.suppress(Exception):
            client.close()


def simulated_workers(address: str, oid: int, wids: list[int]) -> None:
    """A helper job: one thread and one connection per simulated worker."""
    from fiberlite.runtime import identity
    key = identity.key()
    threading.stack_size(256 * 1024)
    threads = [threading.Thread(target=simulated_worker, args=(address, oid, wid, key), daemon=True)
               for wid in wids]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()


def bench_dispatch(report: Report, args: Any) -> None:
    counts = sized(args, [10, 100, 1000], [10, 100])
    tasks = sized(args, 20_000, 2_000)
    repeats = sized(args, 3, 1)
    helpers = 2
    wall = report.section("dispatch_wall", f"map(noop, {tasks:,} items, chunksize=1) on simulated workers",
                          unit="task", reference=f"{counts[0]} workers",
                          note="workers ask for one chunk per round trip; wall time per task")
    cpu = report.section("dispatch_cpu", "master CPU time per task (all master threads)",
                         unit="task", reference=f"{counts[0]} workers",
                         note="time.process_time() of the master over the same map calls")
    for n in counts:
        progress(f"dispatch: {n} simulated workers ...")
        stats_wall, stats_cpu, connect = measure_dispatch(n, tasks, repeats, helpers)
        wall.add(f"{n} workers", stats_wall, workers=n, tasks=tasks, connect_seconds=connect)
        cpu.add(f"{n} workers", stats_cpu, workers=n, tasks=tasks)


def measure_dispatch(n: int, tasks: int, repeats: int, helpers: int) -> tuple[Stats, Stats, float]:
    import fiberlite
    from fiberlite.pool import Pool
    ctx = _StubContext()
    fiberlite.init(workers_per_job=1)  # each simulated worker speaks to the master itself
    try:
        pool = Pool(n, context=ctx)
    finally:
        fiberlite.init(workers_per_job=None)
    jobs = []
    try:
        deadline = time.monotonic() + 60  # Pool() starts a first round; its supervisor the rest
        while len(ctx.started) < n:
            if time.monotonic() > deadline:
                raise RuntimeError(f"only {len(ctx.started)} of {n} simulated workers were started")
            time.sleep(0.01)
        ref = ctx.started[0][0]
        wids = [wid for _ref, wid in ctx.started]
        started = time.perf_counter()
        for i in range(helpers):
            job = fiberlite.Process(target=simulated_workers, args=(ref.address, ref.oid, wids[i::helpers]),
                                    daemon=True)
            job.start()
            jobs.append(job)
        dispatcher = pool._core.dispatcher  # benchmark-only peek: wait until all are connected
        deadline = time.monotonic() + 120
        while dispatcher.n_ready < n:
            if time.monotonic() > deadline:
                raise RuntimeError(f"only {dispatcher.n_ready} of {n} simulated workers connected")
            time.sleep(0.01)
        connect = time.perf_counter() - started
        items = list(range(tasks))
        assert pool.map(noop, items[:1000], chunksize=1) == items[:1000]  # warm-up, and a check
        walls, cpus = [], []
        for _ in range(repeats):
            cpu0, wall0 = time.process_time(), time.perf_counter()
            result = pool.map(noop, items, chunksize=1)
            walls.append(time.perf_counter() - wall0)
            cpus.append(time.process_time() - cpu0)
            assert result == items
        return from_samples(walls, per=tasks), from_samples(cpus, per=tasks), connect
    finally:
        pool.terminate()
        for job in jobs:
            job.join(30)
            if job.exitcode is None:
                job.kill()
                job.join()
        ctx.close()


def main() -> None:
    p = parser("Pool: framework overhead, throughput, result bandwidth, dispatch cost.")
    p.add_argument("--only", choices=["overhead", "throughput", "imap", "bandwidth", "dispatch"],
                   action="append", help="run only these sections (repeatable)")
    p.add_argument("--throughput-workers", type=int, default=0, metavar="N",
                   help="workers of each pool in the throughput section (default: the CPU count)")
    args = p.parse_args()
    report = Report("pool", "Pool overhead, throughput, imap, bandwidth and dispatch cost vs "
                            "multiprocessing")
    steps = {"overhead": bench_overhead, "throughput": bench_throughput, "imap": bench_imap,
             "bandwidth": bench_bandwidth, "dispatch": bench_dispatch}
    for key, step in steps.items():
        if not args.only or key in args.only:
            step(report, args)
    finish(report, args)


if __name__ == "__main__":
    main()
