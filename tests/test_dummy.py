"""fiberlite.dummy: the multiprocessing API on threads, as multiprocessing.dummy has it."""
from __future__ import annotations

import multiprocessing.dummy
import threading

import pytest

import fiberlite.dummy as dummy

pytestmark = pytest.mark.timeout(60)

NAMES = ["Value", "Array", "Manager", "Pool", "Queue", "JoinableQueue", "Barrier", "Condition",
         "Event", "Lock", "RLock", "Semaphore", "BoundedSemaphore", "current_process",
         "active_children", "freeze_support", "Pipe", "Process", "Namespace", "list", "dict"]


def test_every_name_of_the_stdlib_module_is_there():
    assert dummy.__all__ == multiprocessing.dummy.__all__
    for name in NAMES:
        assert hasattr(dummy, name), name


def _count_down(counter, lock, times):
    for _ in range(times):
        with lock:
            counter.value -= 1


def test_value_shared_by_threads_under_a_lock():
    counter = dummy.Value("i", 4000)
    lock = dummy.Lock()
    workers = [dummy.Process(target=_count_down, args=(counter, lock, 1000)) for _ in range(4)]
    for worker in workers:
        worker.start()
    assert set(dummy.active_children()) <= set(workers)
    for worker in workers:
        worker.join()
    assert counter.value == 0
    assert [w.exitcode for w in workers] == [0, 0, 0, 0]
    assert dummy.active_children() == []
    assert "'i'" in repr(counter)


def test_array_is_an_array_the_threads_share():
    squares = dummy.Array("d", [0.0] * 8, lock=True)

    def fill(i):
        squares[i] = i * i

    with dummy.Pool(3) as pool:
        pool.map(fill, range(8))
    assert list(squares) == [float(i * i) for i in range(8)]


def test_manager_is_the_module_itself():
    manager = dummy.Manager()
    assert manager is dummy
    space = manager.Namespace(total=0)
    seen = manager.list()
    events = manager.dict()
    guard = manager.RLock()

    def record(i):
        with guard:
            with guard:  # reentrant in the same thread
                space.total += i
                seen.append(i)
                events[i] = threading.current_thread().name

    threads = [manager.Process(target=record, args=(i,)) for i in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert space.total == sum(range(6))
    assert sorted(seen) == list(range(6))
    assert len(events) == 6 and "total=15" in repr(space)


def test_queues_pipe_barrier_and_semaphores():
    tasks = dummy.JoinableQueue()
    done = dummy.Queue()
    barrier = dummy.Barrier(2)
    slots = dummy.BoundedSemaphore(1)
    left, right = dummy.Pipe()

    def work():
        barrier.wait(10)
        while True:
            item = tasks.get()
            if item is None:
                tasks.task_done()
                return
            with slots:
                done.put(item * 10)
            tasks.task_done()

    worker = dummy.Process(target=work)
    worker.start()
    barrier.wait(10)
    for i in range(5):
        tasks.put(i)
    tasks.put(None)
    tasks.join()
    worker.join()
    assert sorted(done.get() for _ in range(5)) == [0, 10, 20, 30, 40]
    left.send({"ping": 1})
    assert right.recv() == {"ping": 1}
    with pytest.raises(ValueError):
        slots.release()  # bounded: released more than acquired


def test_condition_event_and_current_process():
    ready = dummy.Event()
    cond = dummy.Condition()
    names = []

    def waiter():
        with cond:
            ready.set()
            cond.wait(10)
            names.append(dummy.current_process().name)

    thread = dummy.Process(target=waiter, name="waiter-thread")
    thread.start()
    assert ready.wait(10)
    with cond:
        cond.notify()
    thread.join(10)
    assert names == ["waiter-thread"]
    assert dummy.current_process() is threading.current_thread()
    dummy.freeze_support()  # does nothing, as in the stdlib
