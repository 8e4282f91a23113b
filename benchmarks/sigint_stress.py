"""SIGINT stress: Ctrl-C during a blocking call raises KeyboardInterrupt at once.

    python benchmarks/sigint_stress.py                      # 1,000 tries of each wait
    python benchmarks/sigint_stress.py --tries 200 --path hub --where job
    python benchmarks/sigint_stress.py --json out.json      # the figures, for a test

A waiting process blocks in one kind of call at a time (``Lock.acquire``,
``Event.wait``, ``Condition.wait``, ``Semaphore.acquire``, ``Queue.get``,
``Pipe.recv``, ``SimpleQueue.get``, ``Barrier.wait``) on an object nobody will ever
release; a separate process (a plain ``python`` of its own, told by a pipe when the
waiter is about to wait) sends it SIGINT after a random delay, from 0 to a few
milliseconds, so that the signal lands at every moment of the call: before it blocks,
while it looks awake, while it sleeps. The waiter measures from the signal to the
KeyboardInterrupt it catches (both clocks are CLOCK_MONOTONIC, shared by the machine).

A *miss* is a call that did not raise within ``--bound`` seconds (0.1): if the signal
was lost, the call runs to its timeout (``--timeout``, 1 s) and only then raises
(counted as *lost* too); a call whose interruption left its object broken (another
exception, such as a lock no longer held on leaving ``with``) is an *error* and a miss.
``--where job`` runs the waits in a job of the run (the parent's objects, mapped or
through its hub), ``--where main`` in the process that made them; ``--path hub``
turns ``share_machine`` off, so that a job reaches them through the creator's hub;
``--path lane`` (with ``--where job``) turns it off in the job only, which then uses the
parent's objects (made with the machine's lanes and shared memory) as a process of
another machine would;
``--to-thread`` sends the signal to another thread of the waiting process (an idle
one), where the kernel may also deliver a Ctrl-C.
The standard library's ``multiprocessing`` (spawn) is measured in the same run as the
reference (``--where main`` only, not with ``--to-thread``; ``--no-reference`` skips it).
"""
from __future__ import annotations

import argparse
import json
import math
import os
import platform
import queue
import random
import signal
import subprocess
import sys
import threading
import time

KINDS = ("Lock.acquire", "Event.wait", "Condition.wait", "Semaphore.acquire", "Queue.get",
         "Pipe.recv", "SimpleQueue.get", "Barrier.wait")

TGKILL_MACHINES = ("x86_64", "aarch64")  # where the signalling process knows tgkill's number

# The signalling process: for each line "delay" on stdin, sleep that long, send SIGINT to
# the waiter and write the moment it did.
SIGNALLER = """
import ctypes, os, platform, signal, sys, time
pid, thread = int(sys.argv[1]), int(sys.argv[2])
TGKILL = {"x86_64": 234, "aarch64": 131}.get(platform.machine())
libc = ctypes.CDLL(None, use_errno=True)
for line in sys.stdin:
    delay = float(line)
    end = time.monotonic() + delay
    while time.monotonic() < end:
        pass
    sent = time.monotonic()
    if thread:
        libc.syscall(TGKILL, pid, thread, signal.SIGINT)
    else:
        os.kill(pid, signal.SIGINT)
    sys.stdout.write(f"{sent!r}\\n")
    sys.stdout.flush()
"""


def make_objects(mp) -> dict:
    """One object of each kind, in a state where waiting on it blocks."""
    lock = mp.Lock()
    lock.acquire()  # held for good: acquiring it again waits
    reader, writer = mp.Pipe(duplex=False)
    return {"lock": lock, "event": mp.Event(), "condition": mp.Condition(),
            "semaphore": mp.Semaphore(0), "queue": mp.Queue(), "pipe": (reader, writer),
            "simple": mp.SimpleQueue(), "barrier": mp.Barrier(2), "library": mp}


def waiter_for(kind: str, objects: dict, timeout: float):
    """The blocking call of ``kind`` (it waits up to ``timeout``), and what wakes a call
    that has no timeout of its own."""
    if kind == "Lock.acquire":
        return lambda: objects["lock"].acquire(timeout=timeout), None
    if kind == "Event.wait":
        return lambda: objects["event"].wait(timeout), None
    if kind == "Condition.wait":
        def wait_condition():
            with objects["condition"]:
                objects["condition"].wait(timeout)
        return wait_condition, None
    if kind == "Semaphore.acquire":
        return lambda: objects["semaphore"].acquire(timeout=timeout), None
    if kind == "Queue.get":
        def get():
            try:
                objects["queue"].get(timeout=timeout)
            except Exception:  # queue.Empty: ran to its timeout
                pass
        return get, None
    if kind == "Pipe.recv":
        reader, writer = objects["pipe"]
        return reader.recv, lambda: writer.send(None)
    if kind == "SimpleQueue.get":
        return objects["simple"].get, lambda: objects["simple"].put(None)
    if kind == "Barrier.wait":
        def wait_barrier():
            try:
                objects["barrier"].wait(timeout)
            except Exception:  # BrokenBarrierError: ran to its timeout
                pass
        return wait_barrier, None
    raise ValueError(kind)


