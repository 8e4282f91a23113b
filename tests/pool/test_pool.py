"""Pool: the multiprocessing.pool.Pool API, compared with the stdlib's documented results."""
from __future__ import annotations

import itertools
import multiprocessing
import multiprocessing.pool
import os
import re
import sys
import threading
import time

import cloudpickle
import pytest

import fiberlite
from fiberlite.errors import RemoteTraceback
from fiberlite.pool import MaybeEncodingError, Pool

pytestmark = pytest.mark.timeout(60)

# Tasks travel by value, as functions of a user's __main__ do: workers need not import this file.
cloudpickle.register_pickle_by_value(sys.modules[__name__])


class CustomError(Exception):
    pass


def square(x):
    return x * x


def add(a, b=0):
    return a + b


def fail_on(x, bad=3):
    if x == bad:
        raise CustomError(f"bad item {x}")  # the remote line
    return x


def nap(seconds, value=None):
    time.sleep(seconds)
    return value


def pid_after(seconds=0.0):
    time.sleep(seconds)
    return os.getpid()


def read_global(_=None):
    return INITIALIZED


def set_global(value):
    global INITIALIZED
    INITIALIZED = value


INITIALIZED = None


def return_lock():
    return threading.Lock()


def raising_generator(total, when):
    for i in range(total):
        if i == when:
            raise CustomError("the input failed")
        yield i


@pytest.fixture
def pool():
    with Pool(2) as p:
        yield p
    p.join()


def test_map_and_starmap_match_builtin(pool):
    data = list(range(57))
    assert pool.map(square, data) == [square(x) for x in data]
    for chunksize in (1, 5, 100):
        assert pool.map(square, data, chunksize) == [square(x) for x in data]
    assert pool.map(square, (x for x in data)) == [square(x) for x in data]  # no __len__
    assert pool.map(square, []) == []
    assert pool.map_async(square, data).get(30) == [square(x) for x in data]
    pairs = [(i, i + 1) for i in range(20)]
    assert pool.starmap(add, pairs) == list(itertools.starmap(add, pairs))
    assert pool.starmap_async(add, pairs, 3).get(30) == list(itertools.starmap(add, pairs))
    with pytest.raises(ValueError, match="Chunksize"):
        pool.map(square, data, 0)


def test_apply(pool):
    assert pool.apply(add, (2,), {"b": 3}) == 5
    result = pool.apply_async(square, (7,))
    assert result.get(30) == 49
    assert result.ready() and result.successful()
    assert isinstance(result, fiberlite.pool.AsyncResult)


def test_imap_and_imap_unordered(pool):
    data = list(range(40))
    assert list(pool.imap(square, data)) == [square(x) for x in data]
    assert list(pool.imap(square, data, chunksize=7)) == [square(x) for x in data]
    assert sorted(pool.imap_unordered(square, data, 3)) == [square(x) for x in data]
    assert list(pool.imap(square, [])) == []
    it = pool.imap(square, iter(range(3)))
    assert [it.next(timeout=30) for _ in range(3)] == [0, 1, 4]
    with pytest.raises(StopIteration):
        it.next(timeout=30)


def test_input_that_raises(pool):
    with pytest.raises(CustomError):
        pool.map(square, raising_generator(10, 3))
    it = pool.imap(square, raising_generator(20, 7), 2)
    assert [next(it) for _ in range(6)] == [square(i) for i in range(6)]
    with pytest.raises(CustomError):
        next(it)
    it = pool.imap_unordered(square, raising_generator(10, 0))
    with pytest.raises(CustomError):
        next(it)


