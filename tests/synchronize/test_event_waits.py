"""A job's wait on an event, in the event's servant: parked while only the servant and
the creator can set it, on a thread of its own once another process of the machine
maps the event's memory (and could set it there without the servant knowing)."""
from __future__ import annotations

import threading

import pytest

import fiberlite
from fiberlite.runtime.shm import sync
from fiberlite.runtime.shm.arena import arena

pytestmark = pytest.mark.timeout(60)
WAIT = 30
KEY = (5, 1, 2, 3)  # (peer, pid, tid, ticket) of the job's wait


class Answer:
    """A job's request as a servant sees it: answered once."""

    peer = KEY[0]

    def __init__(self) -> None:
        self.given = threading.Event()
        self.value = None

    def reply(self, value=None) -> None:
        self.value = value
        self.given.set()

    def fail(self, exc) -> None:
        self.reply(exc)


@pytest.fixture
def segments_not_handed_out(monkeypatch):
    """As in a process that handed no segment of its arena to a machine-mate yet (the
    tests before this one may have handed out the segment an event is made in)."""
    monkeypatch.setattr(arena(), "_handed", set())


def test_a_jobs_wait_is_parked_and_answered_by_the_creators_set(segments_not_handed_out):
    event = fiberlite.Event()
    servant, answer = event._servant, Answer()
    servant.op_wait(answer, None, *KEY[1:])
    assert servant.waits.waiting(KEY) and not servant.waits._waits  # parked: no thread
    assert not answer.given.is_set()
    event.set()
    assert answer.given.wait(WAIT) and answer.value is True
    assert not servant.waits and not servant.waiting  # nothing left behind


def test_a_parked_wait_times_out(segments_not_handed_out):
    event = fiberlite.Event()
    servant, answer = event._servant, Answer()
    servant.op_wait(answer, 0.05, *KEY[1:])
    assert answer.given.wait(WAIT) and answer.value is False
    assert not servant.waits and not servant.waiting


def test_once_a_process_of_this_machine_maps_it_a_jobs_wait_waits_on_a_thread():
    event = fiberlite.Event()
    servant, answer = event._servant, Answer()
    arena().descriptors([servant.block.segment])  # as the door hands it to a machine-mate
    servant.op_wait(answer, None, *KEY[1:])
    assert servant.waits._waits  # on a thread
    sync.set_and_wake(servant.flag, 1, servant.sleepers)  # a machine-mate's set: the memory only
    assert answer.given.wait(WAIT) and answer.value is True
