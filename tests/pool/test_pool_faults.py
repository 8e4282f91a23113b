"""Pool resilience: dying workers, poison tasks, workers that cannot start, terminate."""
from __future__ import annotations

import os
import random
import signal
import subprocess
import sys
import textwrap
import threading
import time

import cloudpickle
import psutil
import pytest

import fiberlite
from fiberlite.pool import BrokenPoolError, Pool, WorkerLostError
from interpreters import start_python

pytestmark = pytest.mark.timeout(60)

cloudpickle.register_pickle_by_value(sys.modules[__name__])


def square(x):
    return x * x


def crash_on(x, bad=7):
    if x == bad:
        os._exit(1)
    return x


def sigkill_on(x, bad=5):
    if x == bad:
        os.kill(os.getpid(), signal.SIGKILL)
    return x


def raise_on(x):
    if x % 2:
        raise ValueError(x)
    return os.getpid()


def init_raises():
    raise RuntimeError("the initializer cannot connect to the database")


def init_exits():
    os._exit(3)


def nap(seconds):
    time.sleep(seconds)
    return seconds


def _kill_random_worker(pool, rng):
    workers = [p for p in pool._pool if p.pid is not None]
    if workers:
        victim = rng.choice(workers)
        try:
            os.kill(victim.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        return victim.pid


def test_map_survives_killed_workers():
    """SIGKILL random workers during a 20,000-task map: every result, in order."""
    rng = random.Random(1)
    n = 20_000
    with Pool(3) as pool:
        pool.map(square, range(30))  # workers are up
        result = pool.map_async(nap, [0.0001] * n, chunksize=1)
        killed = []
        for _ in range(4):  # a kill every 0.1 s while the map runs
            result.wait(0.1)
            if result.ready():
                break
            killed.append(_kill_random_worker(pool, rng))
        values = result.get(45)
        assert values == [0.0001] * n
        assert killed, "the map ended before any worker was killed"
        assert max(pool._core.dispatcher.workers) > 3, "no replacement worker was started"
        assert pool.map(square, range(100)) == [x * x for x in range(100)]  # replacements work
    pool.join()


def test_imap_survives_killed_workers_exactly_once():
    """Kill workers at fixed points of an imap: results come in order, none twice, none lost."""
    rng = random.Random(2)
    n = 20_000
    kill_at = {1_000, 6_000, 11_000, 16_000}
    with Pool(3) as pool:
        got = []
        for i, value in enumerate(pool.imap(square, range(n), chunksize=5)):
            got.append(value)
            if i in kill_at:
                _kill_random_worker(pool, rng)
        assert got == [x * x for x in range(n)]
        unordered = []
        for i, value in enumerate(pool.imap_unordered(square, range(n))):
            unordered.append(value)
            if i in kill_at:
                _kill_random_worker(pool, rng)
        assert len(unordered) == n and sorted(unordered) == [x * x for x in range(n)]
    pool.join()


def test_poison_task_fails_after_bounded_tries_and_others_complete():
    started = time.monotonic()
    with Pool(2) as pool:
        it = pool.imap(crash_on, range(20), chunksize=4)
        got = []
        with pytest.raises(WorkerLostError) as info:
            for value in it:
                got.append(value)
        assert got == list(range(7))
        assert list(it) == list(range(8, 20))  # the others complete
        message = str(info.value)
        assert "crash_on(7)" in message and "3 workers" in message
        # apply_async: the poisoned result raises, the others are fine
        results = [pool.apply_async(sigkill_on, (i,)) for i in range(8)]
        for i, result in enumerate(results):
            if i == 5:
                with pytest.raises(WorkerLostError, match=r"sigkill_on\(5\)"):
                    result.get(30)
            else:
                assert result.get(30) == i
        assert pool.map(square, range(10)) == [x * x for x in range(10)]
    pool.join()
    assert time.monotonic() - started < 30


def test_task_exceptions_do_not_kill_workers():
    with Pool(2) as pool:
        pids = {p.pid for p in pool._pool}
        for _ in range(3):
            with pytest.raises(ValueError):
                pool.map(raise_on, range(20), 1)
        assert set(pool.map(raise_on, range(0, 40, 2), 1)) <= pids
        assert {p.pid for p in pool._pool} == pids
    pool.join()


@pytest.mark.parametrize("initializer, expected", [
    (init_raises, "the initializer cannot connect to the database"),
    (init_exits, "exit code 3"),
])
def test_pool_whose_workers_cannot_start_fails_clearly(initializer, expected):
    started = time.monotonic()
    pool = Pool(2, initializer=initializer)
    try:
        result = pool.map_async(square, range(10))
        with pytest.raises(BrokenPoolError, match=expected):
            result.get(30)
        assert time.monotonic() - started < 20
        with pytest.raises(BrokenPoolError, match="cannot start"):
            pool.apply_async(square, (1,))
    finally:
        pool.terminate()
        pool.join()
    assert fiberlite.active_children() == []


def test_terminate_stops_workers_and_threads():
    before = {t.ident for t in threading.enumerate()}
    pool = Pool(2)
    it = pool.imap(square, iter(int, 1))  # an endless input
    assert next(it) == 0
    pending = pool.map_async(nap, [10] * 6, 1)
    pids = [p.pid for p in pool._pool]
    pool.terminate()
    pool.join()
    assert not [pid for pid in pids if _running(pid)]
    with pytest.raises(fiberlite.ProcessError):
        pending.get(5)
    left = [t for t in threading.enumerate() if t.ident not in before and t.name.startswith("fiberlite-pool")]
    for thread in left:
        thread.join(5)
    assert not [t for t in left if t.is_alive()], [t.name for t in left]
    assert fiberlite.active_children() == []


def _running(pid):
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


@pytest.mark.parametrize("per_job", [1, 2], ids=["worker-jobs", "hosted-workers"])
def test_workers_die_with_their_master(tmp_path, per_job):
    """SIGKILL the process that owns the pool: its workers (and their hosts and fork
    templates) exit on their own."""
    script = tmp_path / "master.py"
    script.write_text(textwrap.dedent(f"""
        import os, sys, time
        import fiberlite
        def nap(x):
            time.sleep(60)
        if __name__ == "__main__":
            fiberlite.init(workers_per_job={per_job})
            pool = fiberlite.Pool(4)
            pool.map(abs, range(8))  # workers are up
            pool.map_async(nap, range(4), 1)
            print(" ".join(str(p.pid) for p in pool._pool), flush=True)
            time.sleep(60)
    """))
    master = start_python(script, stdout=subprocess.PIPE, cwd=tmp_path)
    try:
        pids = [int(pid) for pid in master.stdout.readline().split()]
        assert len(pids) == 4
        everyone = psutil.Process(master.pid).children(recursive=True)
        assert {p.pid for p in everyone} >= set(pids)
        assert len(everyone) >= (4 if per_job == 1 else 4 + 2 + 2)  # + hosts and templates
        master.kill()
        master.wait(10)
        _gone, alive = psutil.wait_procs(everyone, timeout=20)
        alive = [p for p in alive if _running(p.pid)]  # orphans' zombies wait for init to reap them
        assert not alive, f"outlived their master: {alive}"
    finally:
        master.kill()
        master.wait()


# -- the dispatcher alone: protocol invariants with fake workers ------------------------------
class FakeRequest:
    def __init__(self, peer):
        self.peer = peer
        self.answers = []

    def reply(self, value=None):
        self.answers.append(value)

    def fail(self, exc):
        self.answers.append(exc)


def _dispatcher(n_chunks, workers=(1, 2)):
    from fiberlite.pool.master.dispatch import Dispatcher
    from fiberlite.pool.chunks import pack
    from fiberlite.wire.codec import Payload

    delivered = []
    dispatcher = Dispatcher(lambda results: delivered.extend(e for _, entries in results for e in entries))
    group = dispatcher.new_group("map", Payload.pack(("map", square)), "square", sink="sink")
    chunks = [dispatcher.make_chunk(group, i, 1, pack([i])) for i in range(n_chunks)]
    for wid in workers:
        dispatcher.add_worker(wid)
    dispatcher.submit(group, chunks, seal=True, new=True)
    return dispatcher, delivered


def _ask(dispatcher, wid, peer, results=(), want=2, prefetch=False):
    request = FakeRequest(peer)
    dispatcher.op_next(request, wid, [(cid, None) for cid in results], b"values", want, prefetch)
    return request


def test_dispatcher_delivers_each_chunk_once_across_a_lost_worker():
    dispatcher, delivered = _dispatcher(6)
    first = _ask(dispatcher, 1, peer=11)
    second = _ask(dispatcher, 2, peer=12)
    (w1_chunks, functions, _, _), = first.answers
    (w2_chunks, _, _, _), = second.answers
    assert len(w1_chunks) == 2 and len(w2_chunks) == 2 and functions
    dispatcher.peer_lost(11)  # worker 1 dies holding two chunks
    third = _ask(dispatcher, 2, peer=12, results=[c[0] for c in w2_chunks])
    (suspect, _, _, _), = third.answers
    assert len(suspect) == 1, "a chunk held by a dead worker travels alone"
    stale = _ask(dispatcher, 1, peer=11, results=[c[0] for c in w1_chunks])  # too late: ignored
    assert stale.answers == [None]
    duplicate = [c[0] for c in suspect] * 2  # the same result twice
    _ask(dispatcher, 2, peer=12, results=duplicate, prefetch=True)
    starts = sorted(start for _sink, start, _count, _status, _data in delivered)
    assert starts == [0, 2, 3]  # worker 2's two, then the suspect once; none twice


def test_dispatcher_prefetch_is_never_parked_and_idle_request_is():
    dispatcher, _ = _dispatcher(1)
    got = _ask(dispatcher, 1, peer=11, want=5)
    (chunks, _, _, _), = got.answers
    prefetch = _ask(dispatcher, 1, peer=11, want=5, prefetch=True)
    assert prefetch.answers == [([], {}, [], False)]  # at once, with nothing
    idle = _ask(dispatcher, 2, peer=12)
    assert idle.answers == []  # held until there is work
    dispatcher.close()
    assert idle.answers == []  # the call is not finished: the worker stays
    _ask(dispatcher, 1, peer=11, results=[c[0] for c in chunks])
    assert idle.answers == [None]  # all done and closed: exit


def test_dispatcher_gives_up_on_a_task_that_kills_every_worker():
    from fiberlite.pool.master.dispatch import LOCAL_ERROR
    dispatcher, delivered = _dispatcher(1, workers=(1, 2, 3))
    for wid in (1, 2, 3):
        request = _ask(dispatcher, wid, peer=10 + wid)
        assert request.answers and request.answers[0][0], f"worker {wid} got the task"
        dispatcher.worker_exited(wid, -9)
    (_sink, _start, _count, status, error), = delivered
    assert status == LOCAL_ERROR and isinstance(error, WorkerLostError)
    assert "square(0)" in str(error) and "SIGKILL" in str(error)


def test_lost_task_is_described_by_the_kind_of_its_call():
    from fiberlite.pool.chunks import describe_args, pack
    assert describe_args("apply", pack(((1, "a"), {"k": None}))) == "1, 'a', k=None"
    assert describe_args("star", pack([(2, 3)])) == "2, 3"
    assert describe_args("map", pack([(2, 3)])) == "(2, 3)"
    assert describe_args("map", pack([4, 5])) == "one of [4, 5]"
    assert describe_args("map", b"not a pickle").startswith("<arguments could not be shown")
