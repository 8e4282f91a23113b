"""A job that goes silent is lost for the run within ``peer_timeout``; whoever waits on it
gets a clear error; a job that comes back is fenced; a busy one is kept.

Jobs are local processes frozen with SIGSTOP (their connections stay open and their
kernel keeps acknowledging, as a paused container's does). The same on Docker, with
networks cut and containers paused: tests/backends/test_docker_liveness.py."""
from __future__ import annotations

import contextlib
import os
import signal
import time

import psutil
import pytest

import fiberlite
from fiberlite import config
from fiberlite.errors import ConnectionLost, RingError
from fiberlite.queues import GET
from fiberlite.runtime import launcher
from fiberlite.runtime.links.reader import reader_of
from fiberlite.wire import liveness
from waiting import eventually

pytestmark = pytest.mark.timeout(120)

TIMEOUT = 1.5
# a connection is given up 3 to 4 ticks (of a quarter of the timeout) after the last thing
# heard on it, which an idle one heard up to a tick before it fell silent: no sooner than
EARLIEST = TIMEOUT / 2
TASKS = 600


def freeze(pid: int) -> None:
    """SIGSTOP ``pid`` and wait until it is stopped (the signal is delivered later)."""
    os.kill(pid, signal.SIGSTOP)
    eventually(lambda: psutil.Process(pid).status() == psutil.STATUS_STOPPED, 10, f"{pid} stopped")


@pytest.fixture(autouse=True)
def short_peer_timeout():
    fiberlite.init(peer_timeout=TIMEOUT)
    liveness.reconfigure()
    yield
    fiberlite.init(peer_timeout=config.SETTINGS["peer_timeout"].default)
    liveness.reconfigure()


@pytest.fixture
def given_up(monkeypatch):
    """The names of the jobs given up as silent, in order (they are still killed)."""
    names: list[str] = []
    real = launcher.Launch._given_up

    def record(self) -> None:
        names.append(self.name)
        real(self)
    monkeypatch.setattr(launcher.Launch, "_given_up", record)
    return names


@pytest.fixture
def one_worker_per_job():
    fiberlite.init(workers_per_job=1)
    yield
    fiberlite.init(workers_per_job=None)


def square_where(x):
    time.sleep(0.01)
    return x * x, os.getpid(), time.time()


@contextlib.contextmanager
def map_with_frozen_worker(processes: int):
    """A pool's map of TASKS under way, one of its workers frozen: (pid, the map's result)."""
    with fiberlite.Pool(processes) as pool:
        pids = {pid for _, pid, _ in pool.map(square_where, range(4 * processes), chunksize=1)}
        victim = min(pids)
        result = pool.map_async(square_where, range(TASKS), chunksize=1)
        freeze(victim)
        yield pool, victim, result


def exact_results(result) -> list:
    results = result.get(60)
    assert [value for value, _, _ in results] == [x * x for x in range(TASKS)]
    return results


def results_after(results: list, pid: int, when: float) -> list:
    return [t for _, worker, t in results if worker == pid and t > when]


# -- pool ------------------------------------------------------------------------------------
def test_a_frozen_worker_is_lost_killed_and_its_tasks_done_by_others(one_worker_per_job, given_up):
    with map_with_frozen_worker(3) as (pool, victim, result):
        exact_results(result)
        assert len(given_up) == 1
        assert not psutil.pid_exists(victim) or psutil.Process(victim).status() == psutil.STATUS_ZOMBIE
        eventually(lambda: victim not in {p.pid for p in pool._pool}, 30, "the killed worker's replacement")


def map_with_frozen_host(pool) -> tuple:
    """A map of the pool (two hosts) begun, then the first host frozen: ``(its Process,
    its pid, the map's result)``."""
    pool.map(square_where, range(16), chunksize=1)
    hosts = list(pool._core.procs.values())
    assert len(hosts) == 2
    host, pid = hosts[0], hosts[0].pid
    result = pool.map_async(square_where, range(TASKS), chunksize=1)
    freeze(pid)
    return host, pid, result


@pytest.fixture
def two_workers_per_host():
    fiberlite.init(workers_per_job=2)
    yield
    fiberlite.init(workers_per_job=None)


def test_a_frozen_pool_host_is_lost_with_its_workers_and_their_tasks_done_by_others(
        two_workers_per_host, given_up, monkeypatch):
    """The hosted workers of a large pool reach the master through their host."""
    from fiberlite.pool.master import core
    monkeypatch.setattr(core, "NEARBY_HOSTED_MAX", 0)
    with fiberlite.Pool(4) as pool:
        host, pid, result = map_with_frozen_host(pool)  # its workers' messages wait in it
        exact_results(result)
        assert given_up == [host.name]
        eventually(lambda: not psutil.pid_exists(pid), 30, "the killed host's end")
        eventually(lambda: host not in pool._core.procs.values(), 30, "the host's replacement")


