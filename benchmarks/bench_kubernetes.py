"""Pools on Kubernetes at scale, against the API server double of the test suite.

The double (``tests/k8s_double``, described in ``docs/kubernetes/double.md``) serves the
API the official client speaks and runs each pod's command as a local process: pod
creation, the watch and the pods' processes are real; nodes, scheduling and images are
not. A pool of ``--workers`` workers is packed into ``--pods`` pods (the ``cpu`` setting
is the workers per pod). For each sample a new pool is made and measured from the
``Pool()`` call:

- ``returned``: until ``Pool()`` returns (its first round of pods is created; the pool
  creates the rest while it maps);
- ``create``: until every pod has been created (the double's log of requests);
- ``first``: until the first task's result is back;
- ``ready``: until every worker has run a task.

Rows: pods created 16 at a time (fiberlite's default) against one at a time (the
reference), after an untimed round of each (the run's Secret, session and watch). The notes give the pod creation rate and how many watches followed the pods.

Run: ``python benchmarks/bench_kubernetes.py [--quick] [--json PATH] [--workers 1000 --pods 50]``
"""
from __future__ import annotations

import argparse
import os
import secrets
import sys
import tempfile
import threading
import time
from pathlib import Path

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.join(os.path.dirname(HERE), "tests"))
from _common import (Report, finish, from_samples, interleave, parser, pid_after,  # noqa: E402
                     progress, sized)

ROWS = {"16 at a time": 16, "one at a time": 1}
REFERENCE = "one at a time"
READY_TIMEOUT = 600.0


class Cluster:
    """The double, and fiberlite's settings pointing at it."""

    def __init__(self, workers_per_pod: int) -> None:
        from k8s_double.fixture import write_kubeconfig
        from k8s_double.server import ApiServerDouble

        import fiberlite
        token = secrets.token_hex(16)
        self.server = ApiServerDouble(token=token)
        self.folder = tempfile.TemporaryDirectory()
        kubeconfig = write_kubeconfig(Path(self.folder.name) / "kubeconfig", self.server.host, token)
        # pods run `python` from PATH: this interpreter
        os.environ["PATH"] = os.path.dirname(sys.executable) + os.pathsep + os.environ["PATH"]
        # the double's pods are processes of this machine: they see its files, as pods of an
        # image holding the code would, so no working directory travels (bench_workdir.py
        # measures that)
        fiberlite.init(kubeconfig=str(kubeconfig), namespace="default", image="fiberlite:bench",
                       listen_host="127.0.0.1", cpu=workers_per_pod, working_dir="off")
        self.context = fiberlite.get_context("kubernetes")

    def requests(self, method: str, kind: str, watch: bool = False) -> int:
        return sum(1 for r in self.server.requests if r.method == method and r.path.endswith(kind)
                   and (r.query.get("watch") == "true") == watch)

    def close(self) -> None:
        from fiberlite.backends import get_backend
        get_backend("kubernetes").close()
        self.server.close()
        self.folder.cleanup()


def sample(cluster: Cluster, workers: int, concurrency: int, counts: dict[str, list[int]]) -> dict:
    """One pool: the three times in seconds from ``Pool()``."""
    from fiberlite.pool.master import core
    core.START_CONCURRENCY = concurrency
    pods_before = cluster.requests("POST", "/pods")
    watches_before = cluster.requests("GET", "/pods", watch=True)
    pods = -(-workers // core.workers_per_job(workers, cluster.context.Process))
    every_pod = threading.Event()
    started = time.perf_counter()
    created = [0.0]

    def watch_creations() -> None:  # the double's log of requests: every pod's POST
        while cluster.requests("POST", "/pods") - pods_before < pods:
            if every_pod.wait(0.01):
                return
        created[0] = time.perf_counter()
        every_pod.set()

    counter = threading.Thread(target=watch_creations, daemon=True)
    counter.start()
    pool = cluster.context.Pool(workers)
    try:
        returned = time.perf_counter()
        pool.apply(abs, (1,))
        first = time.perf_counter()
        seen: set[int] = set()
        deadline = time.monotonic() + READY_TIMEOUT
        while len(seen) < workers:
            if time.monotonic() > deadline:
                raise RuntimeError(f"only {len(seen)} of {workers} workers ran a task")
            seen.update(pool.map(pid_after, [0.05] * workers, 1))
        ready = time.perf_counter()
        counter.join()
    finally:
        every_pod.set()
        pool.terminate()
        pool.join()
    counts["pods"].append(cluster.requests("POST", "/pods") - pods_before)
    counts["watches"].append(cluster.requests("GET", "/pods", watch=True) - watches_before)
    return {"returned": returned - started, "create": created[0] - started,
            "first": first - started, "ready": ready - started}


def main() -> None:
    p = parser("pools of many workers packed into pods, on the Kubernetes API server double")
    p.add_argument("--workers", type=int, help="workers of the pool (default 1,000; --quick 16)")
    p.add_argument("--pods", type=int, help="pods they are packed into (default 50; --quick 4)")
    p.add_argument("--repeats", type=int, help="samples per row (default 2, --quick 1)")
    args: argparse.Namespace = p.parse_args()
    workers = args.workers or sized(args, 1000, 16)
    pods = args.pods or sized(args, 50, 4)
    if workers % pods:
        p.error("--workers must be a multiple of --pods")
    rounds = args.repeats or sized(args, 2, 1)
    report = Report("kubernetes", "pools packed into pods, on the Kubernetes API server double",
                    quick=args.quick, workers=workers, pods=pods, repeats=rounds)
    titles = {"returned": f"Pool({workers}) in {pods} pods until Pool() returns",
              "create": f"Pool({workers}) in {pods} pods until every pod is created",
              "first": f"Pool({workers}) in {pods} pods until the first result",
              "ready": f"Pool({workers}) in {pods} pods until every worker has run a task"}
    sections = {key: report.section(f"k8s_{key}", title, unit="pool", reference=REFERENCE)
                for key, title in titles.items()}
    cluster = Cluster(workers // pods)
    counts: dict[str, list[int]] = {"pods": [], "watches": []}
    try:
        progress(f"kubernetes: {workers} workers in {pods} pods, a warm-up and {rounds} round(s)")
        samples = interleave({name: (lambda c=concurrency: sample(cluster, workers, c, counts))
                              for name, concurrency in ROWS.items()}, rounds, warmup=1)
    finally:
        cluster.close()
    for name, values in samples.items():
        for key, section in sections.items():
            section.add(name, from_samples([v[key] for v in values]), workers=workers, pods=pods)
    rates = {name: f"{pods / min(v['create'] for v in values):.1f} pods/s"
             for name, values in samples.items()}
    sections["create"].note = (f"pods created per pool: {sorted(set(counts['pods']))}; creation rate: "
                               + ", ".join(f"{name} {rate}" for name, rate in rates.items()))
    sections["ready"].note = (f"watch requests during each pool: {sorted(set(counts['watches']))} "
                              "(one watch follows every pod of the run, resumed every "
                              "30 s; no request per pod)")
    finish(report, args)


if __name__ == "__main__":
    main()