def test_task_exception_type_and_remote_traceback(pool):
    with pytest.raises(CustomError) as info:
        pool.apply(fail_on, (3,))
    exc = info.value
    assert exc.args == ("bad item 3",)
    assert type(exc.__cause__) is RemoteTraceback
    assert "the remote line" in exc.__cause__.tb
    assert "fail_on" in str(exc.__cause__)
    # a failed map raises the first error, after every chunk has finished
    result = pool.map_async(fail_on, range(10), 1)
    with pytest.raises(CustomError):
        result.get(30)
    assert result.ready() and not result.successful()
    # imap raises at the failing position and goes on
    it = pool.imap(fail_on, range(6))
    assert [next(it) for _ in range(3)] == [0, 1, 2]
    with pytest.raises(CustomError):
        next(it)
    assert list(it) == [4, 5]


def test_callbacks(pool):
    got = []
    done = threading.Event()

    def callback(value):
        got.append(("ok", value))
        done.set()

    def error_callback(exc):
        got.append(("error", type(exc)))
        done.set()

    pool.apply_async(square, (4,), callback=callback).wait(30)
    assert done.wait(30) and got == [("ok", 16)]
    done.clear()
    pool.apply_async(fail_on, (3,), error_callback=error_callback).wait(30)
    assert done.wait(30) and got[-1] == ("error", CustomError)
    done.clear()
    pool.map_async(square, range(5), callback=callback).wait(30)
    assert done.wait(30) and got[-1] == ("ok", [0, 1, 4, 9, 16])
    done.clear()
    pool.map_async(fail_on, range(5), error_callback=error_callback).wait(30)
    assert done.wait(30) and got[-1] == ("error", CustomError)
    done.clear()
    pool.map_async(square, [], callback=callback)
    assert done.wait(30) and got[-1] == ("ok", [])


def test_get_timeout_and_not_ready(pool):
    result = pool.apply_async(nap, (1.0, "late"))
    with pytest.raises(ValueError):
        result.successful()
    assert not result.ready()
    started = time.monotonic()
    with pytest.raises(multiprocessing.TimeoutError):
        result.get(timeout=0.1)
    assert time.monotonic() - started < 0.9
    assert fiberlite.TimeoutError is multiprocessing.TimeoutError
    it = pool.imap(nap, [1.0])
    with pytest.raises(fiberlite.TimeoutError):
        it.next(timeout=0.05)
    assert result.get(30) == "late"


def wait_until_every_worker_ran_a_task(pool, workers: int, deadline: float = 60) -> None:
    """A pool maps with the workers that are up while the others start: map short tasks
    until each of ``workers`` has run one."""
    seen: set[int] = set()
    give_up = time.monotonic() + deadline
    while len(seen) < workers:
        assert time.monotonic() < give_up, f"only {len(seen)} of {workers} workers ran a task"
        seen.update(pool.map(pid_after, [0.02] * 2 * workers, chunksize=1))


def test_long_tasks_spread_over_all_workers():
    """Pull dispatch: 8 tasks of 0.5 s on 4 workers run 4 at a time (the ancestor ran them on one)."""
    with Pool(4) as pool:
        wait_until_every_worker_ran_a_task(pool, 4)
        started = time.monotonic()
        results = [pool.apply_async(pid_after, (0.5,)) for _ in range(8)]
        pids = [r.get(30) for r in results]
        elapsed = time.monotonic() - started
    pool.join()
    assert len(set(pids)) == 4
    assert elapsed < 1.8, f"8 tasks of 0.5 s on 4 workers took {elapsed:.2f} s"


def test_short_tasks_queued_behind_a_long_one_are_given_back():
    """A worker running an unexpectedly long task gives back the chunks it prefetched."""
    tasks = [0.002] * 60 + [1.5] + [0.002] * 40
    with Pool(2) as pool:
        pool.map(square, range(4))
        finished = list(pool.imap_unordered(_nap_index, list(enumerate(tasks))))
    pool.join()
    assert sorted(finished) == list(range(len(tasks)))
    assert finished[-1] == 60, "short tasks waited behind the long one"


