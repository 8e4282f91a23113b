"""The slurm backend: job start latency against a bare ``sbatch --wrap`` and ``srun``, and
a pool's map on Slurm against the local backend's pool on the same node.

Sections:

- ``start``: time from ``Process.start()`` until the parent receives the job's first
  message on a queue, next to Slurm's own ways of running ``python -c "print(...)"``
  with the same interpreter: ``sbatch --wrap`` timed until its output file holds the
  line (polled every 5 ms) and ``srun`` timed until its first output line and until
  it exits. Reference: ``sbatch --wrap``'s first line (a fiberlite job is an sbatch job).
- ``pool_start``: ``Pool(N)`` until every worker has run a task, on Slurm (by default
  one job of N CPUs that forks N workers) and on the local backend. Reference: local.
- ``map_<task>``: a warm ``Pool(N)`` maps tasks that sleep ``task`` seconds (10 ms, 1 ms;
  ``--tasks`` to change), the batch sized to 1 s of ideal wall time (Fiber's
  framework-overhead test). Reference: the local backend's pool; ``multiprocessing``
  (spawn) and the ideal 1 s measured in the same run.

Everything runs in this process's Slurm cluster (``SLURM_CONF`` when set). On a
one-node test cluster the Slurm jobs run on this machine, so the pool rows compare the
two backends on the same node; the Slurm rows add submission, scheduling and the
output file.

Run: ``python benchmarks/bench_slurm.py [--workers N] [--quick] [--json PATH]``
(here, after ``.ci/slurm_setup.sh``: ``SLURM_CONF=/tmp/fiberlite-slurm/slurm.conf``).
"""
from __future__ import annotations

import multiprocessing
import os
import shutil
import subprocess
import sys
import tempfile
import time
from typing import Any

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _common import (Report, Stats, command_hello, finish, first_message, from_samples,  # noqa: E402
                     parser, progress, sized)

HELLO = "print('hello', flush=True)"
POLL = 0.005  # seconds between two reads of an sbatch job's output file
TIMEOUT = 120.0  # seconds one job may take before the benchmark gives up


# -- job bodies (module level: multiprocessing's spawn imports them by name) ---------------------
def nap(seconds: float) -> None:
    time.sleep(seconds)


def pid_after(seconds: float) -> int:
    time.sleep(seconds)
    return os.getpid()


# -- Slurm's own ----------------------------------------------------------------------------------
def sbatch_wrap(repeats: int, warmup: int, folder: str) -> Stats:
    """``sbatch --wrap "python -c print(...)"``: until its output file holds the line."""
    samples = []
    for i in range(warmup + repeats):
        output = os.path.join(folder, f"wrap-{i}.out")
        command = ["sbatch", "--parsable", "--ntasks=1", "--job-name=bench-sbatch-wrap",
                   f"--output={output}", f"--chdir={folder}",
                   f"--wrap={sys.executable} -c \"{HELLO}\""]
        start = time.perf_counter()
        subprocess.run(command, check=True, capture_output=True, text=True, timeout=TIMEOUT)
        while True:
            try:
                with open(output, "rb") as file:
                    if file.read().startswith(b"hello"):
                        break
            except FileNotFoundError:
                pass
            if time.perf_counter() - start > TIMEOUT:
                raise RuntimeError(f"sbatch --wrap printed nothing within {TIMEOUT:g} s ({output})")
            time.sleep(POLL)
        if i >= warmup:
            samples.append(time.perf_counter() - start)
    return from_samples(samples)


def srun(repeats: int, warmup: int) -> tuple[Stats, Stats]:
    """``srun python -c print(...)``: until its first output line, and until it exits."""
    return command_hello(["srun", "--ntasks=1", "--job-name=bench-srun", sys.executable, "-c", HELLO],
                         repeats, warmup, TIMEOUT)


# -- fiberlite ------------------------------------------------------------------------------------
def pool_until_every_worker(ctx: Any, workers: int) -> tuple[Any, float]:
    """A new ``Pool(workers)`` and the seconds until each of its workers ran a task."""
    start = time.perf_counter()
    pool = ctx.Pool(workers)
    seen: set[int] = set()
    while len(seen) < workers:
        seen.update(pool.map(pid_after, [0.05] * workers, 1))
        if time.perf_counter() - start > TIMEOUT:
            pool.terminate()
            raise RuntimeError(f"only {len(seen)} of {workers} workers ran a task within {TIMEOUT:g} s")
    return pool, time.perf_counter() - start


def map_batch(pool: Any, task: float, workers: int) -> float:
    """Seconds for ``pool.map`` of sleeps of ``task`` seconds worth 1 s of ideal time."""
    count = round(workers / task)
    start = time.perf_counter()
    pool.map(nap, [task] * count)
    return time.perf_counter() - start


