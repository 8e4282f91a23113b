"""Queue, SimpleQueue and JoinableQueue across jobs."""
from __future__ import annotations

import gc
import queue
import threading
import time
import weakref

import numpy as np
import pytest

import fiberlite
import jobs

pytestmark = pytest.mark.timeout(60)


def test_fifo_in_process_and_nowait_forms():
    q = fiberlite.Queue()
    for i in range(5):
        q.put(i)
    assert q.qsize() == 5 and not q.empty()
    assert [q.get() for _ in range(5)] == list(range(5))
    assert q.empty()
    with pytest.raises(queue.Empty):
        q.get_nowait()
    q.put_nowait("x")
    assert q.get_nowait() == "x"


def test_get_timeout_raises_empty_in_time():
    q = fiberlite.Queue()
    t0 = time.monotonic()
    with pytest.raises(queue.Empty):
        q.get(timeout=0.3)
    assert 0.25 <= time.monotonic() - t0 < 5


def test_bounded_queue_full_and_unblocks():
    q = fiberlite.Queue(maxsize=2)
    q.put(1)
    q.put(2)
    assert q.full()
    with pytest.raises(queue.Full):
        q.put(3, block=False)
    with pytest.raises(queue.Full):
        q.put(3, timeout=0.2)
    assert q.get() == 1
    q.put(3, timeout=1)
    assert [q.get(), q.get()] == [2, 3]


def test_bounded_queue_blocks_remote_producer_until_room():
    q = fiberlite.Queue(maxsize=3)
    p = fiberlite.Process(target=jobs.produce, args=(q, 0, 50))
    p.start()
    got = [q.get(timeout=30) for _ in range(50)]
    p.join()
    assert got == list(range(50))


def test_many_producers_and_consumers_nothing_lost_or_duplicated():
    q, out = fiberlite.Queue(), fiberlite.Queue()
    producers = [fiberlite.Process(target=jobs.produce, args=(q, i * 1000, 1000)) for i in range(3)]
    consumers = [fiberlite.Process(target=jobs.consume, args=(q, out)) for _ in range(2)]
    for p in producers + consumers:
        p.start()
    for p in producers:
        p.join()
    for _ in consumers:
        q.put(None)
    results = [out.get(timeout=30) for _ in consumers]
    for p in consumers:
        p.join()
    merged = sorted(x for part in results for x in part)
    assert merged == list(range(3000))


def test_child_puts_land_before_it_exits():
    q = fiberlite.Queue()
    p = fiberlite.Process(target=jobs.produce, args=(q, 0, 500))
    p.start()
    p.join()
    assert p.exitcode == 0
    assert q.qsize() == 500
    assert [q.get() for _ in range(500)] == list(range(500))


@pytest.mark.parametrize("size", [3, 300_000], ids=["small", "large"])
@pytest.mark.parametrize("kind", ["Queue", "SimpleQueue", "JoinableQueue"])
def test_numpy_arrays_travel_writable(kind, size):
    """Both ways (the job writes to what it got), in one process, and through a pipe."""
    q_in, q_out = getattr(fiberlite, kind)(), getattr(fiberlite, kind)()
    p = fiberlite.Process(target=jobs.array_roundtrip, args=(q_in, q_out))
    p.start()
    array = np.arange(size, dtype=np.float64)
    q_in.put(array)
    result = q_out.get()  # (a SimpleQueue's get has no timeout: the test's own bounds it)
    p.join()
    assert p.exitcode == 0  # the job's in-place write worked
    assert result.flags.writeable
    np.testing.assert_array_equal(result, array * 2)
    q_out.put(array)
    assert q_out.get().flags.writeable
    a, b = fiberlite.Pipe()
    a.send(array)
    assert b.recv().flags.writeable


def test_closed_queue_rejects_use():
    q = fiberlite.Queue()
    q.close()
    q.join_thread()
    with pytest.raises(ValueError, match="closed"):
        q.put(1)
    with pytest.raises(ValueError, match="closed"):
        q.get()
    q2 = fiberlite.Queue()
    with pytest.raises(AssertionError):
        q2.join_thread()
    q2.cancel_join_thread()


