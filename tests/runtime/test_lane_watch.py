"""A queue's lane is watched by one waiting reader while the others sleep
(:mod:`fiberlite.runtime.lanes.watch`): a sleeper is woken whenever a message would
otherwise wait with nobody watching, and a watcher killed while it watches neither
stops the others nor keeps the watch."""
from __future__ import annotations

import os
import signal
import threading
import time

import pytest

import fiberlite
import pattern_jobs
from fiberlite.runtime.lanes import watch as watch_module
from fiberlite.runtime.shm import sync

pytestmark = [pytest.mark.timeout(120),
              pytest.mark.skipif(sync.PORTABLE, reason="the watch needs the C extension's words")]


def _until(condition, seconds: float = 30.0) -> bool:
    deadline = time.monotonic() + seconds
    while not condition():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.005)
    return True


def _watch(q):
    watch = q._lane.lane.watch
    assert watch is not None, "a queue of this machine has a watched lane"
    return watch


@pytest.mark.parametrize("kind", ["SimpleQueue", "Queue"])
def test_a_sleeping_reader_is_woken_for_a_message_nobody_watches(kind, monkeypatch):
    """Two messages for a watcher and a sleeper: the sleeper gets the one the watcher
    left (a sleeper's own look at the lane is pushed out of the test's reach)."""
    monkeypatch.setattr(watch_module, "SLICE", 600.0)
    q = getattr(fiberlite, kind)()
    watch = _watch(q)
    got: list = []
    readers = [threading.Thread(target=lambda: got.append(q.get())) for _ in range(2)]
    readers[0].start()
    assert _until(lambda: watch.role.owner() != 0), "the first reader watches the lane"
    readers[1].start()
    assert _until(lambda: sync.load(watch.sleepers) == 1), "the second reader sleeps"
    q.put("first")
    q.put("second")
    for reader in readers:
        reader.join(30)
    assert sorted(got) == ["first", "second"], "a reader slept through a message left to it"


def test_a_watcher_killed_while_watching_stops_no_reader_and_gives_the_watch_back():
    q, out = fiberlite.SimpleQueue(), fiberlite.SimpleQueue()
    watch = _watch(q)
    victim = fiberlite.Process(target=pattern_jobs.get_until_none, args=(q, out))
    victim.start()
    assert _until(lambda: watch.role.owner() != 0), "the first reader watches the lane"
    reader = fiberlite.Process(target=pattern_jobs.get_until_none, args=(q, out))
    reader.start()
    assert _until(lambda: sync.load(watch.sleepers) == 1), "the second reader sleeps"
    os.kill(victim.pid, signal.SIGKILL)
    victim.join(30)
    for i in range(100):
        q.put(i)
    q.put(None)
    assert out.get() == list(range(100))
    reader.join(30)
    assert reader.exitcode == 0
    assert _until(lambda: watch.role.owner() == 0), "the dead watcher's watch was given back"