def test_results_done_before_a_long_task_reach_the_master_while_it_runs():
    """The results of a worker's finished tasks do not wait for the task it runs next:
    here that task waits for what the master does once it has them (with the stdlib each
    result goes as its task ends)."""
    gate = fiberlite.Event()
    with Pool(1) as pool:
        results = pool.imap(lambda x: gate.wait(30) if x == 5 else x, range(6))
        assert [next(results) for _ in range(5)] == list(range(5))
        gate.set()
        assert next(results) is True, "the last task waited for a gate opened too late"
    pool.join()


def _gated_input(gate):
    """1, then 2 once ``gate`` is set: an input that takes its time."""
    yield 1
    gate.wait(30)
    yield 2


@pytest.mark.parametrize("method", ["imap", "imap_unordered"])
def test_imap_runs_what_it_read_while_its_input_waits(method):
    """An input that takes its time (a generator reading a stream): the items it gave
    are worked on meanwhile, as with the stdlib's pool."""
    gate = threading.Event()
    with Pool(1) as pool:
        results = getattr(pool, method)(square, _gated_input(gate))
        try:
            assert results.next(timeout=20) == 1, "the first item waited for the second"
        finally:
            gate.set()
        assert list(results) == [4]
    pool.join()


def test_a_workers_results_do_not_wait_for_the_answer_to_its_request_ahead(monkeypatch):
    """A worker whose tasks are short asks for its next work before its queue runs dry;
    once it has run out of work, its results go at once, not with the next request,
    after the answer to the one ahead. Here that answer comes only with new work (as
    a master too busy to answer would keep it)."""
    from fiberlite.pool.master import dispatch
    answer_at_once = dispatch.Dispatcher._next

    def answer_with_work(self, request, wid, entries, values, want, prefetch, out):
        answer_at_once(self, request, wid, entries, values, want, False, out)
    monkeypatch.setattr(dispatch.Dispatcher, "_next", answer_with_work)
    gate = threading.Event()
    with Pool(1) as pool:
        assert pool.map(square, range(20)) == [square(i) for i in range(20)]  # short tasks
        results = pool.imap(square, _gated_input(gate))  # unfinished: the worker asks ahead
        try:
            assert results.next(timeout=20) == 1, "the result waited for the next work"
        finally:
            gate.set()
        assert list(results) == [4]
    pool.join()


def _nap_index(pair):
    index, seconds = pair
    time.sleep(seconds)
    return index


def test_imap_reads_an_endless_input_lazily():
    pulled = itertools.count()

    def endless():
        for i in itertools.count():
            next(pulled)
            yield i

    with Pool(2) as pool:
        it = pool.imap(square, endless())
        assert [next(it) for _ in range(1000)] == [square(i) for i in range(1000)]
        ahead = next(pulled) - 1000
    pool.join()
    window = fiberlite.pool.master.pool.IMAP_WINDOW
    assert ahead <= window, f"imap read {ahead} items ahead of its consumer (window {window})"


def test_initializer_runs_in_every_worker():
    with Pool(2, initializer=set_global, initargs=("ready",)) as pool:
        assert set(pool.map(read_global, range(8), 1)) == {"ready"}
    pool.join()


def test_maxtasksperchild_replaces_workers():
    # two workers that are jobs of their own: each replacement starts an interpreter
    with Pool(2, maxtasksperchild=3) as pool:
        pids = [pool.apply_async(pid_after).get(30) for _ in range(12)]
        assert len(set(pids)) >= 4
        assert pool.map(square, range(12), 1) == [square(x) for x in range(12)]
    pool.join()
    for value in (0, -1, 0.5, "12"):
        with pytest.raises(ValueError):
            Pool(1, maxtasksperchild=value)


def test_pool_arguments():
    with pytest.raises(ValueError):
        Pool(0)
    with pytest.raises(TypeError):
        Pool(1, initializer=3)
    context = fiberlite.get_context("local")
    with Pool(context=context) as pool:
        assert len(pool._pool) == os.cpu_count()
        assert all(isinstance(p, context.Process) for p in pool._pool)
        assert pool.apply(square, (3,)) == 9
    pool.join()


