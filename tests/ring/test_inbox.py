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
