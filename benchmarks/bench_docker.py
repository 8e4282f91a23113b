"""The docker backend: job start latency against a bare ``docker run``, and the Fiber
paper's framework-overhead test with every pool worker a container.

Sections:

- ``start``: time from ``Process.start()`` until the parent receives the job's first
  message on a queue, next to ``docker run --rm --network host IMAGE python -c
  "print(...)"`` (the docker CLI, same image, same run) timed until its first output
  line and until it exits. Reference: the bare ``docker run``'s first line.
- ``overhead_<task>``: a pool of 5 workers maps tasks that sleep ``task`` seconds
  (10 ms, 1 ms; ``--tasks`` to change), the batch sized to 1 s of ideal wall time
  (500 x 10 ms, 5,000 x 1 ms). Reference: the ideal 1 s; ``multiprocessing`` (spawn),
  fiberlite local and fiberlite docker measured in the same run. Pools are started
  and warmed before timing.
- ``scale_*``: ``Pool(1000)`` packed in containers against the same pool on the local
  backend, its workers packed the same way (``--scale-per-job``, default one job per CPU
  as the local backend packs them): the time until every worker has run a task, and
  ``pool.map`` of 50,000 ``time.sleep(0.005)`` tasks with ``chunksize=1`` and the default
  chunksize. Reference: the local pool; one pool alive at a time, the two taking turns.

Run: ``python benchmarks/bench_docker.py [--image IMAGE] [--quick] [--json PATH]
[--only start|overhead|scale] [--scale-workers N] [--scale-tasks N] [--scale-per-job N]``
(IMAGE: the image setting, else ``fiberlite:test``; build it with ``docker build -t
IMAGE .`` or ``.ci/docker_setup.sh``).
"""
from __future__ import annotations

import math
import multiprocessing
import os
import sys
import time
from typing import Any

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _common import (Report, Stats, command_hello, finish, first_message, from_samples,  # noqa: E402
                     parser, pool_runner, progress, sized)

POOL_SIZE = 5
SCALE_TASK = 0.005  # seconds each task of the scale section sleeps
WARM_TIMEOUT = 300.0  # seconds a big pool may take until every worker has run a task


# -- job bodies (module level: multiprocessing's spawn imports them by name) ---------------------
def nap(seconds: float) -> None:
    time.sleep(seconds)


def worker_name_after(seconds: float) -> str:
    """The fiberlite pool worker's name (pids repeat from one container to the next)."""
    import fiberlite
    time.sleep(seconds)
    return fiberlite.current_process().name


# -- measurements ---------------------------------------------------------------------------------
def docker_run(image: str, repeats: int, warmup: int) -> tuple[Stats, Stats]:
    """``docker run --rm --network host`` of the same image: to the first output line, to exit."""
    return command_hello(["docker", "run", "--rm", "--network", "host", image,
                          "python", "-c", "print('hello', flush=True)"], repeats, warmup)


def pool_overhead(ctx: Any, task: float, repeats: int) -> Stats:
    """Seconds for pool.map of a batch of ``task``-second sleeps worth 1 s of ideal time."""
    count = round(POOL_SIZE / task)
    with ctx.Pool(POOL_SIZE) as pool:
        pool.map(nap, [0.0] * (POOL_SIZE * 4))  # every worker up
        samples = []
        for _ in range(repeats):
            start = time.perf_counter()
            pool.map(nap, [task] * count)
            samples.append(time.perf_counter() - start)
    return from_samples(samples)


def scale_round(backend: str, ctx: Any, workers: int, per_job: int, tasks: int) -> dict[str, float]:
    """One pool of ``workers`` on ``ctx``'s backend, ``per_job`` workers a job: seconds until
    every worker has run a task, then of each map; terminated and joined however it ends."""
    import fiberlite
    fiberlite.init(workers_per_job=per_job)
    started = time.perf_counter()
    runner = pool_runner(backend, ctx.Pool(workers), workers)
    try:
        seen = runner.warm(worker_name_after, timeout=WARM_TIMEOUT)
        if len(seen) < workers:
            raise RuntimeError(f"only {len(seen)} of {workers} workers ran a task")
        times = {"up": time.perf_counter() - started}
        items = [SCALE_TASK] * tasks
        for key, chunksize in (("map_1", 1), ("map_default", None)):
            started = time.perf_counter()
            runner.map(nap, items, chunksize)
            times[key] = time.perf_counter() - started
        return times
    finally:
        runner.close()
        fiberlite.init(workers_per_job=None)


def bench_scale(report: Report, contexts: list[tuple[str, Any]], workers: int, per_job: int,
                tasks: int, rounds: int) -> None:
    jobs = math.ceil(workers / per_job)
    ideal = math.ceil(tasks / workers) * SCALE_TASK
    names = {"local": f"fiberlite local, {jobs} host jobs of {per_job}",
             "docker": f"fiberlite docker, {jobs} containers of {per_job}"}
    sections = {
        "up": report.section(f"scale_{workers}_up", f"Pool({workers}) until every worker has run a task",
                             unit="pool", reference=names["local"]),
        "map_1": report.section(f"scale_{workers}_map_1",
                                f"Pool({workers}): map of {tasks:,} x sleep(5 ms), chunksize=1",
                                unit="map call", reference=names["local"],
                                note=f"ideal wall time {ideal:.2f} s"),
        "map_default": report.section(f"scale_{workers}_map_default",
                                      f"Pool({workers}): map of {tasks:,} x sleep(5 ms), default chunksize",
                                      unit="map call", reference=names["local"],
                                      note=f"ideal wall time {ideal:.2f} s")}
    samples: dict[str, dict[str, list[float]]] = {n: {k: [] for k in sections} for n in names}
    for turn in range(rounds):
        for backend, ctx in contexts:
            progress(f"scale: Pool({workers}) on {backend}, round {turn + 1}/{rounds} ...")
            for key, value in scale_round(backend, ctx, workers, per_job, tasks).items():
                samples[backend][key].append(value)
    for key, section in sections.items():
        for backend, name in names.items():
            section.add(name, from_samples(samples[backend][key]), workers=workers, per_job=per_job,
                        tasks=tasks)


