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

Run: ``python benchmarks/bench_docker.py [--image IMAGE] [--quick] [--json PATH]``
(IMAGE: the image setting, else ``fiberlite:test``; build it with ``docker build -t
IMAGE .`` or ``.ci/docker_setup.sh``).
"""
from __future__ import annotations

import multiprocessing
import os
import sys
import time
from typing import Any

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _common import (Report, Stats, command_hello, finish, first_message, from_samples,  # noqa: E402
                     parser, progress, sized)

POOL_SIZE = 5


# -- job bodies (module level: multiprocessing's spawn imports them by name) ---------------------
def nap(seconds: float) -> None:
    time.sleep(seconds)


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


def default_image() -> str:
    from fiberlite import config
    return config.get("image") or "fiberlite:test"


def main() -> None:
    p = parser("The docker backend: job start vs docker run, and pool overhead (Fiber paper).")
    p.add_argument("--image", default=None, help="image of the jobs (default: the image setting, "
                                                 "else fiberlite:test)")
    p.add_argument("--tasks", default="0.01,0.001",
                   help="task durations in seconds for the overhead test (default 0.01,0.001)")
    args = p.parse_args()
    import fiberlite
    image = args.image or default_image()
    fiberlite.init(image=image)
    docker_ctx = fiberlite.get_context("docker")
    repeats = sized(args, 10, 2)
    pool_repeats = sized(args, 3, 1)
    tasks = [float(t) for t in args.tasks.split(",") if t]
    report = Report("docker", "docker backend: job start vs a bare docker run; pool overhead",
                    image=image, repeats=repeats, pool_repeats=pool_repeats, pool_size=POOL_SIZE,
                    tasks=tasks)

    bare = "docker run --rm: first line"
    start = report.section("start", "start a container job", unit="job", reference=bare,
                           note="docker run rows: the docker CLI running python -c print(...) in the "
                                "same image with host networking")
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
    finish(report, args)
    difference = fl_first.median - bare_first.median
    print(f"\nfiberlite docker job start-to-first-message minus bare docker run first line: "
          f"{difference * 1000:+.0f} ms (median)")


if __name__ == "__main__":
    main()
