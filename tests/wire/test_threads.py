"""Work that needs a thread still runs where the interpreter refuses new ones (Python
3.12.0 and 3.12.1 in ``atexit`` hooks): the standby thread runs it. The refusal is made
here by hand, so the fallback is tested on every Python; the real one is met by the
exit shapes on 3.12 (tests/test_python_versions.py)."""
from __future__ import annotations

import threading

import pytest

from fiberlite.wire import threads


@pytest.fixture
def refusing(monkeypatch):
    """An interpreter that needs the standby, and ``refuse()`` to make it stop starting
    threads (as 3.12.1 does once its ``atexit`` hooks run)."""
    monkeypatch.setattr(threads, "REFUSES_AT_EXIT", True)
    monkeypatch.setattr(threads, "_standby", None)
    threads.prepare()  # while threads can still start
    assert threads._standby is not None
    started = threading.Thread.start

    def refuse():
        def start(self):
            if self.name.startswith("test-"):
                raise RuntimeError("can't create new thread at interpreter shutdown")
            return started(self)
        monkeypatch.setattr(threading.Thread, "start", start)
    return refuse


def test_work_runs_on_the_standby_when_no_thread_starts(refusing):
    refusing()
    ran = []
    done = threading.Event()

    def work(a, b):
        ran.append((a, b, threading.current_thread().name))
        done.set()
    threads.start(work, 1, 2, name="test-work")
    assert done.wait(10)
    assert ran == [(1, 2, "fiberlite-standby")]


def test_run_for_waits_for_work_on_the_standby(refusing):
    refusing()
    ran = []
    assert threads.run_for(lambda: ran.append(threading.current_thread().name), 10, name="test-bounded")
    assert ran == ["fiberlite-standby"]


def test_run_for_gives_up_after_its_timeout():
    release = threading.Event()
    assert not threads.run_for(lambda: release.wait(10), 0.1, name="test-slow")
    release.set()


def test_without_a_standby_the_refusal_is_raised(monkeypatch):
    monkeypatch.setattr(threads, "REFUSES_AT_EXIT", False)
    monkeypatch.setattr(threads, "_standby", None)

    def start(self):
        raise RuntimeError("can't create new thread at interpreter shutdown")
    monkeypatch.setattr(threading.Thread, "start", start)
    with pytest.raises(RuntimeError, match="interpreter shutdown"):
        threads.start(lambda: None, name="test-refused")
