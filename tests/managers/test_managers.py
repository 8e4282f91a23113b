"""Managers: shared objects held by a server job, used through proxies from any job."""
from __future__ import annotations

import queue
import threading
import time

import pytest

import fiberlite
from fiberlite.errors import RemoteTraceback
from fiberlite.managers import BaseManager, BaseProxy, SyncManager
from waiting import eventually

pytestmark = pytest.mark.timeout(60)


@pytest.fixture
def manager():
    with SyncManager() as m:
        yield m


# -- targets of child jobs ------------------------------------------------------------------

def increment_under_lock(counts, lock, key, times):
    for _ in range(times):
        with lock:
            counts[key] = counts[key] + 1


def fill_shared(d, l, ns, v, q, ev):
    d["child"] = fiberlite.current_process().name
    l.extend([1, 2, 3])
    ns.answer = 42
    v.value = 7
    q.put("from child")
    ev.set()


def wait_then_report(ev, q):
    q.put(("waited", ev.wait(30)))


def use_counter(counter, times):
    for _ in range(times):
        counter.incr()


def use_dropped_list(ready, go, l):
    ready.set()
    go.wait(30)
    l.append("still here")


# -- a user type registered with a manager ---------------------------------------------------

class Boom(Exception):
    pass


class Counter:
    def __init__(self, start=0):
        self.n = start

    def incr(self, by=1):
        self.n += by
        return self.n

    def value(self):
        return self.n

    def explode(self):
        raise Boom(f"exploded at {self.n}")

    def secret(self):
        return "hidden"

    def clone(self):
        return Counter(self.n)


_MARKER = [None]


def set_marker(value):
    _MARKER[0] = value


def make_marker():
    return Counter(_MARKER[0])


class CounterProxy(BaseProxy):
    _exposed_ = ("incr", "value")

    def incr(self, by=1):
        return self._callmethod("incr", (by,))

    @property
    def n(self):
        return self._callmethod("value")


class CounterManager(BaseManager):
    pass


CounterManager.register("Counter", Counter, exposed=("incr", "value", "explode", "clone"),
                        method_to_typeid={"clone": "Counter"})
CounterManager.register("Marker", make_marker)
CounterManager.register("TypedCounter", Counter, CounterProxy)


# -- every SyncManager type ------------------------------------------------------------------

def test_dict(manager):
    d = manager.dict(a=1)
    d["b"] = 2
    d.update(c=3)
    assert len(d) == 3 and "b" in d and "z" not in d
    assert d["a"] == 1 and d.get("z", 9) == 9
    assert sorted(d.keys()) == ["a", "b", "c"] and sorted(d.values()) == [1, 2, 3]
    assert sorted(d.items()) == [("a", 1), ("b", 2), ("c", 3)]
    assert sorted(d) == ["a", "b", "c"]  # through an iterator proxy
    assert d.pop("c") == 3 and d.setdefault("e", 5) == 5
    del d["e"]
    assert d.copy() == {"a": 1, "b": 2} == d._getvalue()
    assert str(d) == "{'a': 1, 'b': 2}" and "DictProxy" in repr(d)
    with pytest.raises(KeyError):
        d["missing"]
    d.clear()
    assert len(d) == 0


def test_list(manager):
    l = manager.list([3, 1])
    l.append(2)
    l.extend([5, 4])
    l += [6]
    assert len(l) == 6 and l[0] == 3 and l[-1] == 6 and l[1:3] == [1, 2]
    assert list(l) == [3, 1, 2, 5, 4, 6] and 5 in l and 7 not in l
    l[0] = 0
    l.insert(1, 9)
    assert l.index(9) == 1 and l.count(9) == 1
    assert l.pop() == 6
    l.remove(9)
    del l[0]
    l.sort()
    assert l[:] == [1, 2, 4, 5]
    l.reverse()
    assert l + [0] == [5, 4, 2, 1, 0] and list(reversed(l)) == [1, 2, 4, 5]
    l *= 2
    assert len(l) == 8 and l._getvalue() == [5, 4, 2, 1] * 2
    with pytest.raises(IndexError):
        l[100]


