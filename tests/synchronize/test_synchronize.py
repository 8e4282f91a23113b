"""Lock, RLock, Semaphore, BoundedSemaphore, Condition, Event and Barrier, in one
process and across jobs."""
from __future__ import annotations

import functools
import os
import queue
import threading
import time

import pytest

import fiberlite
from fiberlite.synchronize import BrokenBarrierError, NotOwnedError

pytestmark = pytest.mark.timeout(60)

WAIT = 30  # generous bound for anything that must happen; never reached when all is well


# -- targets run by child jobs ----------------------------------------------------------------
def add_under_lock(lock, counter, n):
    for _ in range(n):
        with lock:
            seen = counter.value
            counter.value = seen + 1  # a lost update shows if two jobs interleave here


def hold_semaphore(sem, inside, go):
    with sem:
        inside.put(os.getpid())
        go.wait(WAIT)


def set_event(event):
    event.set()


def wait_event(event, out):
    out.put(event.wait(WAIT))


def notify_condition(cond, flag):
    with cond:
        flag.value = 1
        cond.notify_all()


def wait_condition(cond, out):
    with cond:
        out.put("waiting")
        out.put(cond.wait(WAIT))


def pass_barrier(barrier, out):
    out.put(barrier.wait(WAIT))


def acquire_then_report(lock, out, timeout=None):
    got = lock.acquire(timeout=timeout)
    out.put(got)
    if got:
        lock.release()


def hold_forever(lock, out):
    lock.acquire()
    out.put("held")
    threading.Event().wait()


def try_release(lock, out):
    try:
        lock.release()
    except Exception as exc:  # reported to the parent, which checks the type
        out.put(type(exc))
    else:
        out.put(None)


def _start(target, *args):
    p = fiberlite.Process(target=target, args=args)
    p.start()
    return p


# -- Lock -----------------------------------------------------------------------------------
def test_lock_in_process():
    lock = fiberlite.Lock()
    assert repr(lock) == "<Lock(owner=None)>"
    assert lock.acquire() is True
    assert repr(lock) == "<Lock(owner=MainProcess)>"
    assert lock.acquire(False) is False
    t0 = time.monotonic()
    assert lock.acquire(timeout=0.2) is False  # non-recursive: the owner blocks too
    assert 0.15 <= time.monotonic() - t0 < 5
    lock.release()
    with pytest.raises(ValueError, match="released too many times"):
        lock.release()
    with lock as entered:
        assert entered is True
        assert lock.acquire(block=False) is False
    assert lock.acquire(timeout=0) is True
    lock.release()


def test_lock_released_by_another_thread_wakes_waiter():
    lock = fiberlite.Lock()
    lock.acquire()
    got = []
    t = threading.Thread(target=lambda: got.append(lock.acquire(timeout=WAIT)))
    t.start()
    threading.Thread(target=lock.release).start()  # any thread may release a Lock
    t.join(WAIT)
    assert got == [True]
    assert repr(lock) == "<Lock(owner=SomeOtherThread)>"
    lock.release()


def test_lock_mutual_exclusion_across_three_jobs(machine_path):
    lock = fiberlite.Lock()
    counter = fiberlite.RawValue("i", 0)
    jobs = [_start(add_under_lock, lock, counter, 100) for _ in range(3)]
    add_under_lock(lock, counter, 100)  # the creator competes through its direct path
    for p in jobs:
        p.join(WAIT)
        assert p.exitcode == 0
    assert counter.value == 400


def test_lock_timeout_in_child_and_release_by_other_process(machine_path):
    lock, out = fiberlite.Lock(), fiberlite.Queue()
    lock.acquire()
    p = _start(acquire_then_report, lock, out, 0.2)
    assert out.get(timeout=WAIT) is False  # held by the parent: the child's timeout expires
    p.join(WAIT)
    p = _start(try_release, lock, out)  # multiprocessing lets any process release a Lock
    assert out.get(timeout=WAIT) is None
    p.join(WAIT)
    assert lock.acquire(False) is True
    lock.release()


