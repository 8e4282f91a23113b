"""The page's clock sleeps between its samples: a change that the progress of the run
does not explain (a queue's, an event the registry heard) wakes it, and the page gets it
at once, not at the next sample."""
from __future__ import annotations

import os
import signal
import time
from typing import Any

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


def exits_with(code: int) -> None:
    raise SystemExit(code)


def job_row(events: Events, job: Any) -> dict | None:
    name = job._popen.job.spec.name
    return next((row for row in events.state["jobs"] if row["name"] == name), None)


def test_a_job_that_ends_wakes_the_clock(page, monkeypatch):
    monkeypatch.setattr(monitor, "TICK", 3600.0)
    events = Events(page)
    try:
        assert events.next()["jobs"] == []
        job = mp.Process(target=exits_with, args=(3,))
        job.start()
        while (job_row(events, job) or {}).get("state") != "exited":
            events.next()  # (the job's end is not waited for here: only the page tells it)
        assert job_row(events, job)["exitcode"] == 3
    finally:
        events.close()
    job.join(30)
    assert job.exitcode == 3


def test_a_killed_job_shows_ending_at_once(page, monkeypatch):
    monkeypatch.setattr(monitor, "TICK", 3600.0)
    events = Events(page)
    job = mp.Process(target=time.sleep, args=(60,))
    try:
        events.next()
        job.start()
        while (job_row(events, job) or {}).get("state") != "running":
            events.next()
        assert job._popen.channel.connected.wait(30)  # (before, it has no connection to end)
        os.kill(job.pid, signal.SIGKILL)
        # its connection ends with it: "exiting" if it is not a zombie yet, else "exited"
        while job_row(events, job)["state"] == "running":
            events.next()
        assert job_row(events, job)["state"] in ("exiting", "exited")
    finally:
        events.close()
        job.kill()
        job.join(30)
    assert job.exitcode == -signal.SIGKILL
