"""Items/s through a queue of one machine for a job that uses it as a job of another
machine would (``share_machine`` off in that job: it cannot reach the queue's lane and
goes through the creator's hub), with the creator's lanes and without.

Rows (small items, ints):

- a remote job is the sole consumer: the parent puts ``--items`` items, the job gets
  them (timed in the job, from its first item to its last);
- a remote job is the sole producer: the job puts, the parent gets (timed in the
  parent, from the first item to the last);
- four remote jobs consume: the parent puts ``--items`` items, then a ``None`` for each
  job, and each job gets until its ``None`` (timed in the parent, from its first put to
  the jobs' last report; a round that left items in the queue is an error).

Sides, each a process of its own that takes turns with the others for ``--rounds``
rounds (a row's figure is its best round): fiberlite as it is (the creator has lanes),
fiberlite with ``FIBERLITE_SHARE_MACHINE=0`` in the creator too (no lane: the queue
lives in the creator's hub and a sole consumer or producer is linked to it, as every
queue was before lanes), and with ``--before ROOT`` fiberlite from another source tree
(an older commit's, for a before/after comparison). There is no stdlib row: a
``multiprocessing`` queue does not cross machines.

Run: ``python benchmarks/bench_lane_remote.py [--quick] [--items N] [--rounds R]
[--before ROOT ...] [--json PATH]``
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from typing import Any

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _common import Report, from_samples, finish, parser, progress, sized  # noqa: E402

LANES = "fiberlite (lanes)"
NO_LANES = "fiberlite, creator without lanes"
ROWS = {"consumer": "a job of another machine gets, the parent puts",
        "producer": "a job of another machine puts, the parent gets",
        "consumers": "four jobs of another machine get until None, the parent puts"}
CONSUMERS = 4
TIMEOUT = 300.0


# -- in a side's process ----------------------------------------------------------------------
def remote_get(blob: bytes, count: int, out: Any) -> None:
    import pickle

    import fiberlite
    fiberlite.init(share_machine=False)
    q = pickle.loads(blob)
    q.get(timeout=60)
    start = time.perf_counter()
    for _ in range(count - 1):
        q.get(timeout=60)
    out.put((time.perf_counter() - start) / (count - 1))


def remote_count(blob: bytes, out: Any) -> None:
    import pickle

    import fiberlite
    fiberlite.init(share_machine=False)
    q = pickle.loads(blob)
    got = 0
    while q.get(timeout=60) is not None:
        got += 1
    out.put(got)


def remote_put(blob: bytes, count: int) -> None:
    import pickle

    import fiberlite
    fiberlite.init(share_machine=False)
    q = pickle.loads(blob)
    for i in range(count):
        q.put(i)


def serve(row: str, count: int) -> float:
    """One round of ``row`` in this process: seconds per item."""
    import fiberlite
    from fiberlite.wire.pickling import dumps_bytes
    q, out = fiberlite.Queue(), fiberlite.Queue()
    if row == "consumer":
        p = fiberlite.Process(target=remote_get, args=(dumps_bytes(q), count, out))
        p.start()
        for i in range(count):
            q.put(i)
        seconds = out.get(timeout=TIMEOUT)
    elif row == "consumers":
        jobs = [fiberlite.Process(target=remote_count, args=(dumps_bytes(q), out)) for _ in range(CONSUMERS)]
        for p in jobs:
            p.start()
        start = time.perf_counter()
        for i in range(count):
            q.put(i)
        for _ in jobs:
            q.put(None)
        got = sum(out.get(timeout=TIMEOUT) for _ in jobs)
        seconds = (time.perf_counter() - start) / count
        for p in jobs:
            p.join(60)
        if got != count:
            raise SystemExit(f"{count - got} of {count} items left in the queue")
        return seconds
    else:
        p = fiberlite.Process(target=remote_put, args=(dumps_bytes(q), count))
        p.start()
        q.get(timeout=60)
        start = time.perf_counter()
        for _ in range(count - 1):
            q.get(timeout=60)
        seconds = (time.perf_counter() - start) / (count - 1)
    p.join(60)
    return seconds


# -- the run ------------------------------------------------------------------------------------
def side_env(label: str, root: str | None) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k != "FIBERLITE_SHARE_MACHINE"}
    if label == NO_LANES:
        env["FIBERLITE_SHARE_MACHINE"] = "0"
    if root is not None:
        env["PYTHONPATH"] = os.pathsep.join([os.path.abspath(root), env.get("PYTHONPATH", "")]).rstrip(os.pathsep)
    return env


def one_round(env: dict[str, str], row: str, count: int, cwd: str | None) -> float | str:
    """One round of a side (``cwd``: the source tree it imports, where it runs, since a job
    started with ``python -m`` imports from its working directory first)."""
    try:
        done = subprocess.run([sys.executable, os.path.abspath(__file__), "--serve", row, str(count)],
                              env=env, cwd=cwd, capture_output=True, text=True, timeout=TIMEOUT)
    except subprocess.TimeoutExpired:
        return f"no answer within {TIMEOUT:.0f} s"
    if done.returncode != 0:
        lines = (done.stderr or done.stdout).strip().splitlines()
        return lines[-1] if lines else f"exit code {done.returncode}"
    return json.loads(done.stdout.strip().splitlines()[-1])


def main() -> None:
    if len(sys.argv) == 4 and sys.argv[1] == "--serve":
        print(json.dumps(serve(sys.argv[2], int(sys.argv[3]))))
        return
    p = parser("Items/s through a queue for a job of another machine, with the creator's lanes and without.")
    p.add_argument("--items", type=int, help="items a round (5000; --quick 500)")
    p.add_argument("--rounds", type=int, help="rounds per row and side; a row's figure is its best (3; --quick 1)")
    p.add_argument("--before", action="append", default=[], metavar="ROOT",
                   help="also fiberlite from this source tree (repeatable)")
    args = p.parse_args()
    count = args.items or sized(args, 5000, 500)
    rounds = args.rounds or sized(args, 3, 1)
    sides = [(LANES, side_env(LANES, None), None), (NO_LANES, side_env(NO_LANES, None), None)]
    sides += [(f"fiberlite {root}", side_env(LANES, root), os.path.abspath(root)) for root in args.before]
    report = Report("lane_remote", "items/s through a queue for a job of another machine",
                    items=count, rounds=rounds, sides=[label for label, _, _ in sides])
    for row, title in ROWS.items():
        progress(f"{title} ...")
        samples: dict[str, list[float]] = {label: [] for label, _, _ in sides}
        errors: dict[str, str] = {}
        for round_ in range(rounds):
            shift = round_ % len(sides)
            for label, env, cwd in sides[shift:] + sides[:shift]:
                if label in errors:
                    continue
                got = one_round(env, row, count, cwd)
                if isinstance(got, str):
                    errors[label] = got
                else:
                    samples[label].append(got)
        section = report.section(row, title, unit="item", reference=NO_LANES, stat="best")
        for label, _, _ in sides:
            if label in errors:
                section.skip(label, errors[label])
            else:
                section.add(label, from_samples(samples[label]),
                            items_per_second=1 / min(samples[label]))
    finish(report, args)


if __name__ == "__main__":
    main()