def drain(kind: str, objects: dict) -> None:
    """Take out what a waker put that nobody read (it came after the interrupt). An
    object an interrupt left unusable (the standard library's SimpleQueue, interrupted
    in the middle of a message) is made again."""
    try:
        if kind == "Pipe.recv":
            while objects["pipe"][0].poll(0):
                objects["pipe"][0].recv()
        elif kind == "SimpleQueue.get":
            while not objects["simple"].empty():
                objects["simple"].get()
        elif kind == "Barrier.wait":  # an interrupted wait breaks it, as threading's
            if getattr(objects["library"], "__name__", "") == "fiberlite":
                objects["barrier"].reset()
            else:  # (the standard library's reset() can hang after it: a new one)
                objects["barrier"] = objects["library"].Barrier(2)
    except Exception:
        fresh = make_objects(objects["library"])
        key = {"Pipe.recv": "pipe", "SimpleQueue.get": "simple", "Barrier.wait": "barrier"}[kind]
        objects[key] = fresh[key]


def idle_thread() -> int:
    """The id (as the kernel knows it) of a thread of this process that only sleeps."""
    thread = threading.Thread(target=threading.Event().wait, daemon=True, name="idle")
    thread.start()
    return thread.native_id


def stress(kind: str, objects: dict, tries: int, timeout: float, max_delay: float,
           seed: int, to_thread: bool = False) -> list:
    """Interrupt ``tries`` calls of ``kind``; the latency of each, from the signal to the
    KeyboardInterrupt (``math.inf``: the call returned without raising). ``to_thread``:
    the signal is sent to another thread of this process than the waiting one."""
    rng = random.Random(seed)
    signaller = subprocess.Popen([sys.executable, "-c", SIGNALLER, str(os.getpid()),
                                  str(idle_thread() if to_thread else 0)],
                                 stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    call, wake = waiter_for(kind, objects, timeout)
    latencies = []
    try:
        for _ in range(tries):
            # log-uniform: as many signals in the first microseconds as in the last milliseconds
            delay = max_delay * 10 ** (-4 * rng.random())
            caught = None
            timer = threading.Timer(timeout, wake) if wake else None
            try:
                if timer:
                    timer.start()
                signaller.stdin.write(f"{delay!r}\n")
                signaller.stdin.flush()
                call()
                # returned: the signal was lost here, and is seen at the next check
                deadline = time.monotonic() + 5
                while time.monotonic() < deadline:
                    time.sleep(0.001)
            except KeyboardInterrupt:
                caught = time.monotonic()
            except Exception as exc:  # the interrupt broke the object: a failure too
                caught = exc
            finally:
                if timer:
                    timer.cancel()
            sent = float(signaller.stdout.readline())
            if isinstance(caught, Exception):
                latencies.append(f"{type(caught).__name__}: {caught}")
            else:
                latencies.append(caught - sent if caught is not None and caught - sent < timeout * 0.9
                                 else math.inf)
            drain(kind, objects)
    finally:
        signaller.stdin.close()
        signaller.wait(10)
    return latencies


def summary(outcomes: list, bound: float) -> dict:
    """The figures of one kind: ``misses`` (no KeyboardInterrupt within ``bound``),
    ``lost`` (the call ran to its timeout), ``errors`` (the interrupt left the object
    broken: another exception, the first one named) and latencies of those caught."""
    errors = [x for x in outcomes if isinstance(x, str)]
    latencies = [x for x in outcomes if not isinstance(x, str)]
    caught = sorted(x for x in latencies if x != math.inf)
    p99 = caught[min(len(caught) - 1, int(len(caught) * 0.99))] if caught else math.nan
    return {"tries": len(outcomes), "misses": sum(1 for x in latencies if x > bound) + len(errors),
            "lost": len(latencies) - len(caught), "errors": len(errors),
            "first_error": errors[0] if errors else None, "max": caught[-1] if caught else math.nan,
            "p99": p99, "median": caught[len(caught) // 2] if caught else math.nan}


def run_all(objects: dict, kinds: list[str], args) -> dict:
    return {kind: summary(stress(kind, objects, args.tries, args.timeout, args.max_delay,
                                 args.seed, args.to_thread), args.bound) for kind in kinds}


def in_job(objects, kinds, args, results) -> None:
    """The waits in a job (its objects are the parent's; pickled, for ``--path lane``);
    the figures back on ``results``."""
    signal.signal(signal.SIGINT, signal.default_int_handler)
    if args.path == "lane":  # (as a process of another machine, before the objects come)
        import pickle
        import fiberlite
        fiberlite.init(share_machine=False)
        objects = pickle.loads(objects)
    results.put(run_all(objects, kinds, args))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tries", type=int, default=1000, help="interrupted calls of each kind")
    parser.add_argument("--kinds", default=",".join(KINDS), help="comma-separated, of " + ", ".join(KINDS))
    parser.add_argument("--where", choices=("main", "job"), default="main")
    parser.add_argument("--path", choices=("shared", "hub", "lane"), default="shared")
    parser.add_argument("--timeout", type=float, default=1.0, help="each call's own timeout (s)")
    parser.add_argument("--bound", type=float, default=0.1, help="a later KeyboardInterrupt is a miss (s)")
    parser.add_argument("--max-delay", type=float, default=0.003, help="longest signal delay (s)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--to-thread", action="store_true",
                        help="signal another thread of the waiting process (Linux)")
    parser.add_argument("--no-reference", action="store_true", help="skip multiprocessing")
    parser.add_argument("--json", help="write the figures here")
    args = parser.parse_args()
    kinds = args.kinds.split(",")
    if unknown := set(kinds) - set(KINDS):
        parser.error(f"unknown kinds {sorted(unknown)}: choose among {', '.join(KINDS)}")
    if args.to_thread and (sys.platform != "linux" or platform.machine() not in TGKILL_MACHINES):
        parser.error(f"--to-thread needs Linux on {' or '.join(TGKILL_MACHINES)}")
    if args.path == "lane" and args.where != "job":
        parser.error("--path lane is a job's path: add --where job")
    signal.signal(signal.SIGINT, signal.default_int_handler)

    import fiberlite
    if args.path == "hub":
        fiberlite.init(share_machine=False)
    rows = {}
    if args.to_thread and not args.no_reference:
        print("multiprocessing not measured with --to-thread: its waits see a signal that came "
              "to another thread only when they end (nearly every try runs to its timeout)")
    elif not args.no_reference and args.where == "main":
        import multiprocessing
        rows["multiprocessing"] = run_all(make_objects(multiprocessing.get_context("spawn")),
                                          kinds, args)
    objects = make_objects(fiberlite)
    if args.where == "main":
        rows["fiberlite"] = run_all(objects, kinds, args)
    else:
        results = fiberlite.Queue()
        if args.path == "lane":
            from fiberlite.wire.pickling import dumps_bytes
            objects = dumps_bytes(objects)
        job = fiberlite.Process(target=in_job, args=(objects, kinds, args, results))
        job.start()
        while True:
            try:
                rows["fiberlite"] = results.get(timeout=1)
                break
            except queue.Empty:
                if not job.is_alive():
                    sys.exit(f"the waiting job ended before it reported: exit code {job.exitcode}")
        job.join()
    print(f"SIGINT into blocking calls: {args.tries} tries per kind, where={args.where}, "
          f"path={args.path}{', to another thread' if args.to_thread else ''}, "
          f"miss = no KeyboardInterrupt within {args.bound * 1000:g} ms")
    print(f"{'library':<16} {'call':<18} {'misses':>6} {'lost':>5} {'errors':>6} "
          f"{'median ms':>10} {'p99 ms':>8} {'max ms':>8}")
    for library, figures in rows.items():
        for kind, f in figures.items():
            print(f"{library:<16} {kind:<18} {f['misses']:>6} {f['lost']:>5} {f['errors']:>6} "
                  f"{f['median'] * 1000:>10.3f} {f['p99'] * 1000:>8.3f} {f['max'] * 1000:>8.3f}")
    for library, figures in rows.items():
        for kind, f in figures.items():
            if f["first_error"]:
                print(f"{library} {kind}: left broken by an interrupt: {f['first_error']}")
    if args.json:
        with open(args.json, "w") as file:
            json.dump({"tries": args.tries, "where": args.where, "path": args.path,
                       "to_thread": args.to_thread, "bound": args.bound, "rows": rows}, file,
                      indent=1)


if __name__ == "__main__":
    main()