def default_image() -> str:
    from fiberlite import config
    return config.get("image") or "fiberlite:test"


SECTIONS = ("start", "overhead", "scale")


def main() -> None:
    p = parser("The docker backend: job start vs docker run, pool overhead (Fiber paper), and a "
               "pool of a thousand workers packed in containers vs the same pool of local jobs.")
    p.add_argument("--image", default=None, help="image of the jobs (default: the image setting, "
                                                 "else fiberlite:test)")
    p.add_argument("--tasks", default="0.01,0.001",
                   help="task durations in seconds for the overhead test (default 0.01,0.001)")
    p.add_argument("--only", action="append", choices=SECTIONS,
                   help="run only these sections (repeatable; default all)")
    p.add_argument("--scale-workers", type=int, default=None,
                   help="workers of the scale section's pools (default 1000, --quick 8)")
    p.add_argument("--scale-tasks", type=int, default=None,
                   help="tasks of the scale section's maps (default 50000, --quick 400)")
    p.add_argument("--scale-per-job", type=int, default=None,
                   help="workers per container (and per local host job) in the scale section "
                        "(default: the workers shared among this machine's CPUs)")
    p.add_argument("--scale-rounds", type=int, default=1,
                   help="pools of each backend in the scale section, taking turns (default 1)")
    args = p.parse_args()
    import fiberlite
    image = args.image or default_image()
    fiberlite.init(image=image)
    docker_ctx = fiberlite.get_context("docker")
    only = set(args.only or SECTIONS)
    repeats = sized(args, 10, 2)
    pool_repeats = sized(args, 3, 1)
    tasks = [float(t) for t in args.tasks.split(",") if t]
    scale_workers = args.scale_workers or sized(args, 1000, 8)
    scale_tasks = args.scale_tasks or sized(args, 50_000, 400)
    per_job = args.scale_per_job or math.ceil(scale_workers / (os.cpu_count() or 1))
    report = Report("docker", "docker backend: job start vs a bare docker run; pool overhead; "
                    "a pool of many workers in containers vs local jobs",
                    image=image, repeats=repeats, pool_repeats=pool_repeats, pool_size=POOL_SIZE,
                    tasks=tasks, sections=sorted(only), scale_workers=scale_workers,
                    scale_tasks=scale_tasks, scale_per_job=per_job)
    difference = None
    if "start" in only:
        bare = "docker run --rm: first line"
        start = report.section("start", "start a container job", unit="job", reference=bare,
                               note="docker run rows: the docker CLI running python -c print(...) in "
                                    "the same image with host networking")
        progress("measuring docker run --rm ...")
        bare_first, bare_whole = docker_run(image, repeats, 1)
        progress("measuring fiberlite docker jobs ...")
        fl_first, fl_whole = first_message(docker_ctx, repeats, 1)
        progress("measuring fiberlite local jobs ...")
        local_first, _ = first_message(fiberlite.get_context("local"), repeats, 1)
        start.add(bare, bare_first)
        start.add("docker run --rm: until it exits", bare_whole)
        start.add("fiberlite docker: start() to first message", fl_first)
        start.add("fiberlite docker: start() + join()", fl_whole)
        start.add("fiberlite local: start() to first message", local_first)
        difference = fl_first.median - bare_first.median

    if "overhead" in only:
        contexts = [("mp spawn", multiprocessing.get_context("spawn")),
                    ("fiberlite local", fiberlite.get_context("local")),
                    ("fiberlite docker", docker_ctx)]
        for task in tasks:
            count = round(POOL_SIZE / task)
            label = f"{task * 1000:g} ms"
            section = report.section(f"overhead_{label.replace(' ', '')}",
                                     f"pool of {POOL_SIZE}: map {count} tasks of {label} (ideal 1 s)",
                                     unit="batch", reference="ideal",
                                     note="ratio = wall time / ideal (1.00x: no framework overhead)")
            section.add("ideal", from_samples([count * task / POOL_SIZE]))
            for name, ctx in contexts:
                progress(f"measuring pool overhead, {label} tasks: {name} ...")
                section.add(name, pool_overhead(ctx, task, pool_repeats))

    if "scale" in only:
        bench_scale(report, [("local", fiberlite.get_context("local")), ("docker", docker_ctx)],
                    scale_workers, per_job, scale_tasks, args.scale_rounds)
    finish(report, args)
    if difference is not None:
        print(f"\nfiberlite docker job start-to-first-message minus bare docker run first line: "
              f"{difference * 1000:+.0f} ms (median)")


if __name__ == "__main__":
    main()
