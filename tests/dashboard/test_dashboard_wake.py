"""The page's clock sleeps between its samples: a change that the progress of the run
does not explain (a queue's, an event the registry heard) wakes it, and the page gets it
at once, not at the next sample."""
from __future__ import annotations

import pytest

import fiberlite as mp
from fiberlite.dashboard import monitor

from .run_driver import Events

pytestmark = pytest.mark.timeout(60)


def sizes(state: dict) -> list[int]:
    return [queue["size"] for queue in state["queues"]]


def test_a_change_wakes_the_clock(page, monkeypatch):
    monkeypatch.setattr(monitor, "TICK", 3600.0)  # the clock samples once, then sleeps an hour
    events = Events(page)  # (its read times out after 30 s: a change never sent fails it)
    try:
        assert events.next()["queues"] == []
        queue = mp.Queue()  # an event the registry hears
        while sizes(events.state) != [0]:
            events.next()
        for size in (1, 2, 3):  # a change of the queue, each within the last one's gap
            queue.put(size)
            while sizes(events.state) != [size]:
                events.next()
        assert queue.get() == 1
        while sizes(events.state) != [2]:
            events.next()
    finally:
        events.close()
