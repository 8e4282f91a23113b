"""Scripts that end without closing what they made: ``python exit_shapes.py SHAPE``.

Each shape makes its objects, uses them as far as the shape says, prints ``ready``
and the run id, and leaves: the test measures how long the interpreter takes to end
after that line, and checks that no job of the run is left.
"""
from __future__ import annotations

import sys
import time

import fiberlite as mp
from fiberlite.runtime import identity


def echo(x):
    return x


def sleep_long(seconds=600):
    time.sleep(seconds)
    return seconds


def set_event(event):
    global _started
    _started = event


def signal_then_sleep(x):
    _started.set()
    time.sleep(600)
    return x


def wait_forever(ready):
    ready.put("running")
    time.sleep(600)


def put_items(queue, count):
    for i in range(count):
        queue.put(i)


def ring_member(ring, done):
    total = ring.all_reduce(ring.rank, op="sum")
    done.put(total)
    return total


def pool_unused():
    return [mp.Pool(2)]


def pool_used():
    pool = mp.Pool(2)
    assert sum(pool.map(echo, range(10))) == 45
    return [pool]


def pool_mid_imap():
    pool = mp.Pool(2)
    results = pool.imap(echo, range(100_000))
    assert [next(results) for _ in range(10)] == list(range(10))
    return [pool, results]


def pool_running():
    started = mp.Event()
    pool = mp.Pool(2, initializer=set_event, initargs=(started,))
    pending = [pool.apply_async(signal_then_sleep, (i,)) for i in range(4)]
    assert started.wait(60), "no task started"
    return [pool, pending]


def pool_hosted():
    """Workers forked in host jobs (more workers than cores), tasks running."""
    started = mp.Event()
    pool = mp.Pool(8, initializer=set_event, initargs=(started,))
    pending = pool.map_async(signal_then_sleep, range(8), chunksize=1)
    assert started.wait(60), "no task started"
    return [pool, pending]


def leave_pool_open(done):
    pool = mp.Pool(2)
    done.put(sum(pool.map(echo, range(10))))


def pool_in_job():
    """A job that leaves its own pool open: it ends, and the script after it."""
    done = mp.Queue()
    process = mp.Process(target=leave_pool_open, args=(done,))
    process.start()
    assert done.get(timeout=60) == 45
    return [process, done]


def pool_dropped():
    """A pool collected while the script runs (its last reference dropped in a function)."""
    pool = mp.Pool(2)
    assert pool.map(echo, range(4)) == list(range(4))
    del pool
    return []


def daemon_process():
    ready = mp.Queue()
    process = mp.Process(target=wait_forever, args=(ready,), daemon=True)
    process.start()
    assert ready.get(timeout=60) == "running"
    return [process, ready]


def process_unjoined():
    """A non-daemon child that ends by itself: the exit waits for it (as multiprocessing).
    Its first item is taken before ``ready``, so that the time measured is the exit's, not
    the child's start."""
    queue = mp.Queue()
    process = mp.Process(target=put_items, args=(queue, 3))
    process.start()
    assert queue.get(timeout=60) == 0
    return [process, queue]


def manager_open():
    manager = mp.Manager()
    shared = manager.dict(a=1)
    items = manager.list(range(3))
    assert shared["a"] == 1 and len(items) == 3
    return [manager, shared, items]


def manager_started():
    from fiberlite.managers import SyncManager
    manager = SyncManager()
    manager.start()
    return [manager, manager.Queue()]


def queue_items():
    queue = mp.Queue()
    for i in range(1000):
        queue.put(i)
    joinable = mp.JoinableQueue()
    joinable.put("never done")
    return [queue, joinable]


def queue_child_items():
    queue = mp.Queue()
    process = mp.Process(target=put_items, args=(queue, 100))
    process.start()
    process.join()
    assert queue.get(timeout=60) == 0
    return [queue]


def ring_open():
    """A ring whose members did their work and are ending; never joined."""
    done = mp.Queue()
    ring = mp.Ring(2, ring_member, args=(done,))
    ring.start()
    assert [done.get(timeout=60) for _ in range(2)] == [1, 1]
    return [ring, done]


def everything():
    kept = []
    for shape in (pool_mid_imap, pool_running, daemon_process, manager_open, queue_items, ring_open):
        kept += shape()
    return kept


def raises():
    kept = pool_running() + manager_open()
    print("ready", identity.run_id(), flush=True)
    raise RuntimeError("the script failed with its pool open")


SHAPES = {name: obj for name, obj in list(globals().items())
          if callable(obj) and getattr(obj, "__module__", None) == __name__
          and name not in {"echo", "sleep_long", "set_event", "signal_then_sleep",
                           "wait_forever", "put_items", "ring_member", "leave_pool_open"}}


if __name__ == "__main__":
    kept = SHAPES[sys.argv[1]]()
    print("ready", identity.run_id(), flush=True)
