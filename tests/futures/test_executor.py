"""fiberlite.futures.ProcessPoolExecutor: concurrent.futures' contract, on worker jobs."""
from __future__ import annotations

import concurrent.futures
import gc
import multiprocessing
import os
import signal
import sys
import threading
import warnings

import cloudpickle
import pytest
from waiting import eventually

import fiberlite
from fiberlite.errors import RemoteTraceback, WorkerLostError
from fiberlite.futures import BrokenProcessPool, ProcessPoolExecutor
from fiberlite.futures.executor import WINDOW_PER_WORKER
from jobs import TaskError, add, fail_on, square

pytestmark = pytest.mark.timeout(60)

# Tasks travel by value, as functions of a user's __main__ do: workers need not import this file.
cloudpickle.register_pickle_by_value(sys.modules[__name__])


def wait_for(event, value=None):
    assert event.wait(30)
    return value


def job_and_pid(_=None):
    return fiberlite.current_process().name, os.getpid()


def kill_on(x, bad):
    if x == bad:
        os.kill(os.getpid(), signal.SIGKILL)
    return x


def refuse_to_start():
    raise TaskError("no start")


@pytest.fixture(scope="class")
def executor():
    with ProcessPoolExecutor(2) as shared:
        yield shared


class TestOneExecutor:
    """Tests sharing one executor of 2 workers (its jobs live until the class ends)."""

    jobs_kept_by_class = True

    def test_submit_map_and_the_futures_of_concurrent_futures(self, executor):
        future = executor.submit(add, 2, b=3)
        assert isinstance(future, concurrent.futures.Future) and future.result(30) == 5
        assert list(executor.map(square, range(10))) == [x * x for x in range(10)]
        assert list(executor.map(add, range(7), range(7), chunksize=3)) == [2 * x for x in range(7)]
        assert list(executor.map(square, [])) == []
        futures = [executor.submit(square, x) for x in range(20)]
        assert sorted(f.result() for f in concurrent.futures.as_completed(futures, 30)) == \
            sorted(x * x for x in range(20))
        done, not_done = concurrent.futures.wait(futures, 30)
        assert len(done) == 20 and not not_done

    def test_workers_are_fiberlite_jobs(self, executor):
        name, pid = executor.submit(job_and_pid).result(30)
        assert name.startswith("PoolWorker-") and pid != os.getpid()

    def test_a_tasks_exception_comes_back_with_the_remote_traceback(self, executor):
        with pytest.raises(TaskError, match="bad item 3") as info:
            executor.submit(fail_on, 3).result(30)
        assert isinstance(info.value.__cause__, RemoteTraceback)
        assert "the remote line" in str(info.value.__cause__)
        results = executor.map(fail_on, range(6), chunksize=2)
        assert [next(results), next(results)] == [0, 1]
        with pytest.raises(TaskError, match="bad item 3") as info:
            next(results)  # the chunk (2, 3) failed
        assert "the remote line" in str(info.value.__cause__)

    def test_unpicklable_argument_fails_its_future_naming_it(self, executor):
        future = executor.submit(square, threading.Lock())
        with pytest.raises(Exception, match="lock"):
            future.result(30)
        assert executor.submit(square, 4).result(30) == 16  # the executor goes on

    def test_a_task_not_handed_to_a_worker_can_be_cancelled(self, executor):
        go = fiberlite.Event()
        held = [executor.submit(wait_for, go, x) for x in range(2 * WINDOW_PER_WORKER)]
        waiting = [executor.submit(square, x) for x in range(3)]
        assert all(f.running() for f in held) and not any(f.running() for f in waiting)
        assert waiting[1].cancel() and waiting[1].cancelled()
        assert not held[0].cancel()
        go.set()
        assert [f.result(30) for f in held] == list(range(2 * WINDOW_PER_WORKER))
        assert waiting[0].result(30) == 0 and waiting[2].result(30) == 4
        with pytest.raises(concurrent.futures.CancelledError):
            waiting[1].result()

    def test_map_timeout_counts_from_the_call(self, executor):
        go = fiberlite.Event()
        results = executor.map(wait_for, [go] * 6, range(6), timeout=0.5)
        with pytest.raises(TimeoutError):
            next(results)
        go.set()
        assert executor.submit(square, 5).result(30) == 25

    def test_a_poison_task_fails_alone_and_the_executor_goes_on(self, executor):
        futures = [executor.submit(kill_on, x, 2) for x in range(4)]
        with pytest.raises(WorkerLostError, match=r"kill_on"):
            futures[2].result(60)
        assert [futures[x].result(60) for x in (0, 1, 3)] == [0, 1, 3]
        with pytest.raises(WorkerLostError):
            list(executor.map(kill_on, range(4), [1] * 4))
        assert executor.submit(square, 3).result(30) == 9


def test_shutdown_cancels_pending_futures_and_refuses_new_ones():
    executor = ProcessPoolExecutor(1)
    go = fiberlite.Event()
    held = [executor.submit(wait_for, go, x) for x in range(WINDOW_PER_WORKER)]
    pending = executor.submit(square, 2)
    executor.shutdown(wait=False, cancel_futures=True)
    assert pending.cancelled()
    with pytest.raises(RuntimeError, match="after shutdown"):
        executor.submit(square, 1)
    go.set()
    executor.shutdown(wait=True)
    assert [f.result() for f in held] == list(range(WINDOW_PER_WORKER))
    assert fiberlite.active_children() == []


def test_max_tasks_per_child_replaces_workers():
    with ProcessPoolExecutor(1, max_tasks_per_child=2) as executor:
        pids = [executor.submit(job_and_pid).result(30)[1] for _ in range(4)]
    assert pids[0] == pids[1] and pids[2] == pids[3] and pids[0] != pids[2]


def test_a_failing_initializer_breaks_the_pool():
    with ProcessPoolExecutor(1, initializer=refuse_to_start) as executor:
        future = executor.submit(square, 2)
        with pytest.raises(BrokenProcessPool):
            future.result(60)
        with pytest.raises(BrokenProcessPool):
            executor.submit(square, 3).result(60)


def test_bad_arguments_are_refused_at_construction():
    with pytest.raises(ValueError, match="max_workers"):
        ProcessPoolExecutor(0)
    with pytest.raises(TypeError, match="fiberlite context"):
        ProcessPoolExecutor(1, mp_context=multiprocessing.get_context("spawn"))
    with pytest.raises(TypeError, match="initializer"):
        ProcessPoolExecutor(1, initializer=3)
    with pytest.raises(ValueError, match="max_tasks_per_child"):
        ProcessPoolExecutor(1, max_tasks_per_child=0)


def test_the_stdlib_executor_given_a_fiberlite_context_names_the_fiberlite_one():
    with pytest.raises(TypeError, match=r"fiberlite\.futures\.ProcessPoolExecutor"):
        concurrent.futures.ProcessPoolExecutor(1, mp_context=fiberlite.get_context())


def test_an_executor_dropped_without_shutdown_lets_its_workers_go():
    executor = ProcessPoolExecutor(1)
    assert executor.submit(square, 3).result(30) == 9
    with warnings.catch_warnings():
        warnings.simplefilter("error", ResourceWarning)  # the pool was closed, not abandoned
        del executor
        gc.collect()
    eventually(lambda: fiberlite.active_children() == [], timeout=15,
               what=lambda: f"its workers {fiberlite.active_children()}")