def test_lock_held_by_killed_child_is_released_and_its_killed_waiter_forgotten(machine_path):
    lock, out = fiberlite.Lock(), fiberlite.Queue()
    holder = _start(hold_forever, lock, out)
    assert out.get(timeout=WAIT) == "held"
    assert lock.acquire(timeout=0.1) is False
    waiter = _start(acquire_then_report, lock, out)  # blocks behind the holder
    with pytest.raises(queue.Empty):
        out.get(timeout=0.3)
    waiter.kill()
    waiter.join(WAIT)
    holder.kill()
    holder.join(WAIT)
    assert holder.exitcode == -9
    # multiprocessing would deadlock here; fiberlite releases a dead job's lock
    assert lock.acquire(timeout=WAIT) is True
    lock.release()
    assert lock.acquire(False) is True  # nobody else took it: the killed waiter is gone
    lock.release()


def test_lock_held_by_a_job_times_out_another_jobs_wait(machine_path):
    lock, out = fiberlite.Lock(), fiberlite.Queue()
    holder = _start(hold_forever, lock, out)
    assert out.get(timeout=WAIT) == "held"
    start = time.monotonic()
    waiter = _start(acquire_then_report, lock, out, 0.3)  # (through the hub: parked there)
    assert out.get(timeout=WAIT) is False
    assert time.monotonic() - start >= 0.3
    waiter.join(WAIT)
    holder.kill()
    holder.join(WAIT)


def test_lock_held_by_a_job_and_released_by_its_creator_wakes_a_job_waiting(machine_path):
    lock, out = fiberlite.Lock(), fiberlite.Queue()
    holder = _start(hold_forever, lock, out)
    assert out.get(timeout=WAIT) == "held"
    waiter = _start(acquire_then_report, lock, out)
    with pytest.raises(queue.Empty):
        out.get(timeout=0.3)  # it waits behind the holder
    lock.release()  # multiprocessing lets any process release a Lock: here, not the hub
    assert out.get(timeout=WAIT) is True
    waiter.join(WAIT)
    assert waiter.exitcode == 0
    holder.kill()
    holder.join(WAIT)


def test_lock_travels_through_a_queue_and_stays_the_same_memory_in_its_creator():
    lock, q = fiberlite.Lock(), fiberlite.Queue()
    q.put(lock)
    back = q.get(timeout=WAIT)
    assert back._local and back._mutex.address() == lock._mutex.address()
    with back:
        assert lock.acquire(False) is False


# -- RLock ----------------------------------------------------------------------------------
def test_rlock_recursion_and_ownership():
    rlock = fiberlite.RLock()
    assert repr(rlock) == "<RLock(None, 0)>"
    with pytest.raises(AssertionError, match="not owned by thread"):
        rlock.release()
    assert rlock.acquire() and rlock.acquire() and rlock.acquire(False)
    assert repr(rlock) == "<RLock(MainProcess, 3)>"
    errors = []

    def release_from_other_thread():
        try:
            rlock.release()
        except AssertionError as exc:
            errors.append(exc)
        errors.append(rlock.acquire(timeout=0.05))

    t = threading.Thread(target=release_from_other_thread)
    t.start()
    t.join(WAIT)
    assert len(errors) == 2 and isinstance(errors[0], AssertionError) and errors[1] is False
    for _ in range(3):
        rlock.release()
    with pytest.raises(AssertionError):
        rlock.release()


def test_rlock_across_jobs_needs_every_release(machine_path):
    rlock, out = fiberlite.RLock(), fiberlite.Queue()
    rlock.acquire()
    rlock.acquire()
    p = _start(try_release, rlock, out)
    assert out.get(timeout=WAIT) is NotOwnedError  # an AssertionError, as in multiprocessing
    p.join(WAIT)
    p = _start(acquire_then_report, rlock, out)
    rlock.release()
    with pytest.raises(queue.Empty):
        out.get(timeout=0.3)  # still held once
    rlock.release()
    assert out.get(timeout=WAIT) is True
    p.join(WAIT)


# -- Semaphore ------------------------------------------------------------------------------
def test_semaphore_in_process():
    sem = fiberlite.Semaphore(2)
    assert repr(sem) == "<Semaphore(value=2)>"
    assert sem.acquire() and sem.acquire(timeout=1)
    assert sem.get_value() == 0
    assert sem.acquire(False) is False
    t0 = time.monotonic()
    assert sem.acquire(timeout=0.2) is False
    assert 0.15 <= time.monotonic() - t0 < 5
    sem.release()
    sem.release()
    sem.release()  # an unbounded semaphore may go above its initial value
    assert sem.get_value() == 3
    with pytest.raises(ValueError):
        fiberlite.Semaphore(-1)