def test_close_join_and_use_after_close():
    pool = Pool(2)
    result = pool.map_async(nap, [0.2] * 4, 1)
    with pytest.raises(ValueError):
        pool.join()  # still running
    pool.close()
    with pytest.raises(ValueError, match="Pool not running"):
        pool.apply_async(square, (1,))
    with pytest.raises(ValueError, match="Pool not running"):
        pool.map(square, [1])
    pool.join()  # waits for the submitted work, then for the workers to exit
    assert result.successful() and result.get() == [None] * 4
    assert pool._pool == []
    assert fiberlite.active_children() == []


def test_calls_given_up_at_terminate_count_no_task_done():
    """A call's progress (what the live page shows as done) counts results, not the
    tasks failed because the pool was terminated."""
    with Pool(1) as pool:
        finished = pool.apply_async(square, (3,))
        assert finished.get(30) == 9
        mapped = pool.map_async(square, range(5), 1)
        assert mapped.get(30) == [x * x for x in range(5)]
        late = pool.apply_async(nap, (60,))
        late_map = pool.map_async(nap, [60] * 3, 1)
    pool.join()
    with pytest.raises(fiberlite.ProcessError):
        late.get(5)
    assert (finished._progress(), mapped._progress()) == (1, 5)
    assert (late._progress(), late_map._progress()) == (0, 0)


def test_context_manager_terminates():
    with Pool(2) as pool:
        pending = pool.map_async(nap, [5] * 4, 1)
    pool.join()
    assert fiberlite.active_children() == []
    with pytest.raises(fiberlite.ProcessError):
        pending.get(5)  # it will never complete: it says so instead of hanging
    with pytest.raises(ValueError):
        with pool:
            pass
    with pytest.raises(NotImplementedError):
        cloudpickle.dumps(pool)


class CountedFunction:
    """A callable that counts how often the master pickles it."""

    pickled = 0

    def __call__(self, x):
        return x + 1

    def __reduce__(self):
        CountedFunction.pickled += 1
        return (CountedFunction, ())


def test_function_is_pickled_once_per_call(pool):
    CountedFunction.pickled = 0
    assert pool.map(CountedFunction(), range(200), chunksize=1) == list(range(1, 201))
    assert CountedFunction.pickled == 1


def test_unpicklable_function_and_arguments(pool):
    lock = threading.Lock()
    with pytest.raises(TypeError, match="function .* cannot be pickled"):
        pool.map(lambda x: lock, range(3))
    with pytest.raises(TypeError, match="argument 1 .*lock.* cannot be pickled"):
        pool.apply_async(add, (1, lock))
    with pytest.raises(TypeError, match="item 2 of the iterable"):
        pool.map(square, [1, 2, lock, 4], 1)

    class Refuses:
        def __reduce__(self):
            raise RuntimeError("cannot pickle")

    with pytest.raises(RuntimeError, match="cannot be pickled"):  # the stdlib's test: same type
        pool.map(square, [Refuses()] * 10)
    assert pool.map(square, [1, 2]) == [1, 4]  # the pool is fine


def test_unpicklable_item_after_the_first_chunks_were_queued(pool):
    lock = threading.Lock()
    with pytest.raises(TypeError, match="item 40 of the iterable"):
        pool.map(square, [*range(40), lock], 1)  # the first chunks are queued before item 40 fails
    assert pool.map(square, range(10), 1) == [x * x for x in range(10)]
    assert pool._core.results == {}  # the failed call left no result behind


def raise_holding_lock():
    raise LockedError(threading.Lock())


class LockedError(Exception):
    pass


