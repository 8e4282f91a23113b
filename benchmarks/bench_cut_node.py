"""A node that goes silent mid-map, on Docker: one of a pool's containers cut off its network.

A ``Pool(4)`` on a Docker bridge network of this run's own maps 3,000 tasks of 20 ms
(about 15 s on 4 workers). A fifth of the way into the map, one of the 4 containers is
cut off with ``docker network disconnect --force``: no FIN and no RST ever reach
the master, the way a machine that loses power or a cut cable looks. The pool must
notice the silent worker (``peer_timeout``), run its tasks elsewhere and finish with
every result exact.

Rows (seconds per map, wall time): the same map undisturbed (the reference) and the map
with the cut; the note gives the seconds from the cut to the map's end. The network is
created with a unique name and removed at the end; all traffic stays on this machine.

Run: ``python benchmarks/bench_cut_node.py [--image IMAGE] [--tasks N] [--peer-timeout S]
[--quick] [--json PATH]`` (IMAGE: the image setting, else ``fiberlite:test``; build it
with ``.ci/docker_setup.sh``).
"""
from __future__ import annotations

import os
import subprocess
import sys
import time
import uuid
from typing import Any

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _common import Report, finish, from_samples, parser, progress, sized  # noqa: E402

WORKERS = 4
TASK_SECONDS = 0.02


def work(x: int) -> tuple[int, str]:
    time.sleep(TASK_SECONDS)
    return x * x, os.environ.get("FIBERLITE_DOCKER_CONTAINER", "")


def one_map(pool: Any, tasks: int, network: str | None, cut_after: float = 0.0
            ) -> tuple[float, float | None]:
    """Seconds of a ``map`` of ``tasks`` on ``pool``, and (``network`` given: one container
    is cut off it ``cut_after`` seconds into the map) seconds from the cut to the end."""
    victim = sorted({c for _, c in pool.map(work, range(4 * WORKERS), chunksize=1)})[0]
    started = time.perf_counter()
    result = pool.map_async(work, range(tasks), chunksize=1)
    cut = None
    if network is not None:
        time.sleep(cut_after)   # mid-map
        subprocess.run(["docker", "network", "disconnect", "--force", network, victim],
                       check=True, capture_output=True, timeout=60)
        cut = time.perf_counter()
        progress(f"  cut {victim} off {network}")
    results = result.get()
    ended = time.perf_counter()
    if [value for value, _ in results] != [x * x for x in range(tasks)]:
        raise RuntimeError("the map's results are not exact")
    return ended - started, None if cut is None else ended - cut


def main() -> None:
    p = parser("A pool's container cut off its network mid-map, on Docker")
    p.add_argument("--image", help="the job image (default: the image setting, else fiberlite:test)")
    p.add_argument("--tasks", type=int, help="tasks of 20 ms per map (default 3,000; --quick 400)")
    p.add_argument("--peer-timeout", type=float, help="the peer_timeout setting (default: its own)")
    args = p.parse_args()
    import fiberlite
    tasks = args.tasks or sized(args, 3000, 400)
    network = f"fiberlite-cut-{uuid.uuid4().hex[:8]}"
    subprocess.run(["docker", "network", "create", network], check=True, capture_output=True, timeout=60)
    settings: dict[str, Any] = {"backend": "docker", "docker_network": network,
                                "image": args.image or fiberlite.config.get("image") or "fiberlite:test"}
    if args.peer_timeout is not None:
        settings["peer_timeout"] = args.peer_timeout
    fiberlite.init(**settings)
    # (a version without liveness has no such setting: it can be measured for comparison)
    timeout = fiberlite.config.get("peer_timeout") if "peer_timeout" in fiberlite.config.SETTINGS else None
    report = Report("cut_node", "a Pool(4) map on Docker, one container cut off its network mid-map",
                    tasks=tasks, task_seconds=TASK_SECONDS, peer_timeout=timeout)
    try:
        with fiberlite.Pool(WORKERS) as pool:
            progress("undisturbed map ...")
            whole, _ = one_map(pool, tasks, None)
            progress("map with a container cut off ...")
            disturbed, after_cut = one_map(pool, tasks, network, cut_after=whole / 5)
    finally:
        for _ in range(30):   # the pool's containers are being removed
            if subprocess.run(["docker", "network", "rm", network], capture_output=True).returncode == 0:
                break
            time.sleep(1)
    section = report.section(
        "cut_map", f"Pool({WORKERS}) map of {tasks:,} x sleep(20 ms), chunksize=1, on Docker",
        unit="map", reference="undisturbed",
        note=f"peer_timeout {'(none)' if timeout is None else f'{timeout:g} s'}; the map ended "
             f"{after_cut:.1f} s after the cut, with every result exact")
    section.add("undisturbed", from_samples([whole]))
    section.add("one container cut off mid-map", from_samples([disturbed]), seconds_after_cut=after_cut)
    finish(report, args)


if __name__ == "__main__":
    main()
