"""Pools whose workers are forked inside host jobs: the guarantees hold per worker and per host."""
from __future__ import annotations

import os
import random
import signal
import sys
import textwrap
import time

import cloudpickle
import psutil
import pytest

import fiberlite
from fiberlite.pool import BrokenPoolError, Pool, WorkerLostError
from fiberlite.pool.job.upstream import dump_message, load_message
from waiting import eventually
from interpreters import run_python

pytestmark = pytest.mark.timeout(120)

cloudpickle.register_pickle_by_value(sys.modules[__name__])

_initialized = None


@pytest.fixture(autouse=True)
def three_workers_per_host():
    fiberlite.init(workers_per_job=3)
    yield
    fiberlite.init(workers_per_job=None)


def whoami(x):
    time.sleep(0.01)
    return x, os.getpid(), fiberlite.current_process().name


def nap(x):
    time.sleep(0.002)
    return x * x


def sigkill_on(x, bad=5):
    if x == bad:
        os.kill(os.getpid(), signal.SIGKILL)
    return x


def remember(value):
    global _initialized
    _initialized = value


def initialized(_):
    return _initialized


def init_raises():
    raise RuntimeError("the initializer cannot reach the database")


def test_workers_are_forked_in_hosts_and_run_tasks():
    with Pool(6) as pool:
        assert pool._core.per_job == 3 and len(pool._core.procs) == 2
        results = pool.map(whoami, range(60), 1)
        assert [r[0] for r in results] == list(range(60))
        pids = {p.pid for p in pool._pool}
        assert len(pids) == 6 and {r[1] for r in results} <= pids
        assert all(r[2].startswith("PoolWorker-") for r in results)
        hosts = {p.pid for p in pool._core.procs.values()}
        for pid in pids:  # worker <- fork template <- host job
            assert psutil.Process(pid).parent().parent().pid in hosts
    pool.join()


def template_mark(_):
    time.sleep(0.01)
    return os.getpid(), os.environ.get("FIBERLITE_FORK_TEMPLATE")


def templates_of(pool):
    """host pid -> its fork template, the parent of its workers, once all six have run a task."""
    seen = {}
    eventually(lambda: len(seen.update(pool.map(template_mark, range(12), 1)) or seen) == 6,
               what=lambda: f"workers that ran a task: {sorted(seen)}")
    assert set(seen.values()) == {None}  # the mark that asked for the template reaches no worker
    return {p.pid: psutil.Process(p.pid).children()[0] for p in pool._core.procs.values()}


def test_a_host_job_forks_its_template_as_it_starts():
    """No second interpreter per host: the template is a fork of the host's job (same
    command line)."""
    with Pool(6) as pool:
        for host, template in templates_of(pool).items():
            assert template.cmdline() == psutil.Process(host).cmdline()
            assert {w.pid for w in template.children()} <= {p.pid for p in pool._pool}
    pool.join()


def test_a_host_job_without_the_mark_starts_its_template_itself(monkeypatch):
    monkeypatch.setattr("fiberlite.runtime.launcher.FORK_TEMPLATE", "FIBERLITE_UNUSED_MARK")
    with Pool(6) as pool:
        assert pool.map(nap, range(30), 1) == [i * i for i in range(30)]
        for template in templates_of(pool).values():
            assert "fiberlite.pool.job.template" in " ".join(template.cmdline())
    pool.join()


def double(array):
    return array * 2


def test_large_arrays_and_bytes_travel_through_hosts():
    import numpy as np
    arrays = [np.arange(200_000, dtype=np.float64) + i for i in range(6)]
    with Pool(3) as pool:
        for got, sent in zip(pool.map(double, arrays, 1), arrays):
            assert (got == sent * 2).all()
        assert pool.apply(bytes, (3_000_000,)) == bytes(3_000_000)


def test_initializer_runs_in_every_hosted_worker():
    with Pool(4, initializer=remember, initargs=("ready",)) as pool:
        assert set(pool.map(initialized, range(40), 1)) == {"ready"}


def test_initializer_that_raises_breaks_the_pool_clearly():
    with Pool(3, initializer=init_raises) as pool:
        with pytest.raises(BrokenPoolError, match="cannot reach the database"):
            pool.map(nap, range(10))


