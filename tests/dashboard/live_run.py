"""A run with the dashboard on, driven line by line from stdin so that a test can
watch the page between steps. Each command answers with one line on stdout."""
import os
import signal
import sys
import time

import numpy as np

import fiberlite as mp


def slow_square(x):
    time.sleep(0.01)
    return x * x


def fails_on_threes(x):
    if x % 10 == 3:
        raise KeyError(f"no luck with {x}")
    return x


def sleeps(x):
    time.sleep(0.05)
    return x


def talks(lines):
    for i in range(lines):
        print(f"line {i} of a job", file=sys.stderr, flush=True)  # stdout answers the test


IMAP_ITEMS = 400  # more than an imap reads ahead (256): its input ends only as it is consumed
RING_FLOATS = 1024  # each all_reduce: 8 KiB


def reduces_until(ring, stop):
    """all_reduce until ``stop`` is set on any rank (the ranks agree through the
    reduction itself, so all call it as often); returns how many it made."""
    count = 0
    while True:
        data = np.ones(RING_FLOATS)
        data[0] = stop.is_set()
        total = ring.all_reduce(data)
        count += 1
        assert total[1] == ring.world_size
        if total[0]:
            return count
        time.sleep(0.01)


def main() -> None:
    if not os.environ.get("FIBERLITE_DASHBOARD"):  # else the first object starts the page:
        mp.init(dashboard="127.0.0.1:0")           # the pool, whose host jobs start together
    with mp.Pool(4) as pool:
        queue = mp.Queue()
        rings = []  # kept: the page shows rings that still exist
        stop = mp.Event()
        held = None  # an imap under way, its consumer waiting for the test
        print("ready", flush=True)
        for line in sys.stdin:
            command = line.strip()
            if command == "jobs":
                print("jobs", *sorted(c._popen.job.spec.name for c in mp.active_children()), flush=True)
            elif command == "imap":  # over a range: its length is known before it is read
                held = pool.imap(slow_square, range(IMAP_ITEMS))
                print("imap started", next(held), flush=True)  # the rest is read as consumed
            elif command == "imap-finish":
                print("imap", "exact" if [0, *held] == [x * x for x in range(IMAP_ITEMS)] else "WRONG", flush=True)
            elif command == "map":
                results = pool.map(slow_square, range(1000))
                print("map", "exact" if results == [x * x for x in range(1000)] else "WRONG", flush=True)
            elif command == "talk":
                job = mp.Process(target=talks, args=(300,))
                job.start()
                job.join()
                print("talked", job._popen.job.spec.name, flush=True)
            elif command == "ring":
                rings.append(mp.Ring(2, reduces_until, args=(stop,)))
                rings[-1].start()
                print("ring started", flush=True)
            elif command == "ring-stop":
                stop.set()
                rings[-1].join()
                print("ring-stopped", *rings[-1].results, flush=True)
            elif command == "put":
                queue.put("item")
                print("put", flush=True)
            elif command == "fail":
                try:
                    pool.map(fails_on_threes, range(20), chunksize=1)
                except KeyError:
                    print("failed", flush=True)
            elif command == "kill":
                pending = pool.map_async(sleeps, range(80), chunksize=1)
                time.sleep(0.3)  # let the workers hold tasks (the kill is the test, not a sync)
                os.kill(pool._pool[0].pid, signal.SIGKILL)
                print("kill", "exact" if pending.get(60) == list(range(80)) else "WRONG", flush=True)
            elif command == "quit":
                break
        queue.close()


if __name__ == "__main__":
    main()
