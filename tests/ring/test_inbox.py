"""A member's inbox (ring/inbox.py): what it learns of lost ranks, and the wait for it."""
from __future__ import annotations

import threading
import time

import pytest

from fiberlite.errors import RingError
from fiberlite.ring.inbox import RingMember


def test_a_wait_for_why_a_rank_left_ends_as_soon_as_the_story_comes():
    """A member whose neighbour's link failed waits to hear why (the parent gives a silent
    rank up a moment later), then says that, not only that the connection was lost."""
    inbox = RingMember()
    story = RingError("rank 1 was given up: it answered nothing for 3 s", 1)
    told = threading.Timer(0.2, inbox.mark_lost, (1, story))
    told.start()
    started = time.monotonic()
    inbox.await_story(1, 30)
    assert time.monotonic() - started < 10
    with pytest.raises(RingError, match="answered nothing for 3 s"):
        inbox.check(1)
    told.join()


def test_a_wait_for_why_ends_at_an_abort_or_after_its_time():
    inbox = RingMember()
    started = time.monotonic()
    inbox.await_story(2, 0.3)   # nothing comes: back after its time, nothing known
    assert 0.25 <= time.monotonic() - started < 10
    inbox.check(2)
    aborting = threading.Timer(0.1, inbox.fail, (RingError("the ring was aborted", 0),))
    aborting.start()
    inbox.await_story(2, 30)
    with pytest.raises(RingError, match="aborted"):
        inbox.check(2)
    aborting.join()


class _Request:
    def __init__(self, peer: int) -> None:
        self.peer = peer

    def reply(self, value=None) -> None:
        pass


def test_a_rank_whose_connection_was_given_up_as_silent_is_said_to_have_answered_nothing(monkeypatch):
    """A rank cut off from the network: the member's own hub gives its connection up as
    silent, perhaps before the parent's word comes; the member says what the parent says."""
    from fiberlite import config
    monkeypatch.setattr(config, "_overrides", dict(config._overrides, peer_timeout=3.0))
    monkeypatch.setattr(config, "_resolved", None)
    inbox = RingMember()
    inbox.op_deliver(_Request(peer=7), 1, "tag", "from rank 1")
    inbox.op_deliver(_Request(peer=8), 2, "tag", "from rank 2")
    inbox.peer_silent(7)
    inbox.peer_lost(7)
    inbox.peer_lost(8)  # (ended without a word: its process is gone)
    with pytest.raises(RingError, match=r"rank 1 left the ring \(it answered nothing for 3 s"):
        inbox.check(1)
    with pytest.raises(RingError, match=r"rank 2 left the ring \(connection lost\)"):
        inbox.check(2)
