"""Pools that grow and shrink: resize() mid-map and idle_timeout, every task run once.

Each task appends its number to a log file as it runs, so that a test counts what ran:
a task lost or run twice shows there, whatever the results say. Parametrized over
workers that are jobs of their own and workers forked in host jobs.
"""
from __future__ import annotations

import collections
import os
import sys
import time

import cloudpickle
import pytest

import fiberlite
from fiberlite import config
from fiberlite.pool import Pool
from waiting import eventually

pytestmark = pytest.mark.timeout(120)

cloudpickle.register_pickle_by_value(sys.modules[__name__])


@pytest.fixture
def settings(monkeypatch):
    """Settings a test makes with fiberlite.init are undone after it."""
    monkeypatch.setattr(config, "_overrides", dict(config._overrides))
    monkeypatch.setattr(config, "_resolved", None)


@pytest.fixture(params=[1, 3], ids=["worker-jobs", "hosted-workers"])
def per_job(request, settings):
    """Workers per job: 1 (each worker a job) or 3 (forked in hosts)."""
    fiberlite.init(workers_per_job=request.param)
    return request.param


def logged(x: int, path: str, seconds: float = 0.01, gate=None) -> tuple[int, int]:
    """Note that task ``x`` ran (one line, appended atomically), wait for ``gate`` (an
    Event) if given, then return its square."""
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT)
    try:
        os.write(fd, f"{x}\n".encode())
    finally:
        os.close(fd)
    if gate is not None:
        assert gate.wait(60), "the gate was never opened"
    time.sleep(seconds)
    return x * x, os.getpid()


def runs(path) -> collections.Counter:
    """How many times each task ran."""
    with open(path) as fh:
        return collections.Counter(int(line) for line in fh)


def test_resize_grows_and_shrinks_mid_map_without_losing_or_repeating(per_job, tmp_path):
    log = str(tmp_path / "ran")
    n = 600
    gate = fiberlite.Event()
    with Pool(2) as pool:
        results = pool.imap(lambda x: logged(x, log, gate=gate if x >= 40 else None), range(n))
        got = [next(results) for _ in range(40)]
        pool.resize(6)
        # each worker stops at the first task past 40 until the gate opens: six of those
        # begun are the two workers of before and four new ones (however slow they start)
        eventually(lambda: sum(1 for x in runs(log) if x >= 40) >= 6, timeout=60,
                   what="six workers at work")
        gate.set()
        grown = [next(results) for _ in range(260)]
        assert len({pid for _, pid in grown}) >= 3, "no new worker took work after growing"
        pool.resize(1)
        got += grown + list(results)
        assert [value for value, _ in got] == [x * x for x in range(n)]
        ran = runs(log)
        assert sorted(ran) == list(range(n)) and set(ran.values()) == {1}, "a task ran twice"
        eventually(lambda: len(pool._pool) == len(pool._core.procs) == 1, what="the shrunk pool")
        assert pool._core.dispatcher.staying() == 1
        assert pool.map(lambda x: logged(x, log, 0), range(n, n + 30)) == \
            [(x * x, pool._pool[0].pid) for x in range(n, n + 30)]
        assert pool._core.dispatcher.start_failures == 0


def test_a_pool_shrunk_to_zero_when_idle_restarts_for_the_next_map(per_job, tmp_path):
    """idle_timeout: the workers go and their jobs end; the next map starts them again."""
    fiberlite.init(idle_timeout=0.5)
    log = str(tmp_path / "ran")
    with Pool(4) as pool:
        core = pool._core
        first = pool.map(lambda x: logged(x, log), range(200), 1)
        assert [value for value, _ in first] == [x * x for x in range(200)]
        eventually(lambda: not core.procs and not fiberlite.active_children(),
                   what="the idle pool's jobs")
        assert core.dispatcher.released and core.dispatcher.staying() == 0
        assert fiberlite.active_children() == [] and pool._pool == []
        second = pool.map(lambda x: logged(x, log), range(200, 500), 1)
        assert [value for value, _ in second] == [x * x for x in range(200, 500)]
        ran = runs(log)
        assert sorted(ran) == list(range(500)) and set(ran.values()) == {1}
        assert len(pool._pool) == 4 and not core.dispatcher.released
        assert not {pid for _, pid in first} & {pid for _, pid in second}, "old workers ran on"


def test_a_busy_pool_keeps_its_workers_past_idle_timeout(settings, tmp_path):
    fiberlite.init(idle_timeout=0.3)
    with Pool(2) as pool:
        result = pool.map(lambda x: logged(x, str(tmp_path / "ran"), 0.05), range(40), 1)
        assert len({pid for _, pid in result}) == 2  # the same two, for 1 s of work
        assert not pool._core.dispatcher.released


def test_resize_rejects_a_bad_size_clearly():
    with Pool(1) as pool:
        for size in (0, -1, 2.5, "3", True):
            with pytest.raises(ValueError, match="at least 1"):
                pool.resize(size)
        pool.close()
        with pytest.raises(ValueError, match="Pool not running"):
            pool.resize(2)
