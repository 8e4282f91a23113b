"""Job targets of the same-machine pattern tests (tests/test_queue_patterns.py)."""
from __future__ import annotations

import pickle
import time

import fiberlite
import fiberlite.queues


def put_tagged(q, tag: int, count: int) -> None:
    for i in range(count):
        q.put((tag, i))


def get_until_none(q, out, joinable: bool = False) -> None:
    """Get until None; report what was got (marking each done on a JoinableQueue)."""
    got = []
    simple = isinstance(q, fiberlite.queues.SimpleQueue)
    while True:
        item = q.get() if simple else q.get(timeout=60)
        if joinable:
            q.task_done()
        if item is None:
            break
        got.append(item)
    out.put(got)


def remote_reader_holding(blob: bytes, count: int, out, done) -> None:
    """As a process of another machine, the queue's one reader: get ``count`` items (in
    batches), report them and how many more it holds, then wait for ``done`` while what
    it holds goes back, not taken for half a second."""
    from fiberlite.runtime.lanes import lending
    fiberlite.init(share_machine=False)
    lending.HOLD_SECONDS = 0.5
    q = pickle.loads(blob)
    got = [q.get(timeout=60) for _ in range(count)]
    out.put((got, len(lending.reader(q._ref)._held)))
    done.wait(60)


def count_until_none(blob: bytes, out, remote: bool) -> None:
    """Get from the queue in ``blob`` until None (``remote``: as a process of another
    machine, through the creator's hub); report how many items came before it."""
    if remote:
        fiberlite.init(share_machine=False)
    q = pickle.loads(blob)
    assert (q._lane is None) == remote
    got = 0
    while q.get(timeout=60) is not None:
        got += 1
    out.put(got)


def ticketed_sends(send, lock, ticket, count: int) -> None:
    """``count`` times: under ``lock``, take the next ticket and send it; a send that
    returned must be ahead of the sends made after it, in any process."""
    for _ in range(count):
        with lock:
            ticket.value += 1
            send(ticket.value)


def ticketed_pipe(conn, lock, ticket, count: int) -> None:
    ticketed_sends(conn.send, lock, ticket, count)


def ticketed_queue(q, lock, ticket, count: int) -> None:
    ticketed_sends(q.put, lock, ticket, count)


def start_grandchild(target, args, done) -> None:
    """Start ``target(*args)`` as a grandchild of the test, wait for it, report its exit."""
    p = fiberlite.Process(target=target, args=args)
    p.start()
    p.join(120)
    done.put(p.exitcode)


def through_the_hub(blob: bytes, action: str, out) -> None:
    """Use a queue or pipe as a process of another machine would (no lane: the creator's
    hub acts for it); ``blob`` is the object pickled by the test."""
    fiberlite.init(share_machine=False)
    obj = pickle.loads(blob)
    if action == "queue":
        assert obj._lane is None
        for i in range(300):
            obj.put(i)
        out.put([obj.get(timeout=30) for _ in range(3)])
        out.put(obj.qsize())
    elif action == "joinable":
        items = [obj.get(timeout=30) for _ in range(5)]
        for _ in items:
            obj.task_done()
        out.put(items)
    elif action == "pipe":
        assert obj._lanes is None
        out.put(obj.poll(30))
        got = [obj.recv() for _ in range(3)]
        obj.send_bytes(b"raw")
        for item in got:
            obj.send(item * 10)
        out.put(got)
        try:
            obj.recv()
        except EOFError:
            out.put("EOF")


def init_queue(q) -> None:
    global _pool_queue
    _pool_queue = q


def put_square(x: int) -> int:
    _pool_queue.put(x * x)
    return x


def put_large(q, count: int, size: int) -> None:
    for i in range(count):
        q.put(bytes([i % 256]) * size)


def mixed_items() -> list:
    """Items of every kind a lane carries: small pickles, a pickle with an out-of-band
    buffer, a message over the lane's inline size (a memfd), None."""
    import numpy as np
    return [1, "two", np.arange(10, dtype=np.int64), b"\x03" * 100_000, None, (6, [7]),
            np.arange(50_000, dtype=np.float64), 8]


def put_mixed(q, rounds: int) -> None:
    for _ in range(rounds):
        for item in mixed_items():
            q.put(item)


def count_and_mark_done(q, done) -> None:
    """Take items until None, adding each to ``done`` before marking it done."""
    while True:
        item = q.get(timeout=60)
        if item is not None:
            with done.get_lock():
                done.value += 1
        q.task_done()
        if item is None:
            return


def thousand_passes(barrier, passes: int, conn, lock) -> None:
    """CPython's ``_TestBarrier._test_thousand_f``: pass the barrier, then send the pass
    number under the lock."""
    for i in range(passes):
        barrier.wait()
        with lock:
            conn.send(i)


def ticketed_run(ctx, kind: str, writers: int, count: int) -> list:
    """Start ``writers`` jobs of ``ctx`` that each send ``count`` tickets through one
    ``kind`` (Pipe, SimpleQueue, Queue) under one lock; the tickets as read, in order."""
    lock, ticket = ctx.Lock(), ctx.Value("i", 0, lock=False)
    if kind == "Pipe":
        reader, writer = ctx.Pipe(duplex=False)
        target, handle, receive = ticketed_pipe, writer, reader.recv
    else:
        q = getattr(ctx, kind)()
        target, handle, receive = ticketed_queue, q, q.get
    jobs = [ctx.Process(target=target, args=(handle, lock, ticket, count)) for _ in range(writers)]
    for p in jobs:
        p.start()
    got = [receive() for _ in range(writers * count)]
    for p in jobs:
        p.join(120)
        assert p.exitcode == 0
    return got


def remote_batch_reader(blob: bytes, count: int, out, ready, stall: bool) -> None:
    """As a process of another machine: get ``count`` items of the queue in ``blob``,
    report them and how many more this process holds (got in batches, not yet taken);
    ``stall``: wait until it has given those back for not taking them, else keep them
    (until it is killed). Then set ``ready`` and wait to be killed."""
    from fiberlite.runtime.lanes import lending
    fiberlite.init(share_machine=False)
    lending.HOLD_SECONDS = 0.1 if stall else 600.0
    q = pickle.loads(blob)
    assert q._lane is None
    got = [q.get(timeout=60) for _ in range(count)]
    reader = lending.reader(q._ref)
    out.put((got, len(reader._held)))
    out.close()
    out.join_thread()  # (the report has reached the parent)
    if stall:
        deadline = time.monotonic() + 60
        while reader._held and time.monotonic() < deadline:
            time.sleep(0.01)
        q.qsize()  # (a call to the hub: the give-back sent before it is handled)
    ready.set()
    time.sleep(600)