def test_bounded_semaphore_over_release_raises():
    sem = fiberlite.BoundedSemaphore(2)
    assert repr(sem) == "<BoundedSemaphore(value=2, maxvalue=2)>"
    with pytest.raises(ValueError, match="released too many times"):
        sem.release()
    with sem:
        assert sem.get_value() == 1
    assert sem.get_value() == 2


def test_semaphore_bounds_concurrency_of_jobs(machine_path):
    sem = fiberlite.BoundedSemaphore(2)
    inside, go = fiberlite.Queue(), fiberlite.Event()
    jobs = [_start(hold_semaphore, sem, inside, go) for _ in range(3)]
    first = {inside.get(timeout=WAIT), inside.get(timeout=WAIT)}
    with pytest.raises(queue.Empty):
        inside.get(timeout=0.5)  # the third job waits for a slot
    assert sem.get_value() == 0
    go.set()
    third = inside.get(timeout=WAIT)
    assert first | {third} == {p.pid for p in jobs}
    for p in jobs:
        p.join(WAIT)
        assert p.exitcode == 0
    assert sem.get_value() == 2
    out = fiberlite.Queue()
    p = _start(try_release, sem, out)  # the bound holds for releases from other jobs too
    assert out.get(timeout=WAIT) is ValueError
    p.join(WAIT)


# -- Event ----------------------------------------------------------------------------------
def test_event_in_process():
    event = fiberlite.Event()
    assert not event.is_set() and "unset" in repr(event)
    t0 = time.monotonic()
    assert event.wait(0.2) is False
    assert 0.15 <= time.monotonic() - t0 < 5
    assert event.wait(0) is False
    event.set()
    assert event.is_set() and event.wait() is True and event.wait(0) is True
    event.clear()
    assert not event.is_set()


def test_event_set_by_child_wakes_parent_and_parent_wakes_child(machine_path):
    event, back, out = fiberlite.Event(), fiberlite.Event(), fiberlite.Queue()
    waiter = _start(wait_event, back, out)
    setter = _start(set_event, event)
    assert event.wait(WAIT) is True
    back.set()
    assert out.get(timeout=WAIT) is True
    for p in (waiter, setter):
        p.join(WAIT)
        assert p.exitcode == 0


# -- Condition ------------------------------------------------------------------------------
def test_condition_in_process():
    cond = fiberlite.Condition()
    assert repr(cond) == "<Condition(<RLock(None, 0)>, 0)>"
    with pytest.raises(AssertionError, match="lock is not owned"):
        cond.notify()
    with pytest.raises(RuntimeError, match="must acquire"):  # also what threading raises
        cond.wait(0.01)
    cond.acquire()
    cond.acquire()
    t0 = time.monotonic()
    assert cond.wait(0.2) is False
    assert 0.15 <= time.monotonic() - t0 < 5
    assert repr(cond._lock) == "<RLock(MainProcess, 2)>"  # the recursion level is restored
    cond.release()
    cond.release()
    items = []

    def consumer():
        with cond:
            items.append(cond.wait_for(lambda: len(items) >= 1, timeout=WAIT))

    t = threading.Thread(target=consumer)
    t.start()
    with cond:
        items.append("x")
        cond.notify()
    t.join(WAIT)
    assert items == ["x", True]
    with cond:
        t0 = time.monotonic()
        assert cond.wait_for(lambda: False, timeout=0.2) is False
        assert 0.15 <= time.monotonic() - t0 < 5


def test_condition_with_plain_lock_and_bad_lock():
    cond = fiberlite.Condition(fiberlite.Lock())
    with cond:
        cond.notify_all()
        assert cond.wait(0.01) is False
    assert cond._lock.acquire(False) is True  # wait re-acquired, exit released
    cond._lock.release()
    with pytest.raises(TypeError, match="fiberlite Lock or RLock"):
        fiberlite.Condition(threading.Lock())


def test_condition_notify_from_child_wakes_parent(machine_path):
    cond, flag = fiberlite.Condition(), fiberlite.RawValue("i", 0)
    with cond:  # held until wait() releases it, so the child cannot notify too early
        p = _start(notify_condition, cond, flag)
        assert cond.wait_for(lambda: flag.value == 1, timeout=WAIT)
    p.join(WAIT)
    assert p.exitcode == 0