def test_a_frozen_pool_host_holds_up_none_of_the_work_of_its_workers_on_the_masters_socket(
        two_workers_per_host, given_up):
    """The hosted workers of a small pool reach the master over its socket: their host
    frozen, they work on; it is still given up, and its workers are lost with it."""
    with fiberlite.Pool(4) as pool:
        host, pid, result = map_with_frozen_host(pool)
        exact_results(result)
        eventually(lambda: given_up == [host.name], TIMEOUT + 10, "the frozen host's loss")
        eventually(lambda: not psutil.pid_exists(pid), 30, "the killed host's end")
        eventually(lambda: host not in pool._core.procs.values(), 30, "the host's replacement")
        exact_results(pool.map_async(square_where, range(TASKS), chunksize=1))


def test_a_worker_that_comes_back_after_the_timeout_is_fenced(one_worker_per_job, given_up, monkeypatch):
    # the backend cannot reach its node: the kill does not land, the worker comes back
    monkeypatch.setattr(launcher.Launch, "_kill_lost", lambda self: None)
    with map_with_frozen_worker(3) as (pool, victim, result):
        eventually(lambda: given_up, TIMEOUT + 10, "the frozen worker's loss")
        resumed = time.time()
        os.kill(victim, signal.SIGCONT)
        psutil.Process(victim).wait(30)   # it exits by itself (TimeoutExpired if not)
        # each result once, and nothing the fenced worker did after it came back
        assert not results_after(exact_results(result), victim, resumed)


def tell_and_nap(queue, seconds):
    queue.put(os.getpid())
    time.sleep(seconds)
    return os.getpid()


def test_a_frozen_worker_that_only_waited_for_work_is_lost_by_its_hub_connection(
        one_worker_per_job, given_up, monkeypatch):
    """A worker of single tasks asks for work over the master's nearby socket, never over
    the hub: the hub giving up its job still loses it, and its task runs elsewhere."""
    monkeypatch.setattr(launcher.Launch, "_kill_lost", lambda self: None)  # the kill does not land
    queue = fiberlite.Queue()
    with fiberlite.Pool(2) as pool:
        assert pool.apply(spin, (0,)) > 0
        result = pool.apply_async(tell_and_nap, (queue, 0.5))
        victim = queue.get(timeout=30)
        freeze(victim)
        try:
            assert result.get(TIMEOUT + 30) != victim  # run again by the other worker
            assert given_up
        finally:
            os.kill(victim, signal.SIGCONT)
        psutil.Process(victim).wait(30)  # fenced, it exits by itself


def test_a_worker_frozen_for_less_than_the_timeout_is_kept(one_worker_per_job, given_up):
    with map_with_frozen_worker(2) as (pool, victim, result):
        time.sleep(TIMEOUT / 3)   # the pause itself (nothing to wait for: it is the test)
        resumed = time.time()
        os.kill(victim, signal.SIGCONT)
        results = exact_results(result)
        assert given_up == []
        assert results_after(results, victim, resumed)   # it went on working


def spin(seconds):
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        pass
    return os.getpid()


def test_a_task_busy_in_python_for_longer_than_the_timeout_keeps_its_worker(one_worker_per_job, given_up):
    with fiberlite.Pool(1) as pool:
        first = pool.apply(spin, (0,))
        assert pool.apply(spin, (3 * TIMEOUT,)) == first
        assert given_up == []


# -- what the lost job held goes back -----------------------------------------------------------
def hold_lock(lock, ready):
    lock.acquire()
    ready.put(os.getpid())
    time.sleep(600)


def test_a_lock_held_by_a_frozen_job_is_released(given_up):
    lock, ready = fiberlite.Lock(), fiberlite.Queue()
    job = fiberlite.Process(target=hold_lock, args=(lock, ready))
    job.start()
    pid = ready.get(timeout=30)
    freeze(pid)
    assert lock.acquire(timeout=TIMEOUT + 20)
    lock.release()
    job.join(30)
    assert job.exitcode == -signal.SIGKILL and given_up == [job.name]


def read_some(q, count, ready):
    for _ in range(count):
        q.get(timeout=30)
    ready.put(os.getpid())
    time.sleep(600)