def test_unpicklable_result(pool):
    for _ in range(3):
        result = pool.apply_async(return_lock)
        with pytest.raises(MaybeEncodingError) as info:
            result.get(30)
    assert multiprocessing.pool.MaybeEncodingError is MaybeEncodingError
    # the stdlib's message: each object shown once, in one pair of quotes
    lock = r"<unlocked _thread.lock object at 0x[0-9a-f]+>"
    reason = r"""TypeError\("cannot pickle '_thread.lock' object"\)"""
    assert re.fullmatch(f"Error sending result: '{lock}'. Reason: '{reason}'", str(info.value))
    assert re.fullmatch(lock, info.value.value) and re.fullmatch(reason, info.value.exc)
    with pytest.raises(MaybeEncodingError) as info:  # a task's exception that cannot travel
        pool.apply(raise_holding_lock)
    assert re.fullmatch(rf"Error sending result: 'LockedError\({lock}\)'. Reason: '{reason}'",
                        str(info.value))
    assert pool.apply(square, (5,)) == 25


def test_module_level_pool_and_repr():
    pool = fiberlite.Pool(1)
    try:
        assert "state=RUN" in repr(pool)
        assert pool.apply(add, (1, 2)) == 3
    finally:
        pool.terminate()
        pool.join()
    assert "state=TERMINATE" in repr(pool)


def test_repr_of_a_pool_ended_by_the_exit_hook():
    """The exit stage that terminates open pools acts on their cores: the facade's repr
    follows them, and never waits for workers."""
    from fiberlite.pool.master import core as pool_core
    pool = fiberlite.Pool(2)
    try:
        assert pool.apply(add, (1, 2)) == 3
        assert re.search(r"state=RUN pool_size=2>$", repr(pool))
        pool_core._terminate_all()
        assert re.search(r"state=TERMINATE pool_size=0>$", repr(pool))
    finally:
        pool.terminate()
        pool.join()


def test_imap_results_read_after_close_and_join():
    """close(); join(); then read: the read-ahead window does not apply to a closed pool."""
    pool = Pool(2)
    it = pool.imap(square, range(2000))
    unordered = pool.imap_unordered(square, range(2000), 3)
    pool.close()
    pool.join()
    assert list(it) == [square(x) for x in range(2000)]
    assert sorted(unordered) == [square(x) for x in range(2000)]


def wait_for_flag(flag):
    flag.wait(30)
    return flag.is_set()


def test_cache_holds_the_results_still_outstanding(pool):
    """``Pool._cache``: the stdlib's map of job number to the results not all in yet."""
    flag = fiberlite.Event()
    waiting = pool.apply_async(wait_for_flag, (flag,))
    done = pool.map_async(square, range(10))
    assert done.get(30) == [square(x) for x in range(10)]
    assert list(pool._cache.values()) == [waiting]  # a result ready is out of it already
    flag.set()
    assert waiting.get(30) is True
    assert not pool._cache, pool._cache


def test_imap_with_big_chunks_mixes_next_and_iteration(pool):
    data = list(range(1000))
    it = pool.imap(square, data, chunksize=300)
    assert [next(it), it.next(30)] == [0, 1]  # the rest of the first chunk stays
    head = []
    for value in it:
        head.append(value)
        if len(head) == 400:
            break
    assert head == [square(x) for x in range(2, 402)]
    assert list(it) == [square(x) for x in range(402, 1000)]
    assert not pool._cache, pool._cache
    with pytest.raises(StopIteration):
        next(it)
    unordered = pool.imap_unordered(square, iter(data), chunksize=250)
    assert sorted(unordered) == [square(x) for x in data]
    assert not pool._cache, pool._cache


def test_workers_taken_from_pool_pool_stay_usable_after_the_pool_ends():
    """As in the stdlib, the pool does not close its workers' Process objects: a list
    taken from ``Pool._pool`` says they are no longer alive once the pool has ended."""
    with Pool(2) as pool:
        pool.map(square, range(4))
        workers = pool._pool
        assert len(workers) == 2 and all(w.is_alive() for w in workers)
    pool.join()
    assert [w.is_alive() for w in workers] == [False, False]
    assert all(w.exitcode is not None for w in workers)
