"""A pool worker's requests: how much it asks for, and when (no pool, no process)."""
from __future__ import annotations

import time

from fiberlite.pool.chunks import pack, unpack
from fiberlite.pool.job.worker import BATCH_SECONDS, _Worker


class _Upstream:
    """Stands for the worker's way to the master: keeps what is sent."""

    direct = False

    def __init__(self) -> None:
        self.sent: list[tuple[str, tuple]] = []

    def begin(self, method: str, *args):
        self.sent.append((method, args))
        return len(self.sent)

    def cast(self, method: str, *args) -> None:
        self.sent.append((method, args))

    def finish(self, handle):
        self.sent.append(("answer", handle))
        return [], {}, [], False

    def call(self, method: str, *args):
        return self.finish(self.begin(method, *args))


def _worker(ema: float) -> _Worker:
    worker = _Worker(_Upstream(), 1, None)
    worker.ema = ema
    worker.more = True  # the master's last answer said more work is to come
    worker.functions[1] = ("map", abs)
    return worker


def test_a_short_task_worker_asks_for_the_next_batch_once_less_than_half_is_queued():
    worker = _worker(0.005)  # 5 ms a chunk: a batch of about 80 ms is 17 chunks
    assert worker._want() == 17 == int(BATCH_SECONDS / 0.005) + 1
    worker.queue.extend((cid, 1, pack([-cid])) for cid in range(1, 18))
    for _ in range(9):  # 16, 15, ... then 8 chunks queued: 40 ms of work or more
        worker._next()
    assert worker.up.sent == []
    worker._next()  # 7 queued: the next batch is asked for now
    ((method, (wid, entries, values, want, prefetch)),) = worker.up.sent
    assert (method, wid, entries, values, want, prefetch) == ("next", 1, [], None, 17, True)


def test_no_batch_is_asked_for_ahead_when_the_master_said_no_more_is_to_come():
    worker = _worker(0.005)
    worker.more = False
    worker.queue.extend((cid, 1, pack([-cid])) for cid in range(1, 6))
    for _ in range(5):
        worker._next()
    assert worker.up.sent == []


def test_results_due_to_leave_go_with_a_request_for_the_next_batch():
    worker = _worker(0.005)
    worker.queue.extend((cid, 1, pack([-cid])) for cid in (2, 3, 4))
    worker._run((1, 1, pack([-1])))
    worker.oldest = time.perf_counter() - 1.0  # the first result has waited long enough
    worker._run(worker.queue.popleft())
    ((method, (wid, entries, values, want, prefetch)),) = worker.up.sent
    assert (method, wid, entries, prefetch) == ("next", 1, [(1, None), (2, None)], True)
    assert unpack(values) == [[1], [2]] and want >= 1


def test_results_due_to_leave_go_one_way_when_a_request_is_in_flight():
    worker = _worker(0.005)
    worker.outstanding = 99  # a request for work is on its way already
    worker._run((1, 1, pack([-1])))
    worker.oldest = time.perf_counter() - 1.0
    worker._run((2, 1, pack([-2])))
    ((method, (wid, entries, values)),) = worker.up.sent
    assert (method, wid, entries, unpack(values)) == ("done", 1, [(1, None), (2, None)], [[1], [2]])


def test_a_new_calls_first_chunk_sizes_the_batches_afresh():
    worker = _worker(0.05)  # the last call's tasks took 50 ms: one chunk at a time
    worker.functions[2] = ("map", abs)
    assert worker._want() == 1
    worker._run((1, 2, pack([-1])))  # a chunk of another call, done in microseconds
    assert worker.ema < 0.001 and worker._want() > 1


def test_an_exiting_worker_waits_until_the_master_has_its_last_results():
    """The master may hear of a worker's end another way than from the worker (its host,
    its job's exit): had the last results not reached it by then, it would take their
    chunks back and run them again. A worker that exits hands them in and waits for the
    answer, which comes after what it sent one-way before."""
    worker = _worker(0.005)
    worker._run((1, 1, pack([-1])))
    worker.exiting = True  # the master said: exit
    assert worker._next() is None
    (method, (wid, entries, values)), answer = worker.up.sent
    assert (method, wid, entries, unpack(values)) == ("done", 1, [(1, None)], [[1]])
    assert answer == ("answer", 1), "the worker left before the master had its results"
