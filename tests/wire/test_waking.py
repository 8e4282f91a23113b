"""A selector that any thread can wake (fiberlite.wire.waking)."""
from __future__ import annotations

import selectors
import socket
import threading

import pytest

from fiberlite.wire.waking import WakingSelector

pytestmark = pytest.mark.timeout(30)


def test_a_wake_from_another_thread_ends_a_select_that_would_wait_for_ever():
    selector = WakingSelector()
    waiting = threading.Event()
    result = []

    def select():
        waiting.set()
        result.append(selector.select())

    thread = threading.Thread(target=select)
    thread.start()
    waiting.wait()
    selector.wake()
    thread.join(10)
    assert result == [([], True)]
    assert selector.select(0) == ([], False), "a wake-up is reported once"
    selector.close()


def test_what_is_ready_comes_with_its_data_and_the_wake_up_is_not_among_the_keys():
    selector = WakingSelector()
    a, b = socket.socketpair()
    selector.register(a, selectors.EVENT_READ, "peer")
    b.send(b"x")
    selector.wake()
    selector.wake()  # several wake-ups before a select: one woken select
    ready, woken = selector.select(5)
    assert woken and [(key.data, events) for key, events in ready] == [("peer", selectors.EVENT_READ)]
    assert [key.data for key in selector.keys()] == ["peer"]
    selector.unregister(a)
    assert selector.keys() == []
    selector.close()
    selector.wake()  # after close: nothing, and no error
    a.close()
    b.close()
