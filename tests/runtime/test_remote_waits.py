"""The calls of jobs waiting in the creator's hub (fiberlite.runtime.shm.remote.Waits):
parked while what they wait for is given back through the hub, else on threads."""
from __future__ import annotations

import threading
import time

import pytest

from fiberlite.runtime.shm.remote import NOT_YET, SLICE, Waits

pytestmark = pytest.mark.timeout(60)
WAIT = 30


class Request:
    """A job's call as a servant sees it: answered once."""

    def __init__(self, peer: int = 7) -> None:
        self.peer = peer
        self.answered = threading.Event()
        self.answers: list = []

    def reply(self, value=None) -> None:
        self.answers.append(value)
        self.answered.set()

    def fail(self, exc) -> None:
        self.reply(exc)


class Units:
    """Units of something, taken by attempts; records the seconds each attempt may wait."""

    def __init__(self, free: int = 0) -> None:
        self.free = free
        self.lock = threading.Lock()
        self.waited: list = []

    def attempt(self, name: str):
        def attempt(seconds):
            self.waited.append(seconds)
            with self.lock:
                if self.free:
                    self.free -= 1
                    return name
            if seconds:
                time.sleep(min(seconds, 0.01))  # as a futex wait with a deadline would
            return NOT_YET
        return attempt


def test_parked_calls_are_answered_in_turn_by_releases_without_a_thread():
    units, parkable = Units(), True
    waits = Waits(parkable=lambda: parkable)
    requests = {name: Request() for name in "abc"}
    for name, request in requests.items():
        waits.start(request, name, units.attempt(name), None, False, parks=True)
    assert waits and all(waits.waiting(name) for name in "abc")
    for expected in "abc":
        units.free += 1
        waits.released()
        assert requests[expected].answers == [expected]
    assert not waits
    assert set(units.waited) == {None}  # every attempt made at a release: none waited on a thread


def test_a_parked_call_times_out_with_its_timed_out_answer():
    waits = Waits(parkable=lambda: True)
    request = Request()
    start = time.monotonic()
    waits.start(request, "k", Units().attempt("k"), 0.2, "timed out", parks=True)
    assert request.answered.wait(WAIT)
    assert request.answers == ["timed out"]
    assert 0.15 <= time.monotonic() - start < 5
    assert not waits.waiting("k")


def test_a_withdrawn_parked_call_is_never_answered():
    units = Units()
    waits = Waits(parkable=lambda: True)
    request, then = Request(), threading.Event()
    waits.start(request, "k", units.attempt("k"), None, False, parks=True)
    assert waits.cancel("k", then=then.set) is True
    assert then.is_set()
    units.free = 1
    waits.released()
    assert request.answers == [] and units.free == 1  # nothing was taken for nobody


def test_the_calls_of_a_lost_job_are_withdrawn():
    waits = Waits(parkable=lambda: True)
    lost, other = Request(peer=1), Request(peer=2)
    waits.start(lost, "lost", Units().attempt("lost"), None, False, parks=True)
    waits.start(other, "other", Units().attempt("other"), None, False, parks=True)
    waits.cancel_peer(1)
    assert not waits.waiting("lost") and waits.waiting("other")
    waits.cancel("other")


def test_parked_calls_move_to_threads_once_the_holder_no_longer_gives_back_through_the_hub():
    units, parkable = Units(), [True]
    waits = Waits(parkable=lambda: parkable[0])
    request = Request()
    waits.start(request, "k", units.attempt("k"), None, False, parks=True)
    parkable[0] = False  # a process that maps the memory holds it now
    waits.released()
    units.free = 1  # given back by that process: no release here tells the hub
    assert request.answered.wait(WAIT)
    assert request.answers == ["k"]
    assert any(seconds for seconds in units.waited)  # its thread waited


def test_a_parked_call_sees_a_release_made_elsewhere_within_a_few_slices():
    units = Units()
    waits = Waits(parkable=lambda: True)
    request = Request()
    waits.start(request, "k", units.attempt("k"), None, False, parks=True)
    start = time.monotonic()
    units.free = 1  # a Lock released by another process: nothing calls released()
    assert request.answered.wait(WAIT)
    assert request.answers == ["k"]
    assert time.monotonic() - start < 3 * SLICE + 1


def test_a_call_arriving_while_another_waits_on_a_thread_is_not_parked():
    first_units, second_units = Units(), Units()
    waits = Waits(parkable=lambda: True)
    first, second = Request(), Request()
    waits.start(first, "first", first_units.attempt("first"), None, False)  # (parks=False)
    waits.start(second, "second", second_units.attempt("second"), None, False, parks=True)
    first_units.free = second_units.free = 1
    assert first.answered.wait(WAIT) and second.answered.wait(WAIT)
    assert first.answers == ["first"] and second.answers == ["second"]
    assert second_units.waited and None not in second_units.waited  # tried on a thread only