def test_maxtasksperchild_replaces_hosted_workers():
    with Pool(3, maxtasksperchild=2) as pool:
        results = pool.map(whoami, range(30), 1)
        assert [r[0] for r in results] == list(range(30))
        assert len({r[1] for r in results}) >= 15  # each worker ran at most 2 tasks
        assert len(pool._core.procs) == 1  # replaced inside their host


def test_poison_task_fails_after_bounded_tries_in_hosts():
    """A task that kills its worker fails, named with how it killed it (its host reports
    that, however the worker reached the master)."""
    with Pool(3) as pool:
        results = [pool.apply_async(sigkill_on, (i,)) for i in range(8)]
        for i, result in enumerate(results):
            if i == 5:
                with pytest.raises(WorkerLostError, match=r"sigkill_on\(5\)") as info:
                    result.get(60)
                message = str(info.value)
                assert "SIGKILL" in message and "connection lost" not in message
            else:
                assert result.get(60) == i


def _peers_by_worker(pool) -> dict[int, list[int]]:
    return {wid: list(w.peers) for wid, w in pool._core.dispatcher.workers.items()}


def test_hosted_workers_of_a_small_pool_reach_the_master_over_its_socket(machine_path):
    """Workers forked in hosts on the master's machine send their requests over the
    master's socket for workers of its machine, not through their host and nng."""
    from fiberlite.pool.master.nearby import PEERS_BELOW
    with Pool(6) as pool:
        assert pool.map(nap, range(200)) == [i * i for i in range(200)]
        assert [pool.apply(nap, (i,)) for i in range(6)] == [i * i for i in range(6)]
        # each worker, once started, asks for work (a machine under load starts some late)
        eventually(lambda: all(_peers_by_worker(pool).values()), what="every worker asking")
        peers = _peers_by_worker(pool)
        assert len(peers) == 6
        if machine_path == "shared":
            assert all(p < -PEERS_BELOW for ps in peers.values() for p in ps), peers
        else:  # through their hosts: the relay's stand-in for each worker's connection
            assert pool._core.nearby is None
            assert all(ps == [-wid] for wid, ps in peers.items()), peers


def test_hosted_workers_of_a_large_pool_go_through_their_hosts(monkeypatch):
    """Beyond a few dozen workers the master pays per host's message, not per worker's."""
    from fiberlite.pool.master import core
    monkeypatch.setattr(core, "NEARBY_HOSTED_MAX", 2)
    with Pool(3) as pool:
        assert pool.map(nap, range(100)) == [i * i for i in range(100)]
        assert pool._core.nearby is None
        eventually(lambda: all(_peers_by_worker(pool).values()), what="every worker asking")
        assert all(ps == [-wid] for wid, ps in _peers_by_worker(pool).items())


def _kill(pids, rng):
    victim = rng.choice(sorted(pids))
    try:
        os.kill(victim, signal.SIGKILL)
    except ProcessLookupError:
        pass
    return victim


def test_killed_hosted_workers_lose_and_duplicate_nothing():
    """SIGKILL random workers, many times over, while a map runs: every result, once."""
    rng = random.Random(1)
    n = 3000
    with Pool(6) as pool:
        result = pool.map_async(nap, range(n), 1)
        killed = []
        while not result.ready() and len(killed) < 12:
            time.sleep(rng.uniform(0.02, 0.15))
            pids = {p.pid for p in pool._pool}
            if pids:
                killed.append(_kill(pids, rng))
        assert result.get(90) == [i * i for i in range(n)]
        assert killed, "the map ended before any worker was killed"
        assert max(pool._core.dispatcher.workers) > 6, "no worker was started in a killed one's place"


def test_killed_host_loses_and_duplicates_nothing():
    """SIGKILL a whole host (and with it its workers) mid-map; a new host takes over."""
    n = 2000
    with Pool(6) as pool:
        result = pool.map_async(nap, range(n), 1)
        first_hosts = {hid: p.pid for hid, p in pool._core.procs.items()}
        eventually(lambda: result._progress() > 0, what="the map's first results")
        assert not result.ready(), "the map ended before the host was killed"
        victim = min(first_hosts)
        os.kill(first_hosts[victim], signal.SIGKILL)
        assert result.get(90) == [i * i for i in range(n)]
        assert max(pool._core.procs) > max(first_hosts), "no host replaced the killed one"


