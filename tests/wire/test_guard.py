"""CallGuard: the release comes once, after the last call, and never on nng's own threads."""
from __future__ import annotations

import _thread
import threading

from fiberlite.wire.guard import CallGuard

DEADLINE = 10


class Recorder:
    """Counts aborts and releases and remembers the thread each release ran on."""

    def __init__(self) -> None:
        self.aborts = 0
        self.releases: list[str] = []
        self.released = threading.Event()

    def abort(self) -> None:
        self.aborts += 1

    def release(self) -> None:
        self.releases.append(threading.current_thread().name)
        self.released.set()


def test_the_release_waits_for_the_last_call_and_comes_once():
    seen = Recorder()
    guard = CallGuard(seen.abort, seen.release)
    assert guard.enter() and guard.enter()
    assert guard.close() is True
    assert seen.aborts == 1 and seen.releases == []
    assert guard.enter() is False  # no new call once closing
    guard.leave()
    assert seen.releases == []
    guard.leave()
    assert seen.releases == [threading.current_thread().name]
    assert guard.close() is False and seen.aborts == 1 and len(seen.releases) == 1


def test_a_last_call_on_a_thread_python_did_not_start_releases_on_a_thread_of_its_own():
    """nng runs pipe callbacks on its own threads, and its socket close waits for them:
    a release made there would wait for itself."""
    seen = Recorder()
    guard = CallGuard(seen.abort, seen.release)
    assert guard.enter()
    guard.close()
    left = threading.Event()

    def leave_on_a_foreign_thread() -> None:
        guard.leave()
        left.set()
    _thread.start_new_thread(leave_on_a_foreign_thread, ())
    assert left.wait(DEADLINE) and seen.released.wait(DEADLINE)
    assert seen.releases == ["fiberlite-release"]


def test_a_call_that_leaves_during_the_abort_leaves_the_release_to_its_end():
    """nng frees a closed context's state after the socket may already be closing: the
    socket's release must not overlap the abort that closes the contexts."""
    order: list[str] = []
    aborting, go_on = threading.Event(), threading.Event()

    def abort() -> None:
        order.append("abort begins")
        aborting.set()
        go_on.wait(DEADLINE)
        order.append("abort ends")

    guard = CallGuard(abort, lambda: order.append("release"))
    assert guard.enter()
    closer = threading.Thread(target=guard.close)
    closer.start()
    assert aborting.wait(DEADLINE)
    guard.leave()  # the last call leaves while the contexts are being closed
    assert order == ["abort begins"]
    go_on.set()
    closer.join(DEADLINE)
    assert order == ["abort begins", "abort ends", "release"]