def test_namespace_value_array(manager):
    ns = manager.Namespace(x=1)
    ns.y = "two"
    assert (ns.x, ns.y) == (1, "two") and "y='two'" in str(ns)
    del ns.x
    assert not hasattr(ns, "x")
    with pytest.raises(AttributeError):
        ns.missing
    v = manager.Value("i", 10)
    v.value += 5
    assert v.value == 15 and v.get() == 15
    v.set(3)
    assert v.value == 3
    a = manager.Array("d", [1.0, 2.0, 3.0])
    a[1] = 20.0
    assert len(a) == 3 and a[1] == 20.0 and list(a[:]) == [1.0, 20.0, 3.0]


def test_queues(manager):
    q = manager.Queue()
    q.put(1)
    q.put({"two": 2})
    assert q.qsize() == 2 and not q.empty()
    assert q.get() == 1 and q.get(timeout=1) == {"two": 2}
    with pytest.raises(queue.Empty):
        q.get_nowait()
    t0 = time.monotonic()
    with pytest.raises(queue.Empty):
        q.get(timeout=0.3)
    assert 0.25 <= time.monotonic() - t0 < 5
    bounded = manager.Queue(1)
    bounded.put("x")
    with pytest.raises(queue.Full):
        bounded.put("y", block=False)

    jq = manager.JoinableQueue()
    jq.put("job")
    joined = threading.Event()
    waiter = threading.Thread(target=lambda: (jq.join(), joined.set()))
    waiter.start()
    assert not joined.wait(0.2)  # join waits in the server, not blocking this thread's calls
    assert jq.get() == "job"
    jq.task_done()
    assert joined.wait(10)
    waiter.join()
    with pytest.raises(ValueError):
        jq.task_done()


def test_lock_rlock_semaphores(manager):
    lock = manager.Lock()
    assert lock.acquire()
    assert lock.acquire(False) is False
    assert lock.acquire(True, 0.1) is False
    lock.release()
    with lock:
        pass
    with pytest.raises(RuntimeError):
        lock.release()

    rlock = manager.RLock()
    assert rlock.acquire() and rlock.acquire()  # re-entrant for the same thread
    got = []
    other = threading.Thread(target=lambda: got.append(rlock.acquire(timeout=0.2)))
    other.start()
    other.join()
    assert got == [False]  # another thread is another owner
    rlock.release()
    rlock.release()
    with pytest.raises(RuntimeError):
        rlock.release()

    sem = manager.Semaphore(2)
    assert sem.acquire() and sem.acquire() and not sem.acquire(False)
    sem.release()
    sem.release()
    bsem = manager.BoundedSemaphore(1)
    with bsem:
        assert not bsem.acquire(timeout=0.05)
    with pytest.raises(ValueError):
        bsem.release()


def test_condition_event_barrier(manager):
    cond = manager.Condition()
    state = manager.dict(ready=False)

    def producer():
        with cond:
            state["ready"] = True
            cond.notify_all()

    with cond:
        assert cond.wait(0.05) is False
        threading.Thread(target=producer).start()
        assert cond.wait_for(lambda: state["ready"], timeout=10)

    ev = manager.Event()
    assert not ev.is_set() and ev.wait(0.05) is False
    threading.Timer(0.1, ev.set).start()
    assert ev.wait(10) is True and ev.is_set()
    ev.clear()
    assert not ev.is_set()

    barrier = manager.Barrier(2)
    assert barrier.parties == 2 and barrier.n_waiting == 0 and not barrier.broken
    results = []
    t = threading.Thread(target=lambda: results.append(barrier.wait(10)))
    t.start()
    results.append(barrier.wait(10))
    t.join()
    assert sorted(results) == [0, 1]
    barrier.abort()
    assert barrier.broken
    with pytest.raises(threading.BrokenBarrierError):
        barrier.wait(1)


def test_blocking_calls_do_not_block_other_callers(manager):
    q = manager.Queue()
    got = []
    getter = threading.Thread(target=lambda: got.append(q.get(timeout=20)))
    getter.start()
    d = manager.dict()
    for i in range(20):  # served while the getter waits in the server
        d[i] = i
    assert len(d) == 20 and getter.is_alive()
    q.put("wake")
    getter.join(20)
    assert got == ["wake"]


