"""What watching connections for silence costs the master (``bench_scale.py --only liveness``).

Two tables, each measured in one run, rows interleaved:

- ``liveness_idle_N``: CPU seconds per second of this process (the master: its hub) while
  N connections to it stay idle, each from a real client in one of a few dialing
  processes, with ``peer_timeout`` 0 (nothing watched: the reference), 10 s (the
  default) and 2 s. An idle connection costs a probe and its answer per
  ``peer_timeout / 4``: this is the most liveness costs a master, a connection at a
  time (a pool's hosts, or pods that each run one worker).
- ``liveness_map_N``: the master's CPU per task over a ``chunksize=1`` map on a pool of
  N workers, with ``peer_timeout`` 0 and at the default. Busy connections carry no
  probe; what is left is the bookkeeping of each request.
"""
from __future__ import annotations

import argparse
import os
import subprocess
import sys
import time
from typing import Callable

from _common import Report, from_samples, interleave, progress, sized, sleep_task

DIALERS = 4  # processes the idle connections come from
TIMEOUTS = {"peer_timeout 0 (not watched)": 0.0, "peer_timeout 10 s (default)": 10.0,
            "peer_timeout 2 s": 2.0}
REFERENCE = next(iter(TIMEOUTS))
MAP_TIMEOUTS = {"peer_timeout 0 (not watched)": 0.0, "peer_timeout 10 s (default)": 10.0}
TASK_SECONDS = 0.005
DEFAULT = 10.0  # the setting's default, restored after each row

DIALER = r"""
import os, sys
from fiberlite.wire.client import Client
key = bytes.fromhex(os.environ.pop("BENCH_KEY"))
clients = [Client(sys.argv[1], key) for _ in range(int(sys.argv[2]))]
print("ready", flush=True)
sys.stdin.read()
os._exit(0)
"""


def set_timeout(seconds: float) -> None:
    """This process's ``peer_timeout`` (its hub watches with it from now on)."""
    import fiberlite
    from fiberlite.wire import liveness
    fiberlite.init(peer_timeout=seconds)
    liveness.reconfigure()


def idle_cpu(connections: int, seconds: float, window: float) -> float:
    """CPU seconds per second of this process while ``connections`` idle clients, in
    :data:`DIALERS` processes, are connected to its hub, all with ``peer_timeout`` =
    ``seconds``."""
    from fiberlite.runtime import identity
    from fiberlite.runtime.hub import get_hub
    set_timeout(seconds)
    hub = get_hub()
    env = dict(os.environ, BENCH_KEY=identity.key().hex(), FIBERLITE_PEER_TIMEOUT=str(seconds))
    shares = [connections // DIALERS + (i < connections % DIALERS) for i in range(DIALERS)]
    dialers = [subprocess.Popen([sys.executable, "-c", DIALER, hub.address, str(n)], env=env,
                                stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
               for n in shares if n]
    try:
        for dialer in dialers:
            if dialer.stdout.readline() != "ready\n":
                raise RuntimeError("a dialing process could not connect")
        time.sleep(window / 4)   # the first probes of every connection have come
        before, started = time.process_time(), time.perf_counter()
        time.sleep(window)
        return (time.process_time() - before) / (time.perf_counter() - started)
    finally:
        for dialer in dialers:
            dialer.stdin.close()
            dialer.wait(60)
        set_timeout(DEFAULT)


def map_cpu(workers: int, tasks: int, seconds: float) -> float:
    """The master's CPU seconds per task over a chunksize=1 map of ``tasks`` sleeps on a
    warmed pool of ``workers``, all with ``peer_timeout`` = ``seconds``."""
    import fiberlite
    set_timeout(seconds)
    pool = fiberlite.Pool(workers)
    try:
        pool.map(sleep_task, [0.0] * (4 * workers), 1)   # every worker started
        before = time.process_time()
        pool.map(sleep_task, [TASK_SECONDS] * tasks, 1)
        return (time.process_time() - before) / tasks
    finally:
        pool.terminate()
        pool.join()
        set_timeout(DEFAULT)


def bench_liveness(report: Report, args: argparse.Namespace, counts: list[int], tasks: int,
                   rounds: int) -> None:
    window = sized(args, 20.0, 1.0)
    for connections in counts:
        section = report.section(
            f"liveness_idle_{connections}", f"master CPU with {connections} idle connections",
            unit="second", reference=REFERENCE,
            note=f"CPU seconds of the master per second of wall time, over {window:g} s, while "
                 f"{connections} clients in {DIALERS} processes stay connected to its hub and "
                 f"send nothing: each probes every peer_timeout / 4, the master answers")
        samples = interleave({name: _measure(idle_cpu, connections, seconds, window)
                              for name, seconds in TIMEOUTS.items()}, rounds,
                             label=f"liveness, {connections} idle connections")
        for name, values in samples.items():
            section.add(name, from_samples(values), connections=connections)
    for workers in counts:
        section = report.section(
            f"liveness_map_{workers}",
            f"master CPU per task, map of {tasks:,} x sleep(5 ms), chunksize=1, {workers} workers",
            unit="task", reference=REFERENCE,
            note="user + system seconds of the master process over the map (warmed pool, "
                 "fiberlite's default packing of workers into jobs)")
        samples = interleave({name: _measure(map_cpu, workers, tasks, seconds)
                              for name, seconds in MAP_TIMEOUTS.items()}, rounds,
                             label=f"liveness, map on {workers} workers")
        for name, values in samples.items():
            section.add(name, from_samples(values), workers=workers, tasks=tasks)


def _measure(fn: Callable[..., float], *args: float) -> Callable[[], float]:
    def sample() -> float:
        progress(f"  {fn.__name__}{args}")
        return fn(*args)
    return sample