def test_condition_wait_in_child_notified_by_parent(machine_path):
    cond, out = fiberlite.Condition(fiberlite.Lock()), fiberlite.Queue()
    p = _start(wait_condition, cond, out)
    assert out.get(timeout=WAIT) == "waiting"
    with cond:  # acquirable only once the child waits
        assert "1)>" in repr(cond)
        cond.notify()
    assert out.get(timeout=WAIT) is True
    p.join(WAIT)
    assert p.exitcode == 0


# -- Barrier --------------------------------------------------------------------------------
def test_barrier_of_three_jobs_runs_action_once(machine_path):
    out, actions = fiberlite.Queue(), fiberlite.Queue()
    barrier = fiberlite.Barrier(3, action=functools.partial(actions.put, "action"), timeout=WAIT)
    assert barrier.parties == 3
    jobs = [_start(pass_barrier, barrier, out) for _ in range(3)]
    assert sorted(out.get(timeout=WAIT) for _ in jobs) == [0, 1, 2]
    assert actions.get(timeout=WAIT) == "action"
    with pytest.raises(queue.Empty):
        actions.get(timeout=0.1)
    for p in jobs:
        p.join(WAIT)
        assert p.exitcode == 0
    assert barrier.n_waiting == 0 and not barrier.broken


def barrier_until_broken(barrier, progress, out, threads):
    """``threads`` threads pass ``barrier`` until it breaks; each pass with index 0 is told
    on ``progress``; then how often each index came back, and any other error."""
    counts, errors = [0] * barrier.parties, []
    counting = threading.Lock()

    def party():
        try:
            while True:
                index = barrier.wait(WAIT)
                with counting:
                    counts[index] += 1
                if index == 0:
                    progress.put(1)
        except BrokenBarrierError:
            return
        except Exception as exc:
            errors.append(repr(exc))

    workers = [threading.Thread(target=party) for _ in range(threads)]
    for t in workers:
        t.start()
    for t in workers:
        t.join()
    out.put((counts, errors))


def test_barrier_with_more_callers_than_parties_gives_every_round_each_index_once(machine_path):
    """Six callers (two jobs of three threads) on a barrier of three, until it is aborted
    after 200 rounds: a passed round's parties leave while the next one fills, and no
    round loses or doubles a party; the abort ends every caller."""
    barrier, progress, out = fiberlite.Barrier(3), fiberlite.Queue(), fiberlite.Queue()
    jobs = [_start(barrier_until_broken, barrier, progress, out, 3) for _ in range(2)]
    for _ in range(200):
        progress.get(timeout=WAIT)
    barrier.abort()
    results = [out.get(timeout=WAIT) for _ in jobs]
    for p in jobs:
        p.join(WAIT)
        assert p.exitcode == 0
    assert [errors for _, errors in results] == [[], []]
    per_index = [sum(counts[i] for counts, _ in results) for i in range(3)]
    assert per_index[0] >= 200 and per_index == [per_index[0]] * 3, per_index
    assert barrier.broken


def test_a_passed_rounds_parties_leave_without_taking_the_barriers_lock_again():
    """The party that completes a round lets the others go: they return while its lock is
    still held (each taking it in turn made them leave one after another)."""
    from fiberlite.synchronize import barrier as barriers
    barrier = fiberlite.Barrier(3)
    returned = []
    threads = [threading.Thread(target=lambda: returned.append(barrier.wait(WAIT))) for _ in range(2)]
    for t in threads:
        t.start()
    deadline = time.monotonic() + WAIT
    while barrier.n_waiting < 2 and time.monotonic() < deadline:
        time.sleep(0.01)
    inner = barrier._barrier
    inner.lock()   # the third party arrives as arrive() does, and keeps the lock
    try:
        index = inner.words[barriers.COUNT]
        inner.words[barriers.COUNT] += 1
        inner.words[barriers.ARRIVALS + index] = barrier._slot
        inner._pass()
        for t in threads:
            t.join(5)
        assert sorted(returned) == [0, 1]
    finally:
        inner.unlock()
    assert barrier.n_waiting == 0 and not barrier.broken