def test_joinable_queue_task_done_and_join():
    q = fiberlite.JoinableQueue()
    p = fiberlite.Process(target=jobs.work_joinable, args=(q,))
    p.start()
    for i in range(20):
        q.put(i)
    q.put(None)
    q.join()  # returns only once the worker marked all 21 items done
    p.join()
    with pytest.raises(ValueError, match="too many times"):
        q.task_done()


def test_simple_queue():
    q = fiberlite.SimpleQueue()
    assert q.empty()
    p = fiberlite.Process(target=jobs.put_value, args=(q, {"a": 1}))
    p.start()
    assert q.get() == {"a": 1}
    p.join()
    q.close()
    with pytest.raises(ValueError):
        q.get()


def test_queue_created_in_child_is_reachable():
    outer = fiberlite.Queue()
    p = fiberlite.Process(target=jobs.spawn_grandchild, args=(outer,))
    p.start()
    pids = {outer.get(timeout=30), outer.get(timeout=30)}
    assert p.pid in pids and len(pids) == 2
    p.kill()
    p.join()


def test_empty_on_a_closed_queue_raises_as_the_stdlib_does():
    for q in (fiberlite.Queue(), fiberlite.JoinableQueue()):
        q.close()  # not put into yet: close() takes effect later, as in the stdlib
        assert q.empty()
    for q in (fiberlite.Queue(), fiberlite.JoinableQueue(), fiberlite.SimpleQueue()):
        q.put(1)
        assert q.get() == 1 and q.empty()
        q.close()
        with pytest.raises(OSError, match="is closed"):
            q.empty()
    q = fiberlite.SimpleQueue()
    q.close()
    with pytest.raises(OSError, match="is closed"):  # a SimpleQueue's close() at once
        q.empty()


class _Marker:
    pass


def _get_nothing(q, marker) -> None:
    with pytest.raises(queue.Empty):
        q.get(timeout=0.01)


def test_threads_of_one_process_wait_on_one_queue_with_timeouts():
    """As a ``multiprocessing`` queue, one is shared by a process's threads: gets that
    time out again and again, in four threads at once, raise nothing but Empty, and
    every item put meanwhile is got once."""
    q, count = fiberlite.Queue(), 300
    got, errors = [], []

    def getter() -> None:
        while True:
            try:
                item = q.get(timeout=0.002)
            except queue.Empty:
                continue
            except Exception as exc:  # (a poll object shared by the threads raised here)
                errors.append(repr(exc))
                return
            if item is None:
                return
            got.append(item)
    threads = [threading.Thread(target=getter) for _ in range(4)]
    for t in threads:
        t.start()
    producer = fiberlite.Process(target=jobs.put_slowly, args=(q, count, 4))
    producer.start()
    for t in threads:
        t.join(50)
    producer.join(30)
    assert errors == []
    assert sorted(got) == list(range(count))


def test_a_timed_out_get_keeps_nothing_of_its_caller():
    """The Empty raised by a get that timed out does not keep its caller's frames (and
    their locals) alive (PyTorch's DataLoader iterator was kept so, with its workers)."""
    q = fiberlite.Queue()
    marker = _Marker()
    kept = weakref.ref(marker)
    _get_nothing(q, marker)
    del marker
    gc.collect()
    assert kept() is None


@pytest.mark.parametrize("make", [fiberlite.Queue, lambda: fiberlite.Queue(3), fiberlite.JoinableQueue],
                         ids=["unbounded", "bounded", "joinable"])
def test_a_timeout_that_is_no_number_is_refused_and_nothing_is_put_or_taken(make):
    """As with the stdlib, whether the call would have waited or not."""
    q = make()
    with pytest.raises(TypeError, match="must be real number, not str"):
        q.put("x", True, "soon")
    q.put("y")
    with pytest.raises(TypeError, match="must be real number, not str"):
        q.get(True, "soon")
    assert q.get(timeout=30) == "y", "the refused put went in, or the refused get took"
    with pytest.raises(TypeError, match="must be real number, not str"):
        q.put("z", False, "soon")  # (read even when the call would not wait)
    assert q.empty()