def test_close_and_join_end_hosts_templates_and_workers():
    pool = Pool(6)
    assert pool.map(nap, range(20)) == [i * i for i in range(20)]
    processes = [psutil.Process(p.pid) for p in pool._pool]
    processes += [psutil.Process(p.pid) for p in pool._core.procs.values()]
    processes += [child for p in pool._core.procs.values()
                  for child in psutil.Process(p.pid).children()]
    pool.close()
    pool.join()
    _gone, alive = psutil.wait_procs(processes, timeout=15)
    assert not alive, f"left running after join: {alive}"


@pytest.mark.timeout(180)
def test_hundreds_of_workers_under_a_soft_open_file_limit_of_256(tmp_path):
    """A laptop's defaults: soft limit 256, a larger hard one. The pool raises the soft one."""
    script = tmp_path / "many.py"
    script.write_text(textwrap.dedent("""
        import faulthandler, os, resource, sys
        import fiberlite
        def pid(_):
            import time
            time.sleep(0.2)
            return os.getpid()
        if __name__ == "__main__":
            faulthandler.dump_traceback_later(150, exit=True)  # where it hangs, if it does
            resource.setrlimit(resource.RLIMIT_NOFILE, (256, 4096))
            fiberlite.init(workers_per_job=None)
            with fiberlite.Pool(300) as pool:
                seen = set()
                for _ in range(20):
                    seen.update(pool.map(pid, range(300), 1))
                    if len(seen) == 300:
                        break
                print(len(seen), resource.getrlimit(resource.RLIMIT_NOFILE)[0])
    """))
    done = run_python(script, cwd=tmp_path, timeout=170)
    assert done.returncode == 0, done.stderr[-6000:]
    assert done.stdout.split() == ["300", "4096"]


def test_a_pool_that_cannot_fit_the_hard_limit_says_how_to_raise_it(tmp_path):
    script = tmp_path / "toomany.py"
    script.write_text(textwrap.dedent("""
        import resource
        import fiberlite
        if __name__ == "__main__":
            resource.setrlimit(resource.RLIMIT_NOFILE, (64, 64))
            fiberlite.init(workers_per_job=1)
            fiberlite.Pool(100)
    """))
    done = run_python(script, cwd=tmp_path, timeout=60)
    assert done.returncode == 1
    last = done.stderr.strip().splitlines()[-1]
    assert "Pool(100) needs about 400 more open files" in last and "ulimit -n" in last, last


def test_a_host_whose_workers_never_started_counts_as_one_failed_start():
    from fiberlite.pool.master.dispatch import BROKEN, RUN, Dispatcher
    from fiberlite.pool.master.relay import HostRelay
    dispatcher = Dispatcher(lambda results: None)
    relay = HostRelay(dispatcher, lambda hid: None, lambda: None)
    for hid in (1, 2, 3):
        wids = [hid * 10 + i for i in range(3)]
        for wid in wids:
            dispatcher.add_worker(wid)
        relay.add_host(hid, wids)
    relay.host_gone(1, 1)
    relay.host_gone(2, 1)
    assert (dispatcher.start_failures, dispatcher.state) == (2, RUN)
    assert dispatcher.staying() == 3 and sorted(dispatcher.workers) == [30, 31, 32]
    relay.host_gone(3, 1)
    assert dispatcher.state == BROKEN and "3 in a row" in str(dispatcher.broken_error)


def pid_after_a_nap(_):
    time.sleep(0.05)
    return os.getpid()


def test_one_host_forks_hundreds_of_workers_at_once():
    """Host and template talk over a socket that queues few messages each way: hundreds of
    fork requests and fork reports crossing must not block both ends."""
    fiberlite.init(workers_per_job=250)
    with Pool(250) as pool:
        assert len(pool._core.procs) == 1
        seen: set = set()
        eventually(lambda: seen.update(pool.map(pid_after_a_nap, range(250), 1)) or len(seen) == 250,
                   60, what=lambda: f"every worker ran a task ({len(seen)} of 250)")