def test_barrier_timeout_abort_reset_in_process():
    barrier = fiberlite.Barrier(2)
    assert "waiters=0/2" in repr(barrier)
    t0 = time.monotonic()
    with pytest.raises(BrokenBarrierError):
        barrier.wait(0.2)  # a timed-out wait breaks the barrier
    assert 0.15 <= time.monotonic() - t0 < 5
    assert barrier.broken
    with pytest.raises(BrokenBarrierError):
        barrier.wait()
    barrier.reset()
    assert not barrier.broken
    errors = []

    def party():
        try:
            barrier.wait(WAIT)
        except BrokenBarrierError as exc:
            errors.append(exc)

    t = threading.Thread(target=party)
    t.start()
    deadline = time.monotonic() + WAIT
    while barrier.n_waiting < 1 and time.monotonic() < deadline:
        time.sleep(0.01)
    assert barrier.n_waiting == 1
    barrier.abort()
    t.join(WAIT)
    assert len(errors) == 1 and barrier.broken
    barrier.reset()
    results = []
    threads = [threading.Thread(target=lambda: results.append(barrier.wait(WAIT))) for _ in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(WAIT)
    assert sorted(results) == [0, 1]


def test_barrier_action_that_raises_breaks_it(machine_path):
    def action():
        raise KeyError("bad action")

    barrier = fiberlite.Barrier(2, action=action)
    errors = []

    def party():
        try:
            barrier.wait(WAIT)
        except Exception as exc:
            errors.append(type(exc))

    threads = [threading.Thread(target=party) for _ in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(WAIT)
    assert sorted(errors, key=str) == sorted([KeyError, BrokenBarrierError], key=str)
    assert barrier.broken


def test_barrier_party_killed_while_waiting_breaks_it(machine_path):
    barrier, out = fiberlite.Barrier(3), fiberlite.Queue()
    p = _start(pass_barrier, barrier, out)
    deadline = time.monotonic() + WAIT
    while barrier.n_waiting < 1 and time.monotonic() < deadline:
        time.sleep(0.01)
    p.kill()
    p.join(WAIT)
    with pytest.raises(BrokenBarrierError):
        barrier.wait(WAIT)


# -- a timeout that is no number ------------------------------------------------------------
def refusals_of_a_timeout_that_is_no_number(lock, sem, event, cond, barrier):
    """What each blocking call does with the timeout "soon": its TypeError's message, or
    what it returned (and what it took, given back) if it took the timeout."""
    def waiting_on_cond():
        with cond:
            return cond.wait("soon")
    calls = {"Lock.acquire": (lambda: lock.acquire(timeout="soon"), lock.release),
             "Semaphore.acquire": (lambda: sem.acquire(True, "soon"), sem.release),
             "Event.wait": (lambda: event.wait("soon"), None),
             "Condition.wait": (waiting_on_cond, None),
             "Barrier.wait": (lambda: barrier.wait("soon"), None)}
    said = {}
    for name, (call, give_back) in calls.items():
        try:
            said[name] = f"returned {call()!r}"
        except TypeError as exc:
            said[name] = str(exc)
        else:
            if give_back is not None:
                give_back()
    return said


def report_refusals(out, *primitives):
    out.put(refusals_of_a_timeout_that_is_no_number(*primitives))


def test_a_timeout_that_is_no_number_is_refused_before_anything_is_taken(machine_path):
    """As multiprocessing: TypeError, in the creator and in a job (whose calls go through
    the creator's hub on the hub's leg), and the lock and the semaphore stay free, even
    where they were free to take at once."""
    primitives = (fiberlite.Lock(), fiberlite.Semaphore(1), fiberlite.Event(), fiberlite.Condition(),
                  fiberlite.Barrier(1))
    refused = {name: "must be real number, not str" for name in
               ("Lock.acquire", "Semaphore.acquire", "Event.wait", "Condition.wait", "Barrier.wait")}
    assert refusals_of_a_timeout_that_is_no_number(*primitives) == refused
    out = fiberlite.Queue()
    job = _start(report_refusals, out, *primitives)
    assert out.get(timeout=WAIT) == refused
    job.join(WAIT)
    assert job.exitcode == 0
    lock, sem = primitives[:2]
    assert lock.acquire(False) and sem.acquire(False)