@pytest.mark.usefixtures("without_lanes")  # (a lane needs nobody but the kernel)
def test_items_sent_ahead_to_a_frozen_reader_go_back_to_the_queue(given_up):
    q, ready = fiberlite.Queue(), fiberlite.Queue()
    for i in range(200):
        q.put(i)
    read = 20   # past the point where the sole reader is linked and sent items ahead
    job = fiberlite.Process(target=read_some, args=(q, read, ready))
    job.start()
    pid = ready.get(timeout=30)
    # (sent ahead as the link starts, not necessarily before the reader's last read returns)
    eventually(lambda: q.qsize() < 200 - read, 30, "items sent ahead to the reader")
    freeze(pid)
    assert [q.get(timeout=TIMEOUT + 20) for _ in range(read, 200)] == list(range(read, 200))
    job.join(30)
    assert given_up == [job.name]


# -- whoever waits on a silent job gets a clear error -----------------------------------------
def _without_lanes() -> None:
    """(in a job) Queues made from now on keep their items in this process's hub."""
    from fiberlite.runtime.lanes import shared
    shared.enabled = lambda: False


def own_queue(back):
    _without_lanes()
    q = fiberlite.Queue()
    back.put((q, os.getpid()))
    time.sleep(600)


@pytest.mark.usefixtures("without_lanes")  # (a lane needs nobody but the kernel)
def test_a_getter_whose_queue_creator_goes_silent_gets_a_clear_error():
    back = fiberlite.Queue()
    job = fiberlite.Process(target=own_queue, args=(back,))
    job.start()
    q, pid = back.get(timeout=30)
    q.put("first")
    assert q.get(timeout=30) == "first"   # connected to the creator's process
    freeze(pid)
    frozen = time.monotonic()
    with pytest.raises(ConnectionLost, match=f"answered nothing for {TIMEOUT:g} s|has exited"):
        q.get(timeout=60)
    assert time.monotonic() - frozen >= EARLIEST
    job.join(30)


def own_full_queue(back, count):
    _without_lanes()
    q = fiberlite.Queue()
    for i in range(count):
        q.put(i)
    back.put((q, os.getpid()))
    time.sleep(600)


def arrived_over_link(q) -> bool:
    """Whether an item sent ahead to this process's link for ``q`` has arrived."""
    reader = reader_of(q._ref, GET)
    if reader is None:
        return False
    reader.reading.take_in()
    return bool(reader.reading.pending)


@pytest.mark.usefixtures("without_lanes")  # (a lane needs nobody but the kernel)
def test_a_linked_reader_whose_queue_creator_goes_silent_gets_a_clear_error():
    back = fiberlite.Queue()
    job = fiberlite.Process(target=own_full_queue, args=(back, 200))
    job.start()
    q, pid = back.get(timeout=30)
    got = [q.get(timeout=30) for _ in range(20)]   # linked by now: the rest is sent ahead
    eventually(lambda: arrived_over_link(q), 30, "items sent ahead over the link")
    freeze(pid)
    # this process gives the creator up, or (it is the creator's parent too) kills it first:
    # then the link ends, and the read through the creator's hub finds nothing listening
    with pytest.raises(ConnectionError, match=f"answered nothing for {TIMEOUT:g} s|exited"):
        while True:   # what had arrived is read until the creator is given up
            got.append(q.get(timeout=60))
    assert got == list(range(len(got)))   # in order, none twice
    assert len(got) > 20   # read from the link after the freeze: nothing else could answer
    job.join(30)


def test_a_proxy_whose_manager_goes_silent_gets_a_clear_error():
    with fiberlite.Manager() as manager:
        shared = manager.dict()
        shared["a"] = 1
        freeze(manager._process.pid)
        frozen = time.monotonic()
        # the proxy's connection gives the manager up, or (this process is its parent too)
        # the manager's job is given up and killed first, which ends that connection
        with pytest.raises(ConnectionLost, match=f"no longer running.*(answered nothing for {TIMEOUT:g} s|exited)"):
            shared["a"] = 2   # waits for an answer that does not come
        assert time.monotonic() - frozen >= EARLIEST


def ring_member(ring, pids):
    import numpy as np
    pids.put((ring.rank, os.getpid()))
    ring.barrier()
    if ring.rank == 1:
        time.sleep(600)
    ring.all_reduce(np.ones(4))


def test_a_ring_rank_that_goes_silent_fails_the_others_clearly(given_up):
    pids = fiberlite.Queue()
    ring = fiberlite.Ring(3, ring_member, args=(pids,), timeout=120)
    ring.start()
    ranks = dict(pids.get(timeout=60) for _ in range(3))
    freeze(ranks[1])
    with pytest.raises(RingError, match=f"rank 1 was given up: it answered nothing "
                                        f"for {TIMEOUT:g} s") as info:
        ring.join(TIMEOUT + 30)
    assert info.value.rank == 1 and ring.exitcodes[1] == -signal.SIGKILL
    assert ring.exitcodes[0] == ring.exitcodes[2] == 1   # their collective raised