def test_pool_in_manager(manager):
    pytest.importorskip("fiberlite.pool")
    with manager.Pool(2) as pool:
        assert pool.apply(pow, (2, 5)) == 32
        assert pool.map(abs, [-1, -2, 3]) == [1, 2, 3]
        result = pool.apply_async(divmod, (7, 2))
        assert result.get(30) == (3, 1)
        assert list(pool.imap(abs, [-4, 5])) == [4, 5]


# -- proxies in child jobs -------------------------------------------------------------------------

def test_proxies_work_in_child_jobs(manager):
    d, l, ns = manager.dict(), manager.list(), manager.Namespace()
    v, q, ev = manager.Value("i", 0), manager.Queue(), manager.Event()
    p = fiberlite.Process(target=fill_shared, args=(d, l, ns, v, q, ev))
    p.start()
    p.join(30)
    assert p.exitcode == 0
    assert d["child"] == p.name and l[:] == [1, 2, 3] and ns.answer == 42 and v.value == 7
    assert q.get(timeout=5) == "from child" and ev.is_set()


def test_child_waits_on_event_set_by_parent(manager):
    ev, q = manager.Event(), manager.Queue()
    p = fiberlite.Process(target=wait_then_report, args=(ev, q))
    p.start()
    with pytest.raises(queue.Empty):
        q.get(timeout=0.3)
    ev.set()
    assert q.get(timeout=30) == ("waited", True)
    p.join(30)
    assert p.exitcode == 0


def test_no_lost_update_under_manager_lock(manager):
    counts, lock = manager.dict(total=0), manager.Lock()
    jobs = [fiberlite.Process(target=increment_under_lock, args=(counts, lock, "total", 100))
            for _ in range(4)]
    for job in jobs:
        job.start()
    for job in jobs:
        job.join(60)
    assert [job.exitcode for job in jobs] == [0] * 4
    assert counts["total"] == 400


def test_objects_are_freed_when_their_last_proxy_is_gone(manager):
    kept = manager.dict()
    temp = manager.list([1])
    assert manager._number_of_objects() == 2
    del temp
    eventually(lambda: manager._number_of_objects() == 1, 10, what="one object left in the server")

    # a proxy handed to a child survives its creator dropping it; freed when the child ends
    ready, go, shared = manager.Event(), manager.Event(), manager.list()
    p = fiberlite.Process(target=use_dropped_list, args=(ready, go, shared))
    p.start()
    assert ready.wait(30)
    probe = manager.list()  # to read the result, from a copy the child does not hold
    probe.append(shared)
    del shared
    go.set()
    p.join(30)
    assert p.exitcode == 0
    assert probe[0][:] == ["still here"]
    del ready, go, probe
    eventually(lambda: manager._number_of_objects() == 1, 10, what="one object left in the server")
    assert len(kept) == 0