def slurm_jobs_of(run_id: str) -> int:
    """How many Slurm jobs fiberlite's run ``run_id`` made (what squeue still shows)."""
    from fiberlite.backends.slurm import commands
    return sum(1 for row in commands.squeue() if row.labels.get("fiberlite/run") == run_id)


def main() -> None:
    p = parser("The slurm backend: job start vs sbatch --wrap and srun; Pool(N) on Slurm vs local.")
    p.add_argument("--workers", type=int, default=8, help="pool size N (default 8: a node of the "
                                                          "test cluster, one Slurm job)")
    p.add_argument("--tasks", default="0.01,0.001",
                   help="task durations in seconds for the map test (default 0.01,0.001)")
    args = p.parse_args()
    missing = [tool for tool in ("sbatch", "srun", "squeue") if shutil.which(tool) is None]
    if missing:
        sys.exit(f"bench_slurm.py: {', '.join(missing)} not on PATH: run it on a node of a Slurm "
                 "cluster (here: .ci/slurm_setup.sh, then SLURM_CONF=/tmp/fiberlite-slurm/slurm.conf)")
    import fiberlite
    from fiberlite.runtime import identity
    workers = args.workers
    repeats = sized(args, 10, 2)
    map_repeats = sized(args, 3, 1)
    tasks = [float(t) for t in args.tasks.split(",") if t]
    folder = tempfile.mkdtemp(prefix="bench-slurm-")
    fiberlite.init(slurm_dir=os.path.join(folder, "jobs"))
    slurm = fiberlite.get_context("slurm")
    local = fiberlite.get_context("local")
    report = Report("slurm", "slurm backend: job start vs sbatch --wrap and srun; Pool(N) on Slurm "
                    "vs the local backend on the same node", repeats=repeats, map_repeats=map_repeats,
                    workers=workers, tasks=tasks)

    bare = "sbatch --wrap: output file has the line"
    start = report.section("start", "start a job", unit="job", reference=bare,
                           note="sbatch/srun rows: python -c print(...) with this interpreter; "
                                "the sbatch output file polled every 5 ms")
    progress("measuring sbatch --wrap ...")
    start.add(bare, sbatch_wrap(repeats, 1, folder))
    progress("measuring srun ...")
    srun_first, srun_whole = srun(repeats, 1)
    start.add("srun: first line", srun_first)
    start.add("srun: until it exits", srun_whole)
    progress("measuring fiberlite slurm jobs ...")
    fl_first, fl_whole = first_message(slurm, repeats, 1, TIMEOUT)
    start.add("fiberlite slurm: start() to first message", fl_first)
    start.add("fiberlite slurm: start() + join()", fl_whole)
    progress("measuring fiberlite local jobs ...")
    local_first, _ = first_message(local, repeats, 1, TIMEOUT)
    start.add("fiberlite local: start() to first message", local_first)

    pool_start = report.section("pool_start", f"Pool({workers}) until every worker ran a task",
                                unit="pool", reference="fiberlite local")
    pools = {}
    before = slurm_jobs_of(identity.run_id())
    for name, ctx in (("fiberlite local", local), ("fiberlite slurm", slurm),
                      ("mp spawn", multiprocessing.get_context("spawn"))):
        progress(f"starting {name} Pool({workers}) ...")
        pools[name], seconds = pool_until_every_worker(ctx, workers)
        pool_start.add(name, from_samples([seconds]))
    hosts = slurm_jobs_of(identity.run_id()) - before
    try:
        for task in tasks:
            count = round(workers / task)
            label = f"{task * 1000:g} ms"
            section = report.section(f"map_{label.replace(' ', '')}",
                                     f"Pool({workers}): map {count} tasks of {label} (ideal 1 s)",
                                     unit="batch", reference="fiberlite local",
                                     note="the pools warm; ideal: tasks x duration / workers")
            section.add("ideal", from_samples([count * task / workers]))
            for name, pool in pools.items():
                progress(f"measuring map, {label} tasks: {name} ...")
                section.add(name, from_samples([map_batch(pool, task, workers) for _ in range(map_repeats)]))
    finally:
        for pool in pools.values():
            pool.terminate()
            pool.join()
    finish(report, args)
    difference = fl_first.median - start.reference_value()
    print(f"\nfiberlite slurm job start-to-first-message minus bare sbatch --wrap: "
          f"{difference * 1000:+.0f} ms (median)")
    print(f"Slurm jobs of fiberlite's Pool({workers}): {hosts}")
    shutil.rmtree(folder, ignore_errors=True)


if __name__ == "__main__":
    main()