class _Answer:
    """Stands for a host's request to the relay: keeps the answer."""

    def __init__(self, peer: int) -> None:
        self.peer, self.value, self.answered = peer, None, False

    def reply(self, value=None) -> None:
        self.value, self.answered = value, True


def test_a_post_is_answered_with_its_answers_and_the_poll_with_what_comes_later():
    from fiberlite.pool.chunks import pack, pack_call
    from fiberlite.pool.master.dispatch import Dispatcher
    from fiberlite.pool.master.relay import HostRelay
    dispatcher = Dispatcher(lambda results: None)
    relay = HostRelay(dispatcher, lambda hid: None, lambda: None)
    for wid in (1, 2):
        dispatcher.add_worker(wid)
    relay.add_host(7, [1, 2])
    poll = _Answer(-7)
    relay.op_poll(poll, 7)
    assert not poll.answered  # nothing ready: the poll waits

    post = _Answer(-7)  # worker 1 wants work; none yet, so it waits at the dispatcher
    relay.op_post(post, 7, [(1, dump_message((5, "next", (1, [], None, 1, False))))])
    assert post.value == [] and not poll.answered

    group = dispatcher.new_group("map", pack_call("map", abs, "map"), "abs", sink=None)
    dispatcher.submit(group, [dispatcher.make_chunk(group, i, 1, pack([i])) for i in range(3)],
                      seal=True, new=True)
    assert poll.answered  # work came between posts: the parked poll carries worker 1's
    ((kind, wid, frame),) = poll.value  # its answer framed for the host to pass on as it is
    seq, ok, (chunks, functions, _, more) = load_message(frame)
    assert (kind, wid, seq, ok, [c[0] for c in chunks]) == ("reply", 1, 5, True, [1])
    assert list(functions) == [group.gid] and more  # two chunks still pending

    post = _Answer(-7)  # worker 1 returns its result and asks again; worker 2 asks
    relay.op_post(post, 7, [
        (1, dump_message((6, "next", (1, [(chunks[0][0], None)], pack([[0]]), 1, False)))),
        (2, dump_message((1, "next", (2, [], None, 1, False))))])
    answers = {item[1]: load_message(item[2]) for item in post.value}
    assert sorted((wid, answer[0]) for wid, answer in answers.items()) == [(1, 6), (2, 1)]
    handed = sorted(c[0] for answer in answers.values() for c in answer[2][0])
    assert handed == [2, 3]  # the other two chunks, one each, in the post's own answer


def test_a_frame_the_relay_cannot_load_is_skipped_and_the_post_answered():
    """A worker's frame that is not a pickle is logged and dropped; the host's other
    messages are served and its post is answered (the host never stops posting)."""
    from fiberlite.pool.master.dispatch import Dispatcher
    from fiberlite.pool.master.relay import HostRelay
    dispatcher = Dispatcher(lambda results: None)
    relay = HostRelay(dispatcher, lambda hid: None, lambda: None)
    dispatcher.add_worker(1)
    relay.add_host(7, [1])
    post = _Answer(-7)
    relay.op_post(post, 7, [(1, b"not a pickle"), (1, dump_message((2, "next", (1, [], None, 0, False))))])
    assert post.answered
    ((kind, wid, frame),) = post.value  # want 0: the worker is told to retire
    assert (kind, wid, load_message(frame)) == ("reply", 1, (2, True, None))


def test_hosted_workers_in_pool_pool_say_whether_they_are_alive():
    """``Pool._pool``, as CPython's example reads it: alive while the pool runs, and no
    longer once it is closed and joined, the list taken before included."""
    with Pool(3) as pool:
        assert pool.map(nap, range(6)) == [x * x for x in range(6)]
        workers = pool._pool
        assert len(workers) == 3 and all(w.is_alive() for w in workers), workers
        pool.close()
        pool.join()
        assert not any(w.is_alive() for w in workers), workers
        assert pool._pool == []