def test_server_threads_of_ended_caller_threads_are_released(manager):
    d = manager.dict()
    assert manager._number_of_threads() == 1
    threads = [threading.Thread(target=d.__setitem__, args=(i, i)) for i in range(5)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(d) == 5
    eventually(lambda: manager._number_of_threads() == 1, 10, what="one thread left in the server")


def test_nested_proxies(manager):
    outer = manager.dict()
    outer["inner"] = manager.list()
    outer["inner"].append("x")
    assert outer["inner"][:] == ["x"]


# -- registering user types -------------------------------------------------------------------------

def test_register_user_class_with_exposed_methods():
    with CounterManager() as m:
        counter = m.Counter(5)
        assert counter.incr() == 6 and counter.incr(by=4) == 10 and counter.value() == 10
        assert not hasattr(counter, "secret")
        with pytest.raises(AttributeError, match="not in exposed"):
            counter._callmethod("secret")
        twin = counter.clone()  # method_to_typeid: the result stays in the server
        assert type(twin) is type(counter) and twin.incr() == 11 and counter.value() == 10
        p = fiberlite.Process(target=use_counter, args=(counter, 5))
        p.start()
        p.join(30)
        assert p.exitcode == 0 and counter.value() == 15

        typed = m.TypedCounter(1)
        assert isinstance(typed, CounterProxy) and typed.incr() == 2 and typed.n == 2
        with pytest.raises(AttributeError, match="not in exposed"):
            typed._callmethod("explode")


def test_register_rejects_bad_arguments():
    class Local(BaseManager):
        pass
    with pytest.raises(TypeError, match="callable"):
        Local.register("thing", 42)
    with pytest.raises(TypeError, match="proxytype"):
        Local.register("thing", dict, proxytype=dict)
    Local.register("thing", dict)
    assert "thing" in Local._registry and "thing" not in BaseManager._registry


def test_exceptions_propagate_with_type_and_remote_traceback():
    with CounterManager() as m:
        counter = m.Counter(3)
        with pytest.raises(Boom, match="exploded at 3") as info:
            counter.explode()
        cause = info.value.__cause__
        assert isinstance(cause, RemoteTraceback) and "def explode" not in str(cause)
        assert "in explode" in str(cause) and "Boom" in str(cause)
        with pytest.raises(TypeError):
            m.Counter(1, 2, 3)  # the constructor's error, raised in the server
        assert counter.value() == 3  # the server goes on


# -- life cycle ---------------------------------------------------------------------------------------

def test_use_after_shutdown_is_a_clear_error_not_a_hang():
    m = SyncManager()
    m.start()
    d = m.dict(a=1)
    process = m._process
    m.shutdown()
    assert not process.is_alive()
    t0 = time.monotonic()
    with pytest.raises(ConnectionError, match="shut down"):
        d["a"]
    assert time.monotonic() - t0 < 2
    with pytest.raises(fiberlite.ProcessError, match="shut down"):
        m.dict()
    m.shutdown()  # a second shutdown does nothing


def test_killed_manager_job_fails_waiting_and_later_calls_clearly():
    m = SyncManager()
    m.start()
    q, d = m.Queue(), m.dict(a=1)
    errors = []

    def blocked_get():
        try:
            q.get()
        except Exception as exc:
            errors.append(exc)

    waiter = threading.Thread(target=blocked_get)
    waiter.start()
    eventually(lambda: m._number_of_threads() == 2, 10,  # the get waits in the server
               what="a second thread in the server")
    m._process.kill()
    waiter.join(20)
    assert not waiter.is_alive()
    assert len(errors) == 1 and isinstance(errors[0], ConnectionError)
    assert "no longer running" in str(errors[0])
    t0 = time.monotonic()
    with pytest.raises(ConnectionError, match="no longer running.*exited"):  # and why
        d["a"]
    assert time.monotonic() - t0 < 2
    m.shutdown()
    assert not m._process.is_alive()


def test_context_manager_and_factory():
    with SyncManager() as m:
        assert m.address and m._process.is_alive()
        with pytest.raises(fiberlite.ProcessError):
            m.start()
        process = m._process
    assert not process.is_alive()
    with pytest.raises(fiberlite.ProcessError):
        with m:
            pass

    m = fiberlite.Manager()  # started, like multiprocessing.Manager()
    try:
        assert isinstance(m, SyncManager) and m.list([1])[:] == [1]
    finally:
        m.shutdown()
    with pytest.raises(ValueError, match="address"):
        m.connect()  # a manager started without an address is reached through its proxies
    with pytest.raises(ValueError, match=r"\(host, port\)"):
        SyncManager(address="somewhere:50000")


def test_start_initializer_runs_in_manager_job():
    m = CounterManager()
    m.start(set_marker, (123,))
    try:
        assert m.Marker().value() == 123 and _MARKER[0] is None
    finally:
        m.shutdown()
    with pytest.raises(TypeError):
        SyncManager().start(initializer=5)


class _EveryAddressDead(set):
    """``_dead`` as it is when every port a new manager could get belonged to a manager
    shut down earlier in this process: each address counts as dead until discarded."""

    def __init__(self) -> None:
        super().__init__()
        self.discarded: set[str] = set()

    def __contains__(self, address: object) -> bool:
        return address not in self.discarded

    def discard(self, address: str) -> None:
        self.discarded.add(address)


def test_a_manager_on_the_port_of_one_shut_down_before_works(monkeypatch):
    """Ports are reused: a new manager's job may listen where a manager shut down in this
    process did, and its proxies must not take it for the one that is gone."""
    from fiberlite.managers import calls, manager as manager_module, proxies
    dead = _EveryAddressDead()
    for module in (calls, manager_module, proxies):
        monkeypatch.setattr(module, "_dead", dead)
    with fiberlite.Manager() as fresh:
        shared = fresh.list([1, 2])
        shared.append(3)
        assert list(shared) == [1, 2, 3]
