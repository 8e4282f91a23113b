"""A job that reads a pipe or queue over a link and is SIGKILLed at a random moment
loses nothing it had not consumed: what it was sent and had not returned from ``get()`` /
``recv()`` goes back, in order, to the next reader, and nothing is delivered twice.

Accounting: the killed reader moves items one by one to ``results``. It may have taken
one item out of the queue and died before reporting it (the stdlib loses that one too),
and that can only be the item right after the last it reported; every other item reaches
``results`` exactly once."""
from __future__ import annotations

import collections
import os
import random
import signal
import time

import pytest

import fiberlite
from fiberlite.runtime.lanes import shared
import link_jobs
from fiberlite.runtime.links import reader as pipelink
from fiberlite.runtime.hub import get_hub

pytestmark = pytest.mark.timeout(120)
ROUNDS = int(os.environ.get("FIBERLITE_KILL_ROUNDS", "4"))
ITEMS = 300
PAUSE = 0.003  # the killed reader's pause after each item, at most (random)
KILLED, NEXT, HERE = "killed", "next", "here"  # who reported an item


def _kill_at_random(process, results, reports: list) -> None:
    """Collect reports until a random count (past the point where the link is made),
    wait a random moment more, then SIGKILL ``process``."""
    target = random.randint(pipelink.LINK_AFTER + 2, ITEMS - 40)
    while len(reports) < target:
        reports.append(results.get(timeout=30))
    time.sleep(random.uniform(0, 2 * PAUSE))  # (a random kill moment, not a synchronisation)
    os.kill(process.pid, signal.SIGKILL)
    process.join(30)
    assert process.exitcode == -signal.SIGKILL


def _collect(results, reports: list) -> None:
    """Take every report still to come: all items but perhaps the one the killed reader held."""
    while len(reports) < ITEMS - 1:
        reports.append(results.get(timeout=30))
    try:
        reports.append(results.get(timeout=0.5))
    except fiberlite.queues.Empty:
        pass


def _check(reports: list) -> int:
    """Nothing delivered twice; lost at most the item after the last the killed reader
    reported. The number lost."""
    counts = collections.Counter(item for _, item in reports)
    duplicated = {item: n for item, n in counts.items() if n > 1}
    assert not duplicated, f"delivered twice: {duplicated}"
    lost = sorted(set(range(ITEMS)) - set(counts))
    held = max(item for tag, item in reports if tag == KILLED) + 1
    assert lost in ([], [held]), f"lost {len(lost)}: {lost[:20]} (the killed reader could hold only {held})"
    return len(lost)


@pytest.mark.parametrize("path", ["lane", "link"])
@pytest.mark.parametrize("joinable", [False, True], ids=["Queue", "JoinableQueue"])
def test_a_linked_queue_reader_killed_at_random_loses_nothing(joinable, path, monkeypatch):
    """The reader of a queue's lane (its machine's path) or of its link (another
    machine's) killed at random: nothing lost but the item in its hands."""
    if path == "link":
        monkeypatch.setattr(shared, "enabled", lambda: False)
    for _ in range(ROUNDS):
        q = fiberlite.JoinableQueue() if joinable else fiberlite.Queue()
        results = fiberlite.Queue()
        first = fiberlite.Process(target=link_jobs.relay_queue, args=(q, results, KILLED, PAUSE, joinable))
        first.start()
        for i in range(ITEMS):
            q.put(i)
        reports: list = []
        _kill_at_random(first, results, reports)
        q.put(None)
        second = fiberlite.Process(target=link_jobs.relay_queue, args=(q, results, NEXT, 0, joinable))
        second.start()
        _collect(results, reports)
        second.join(30)
        assert second.exitcode == 0
        lost = _check(reports)
        if joinable:  # not marked done: the None the second reader took, and the one item
            # the killed reader got and did not mark done (lost, or reported just before the kill)
            unfinished = get_hub().servant(q._ref.oid).unfinished if path == "link" else \
                q._lane.state.counts[1]
            assert unfinished == 2 if lost else unfinished in (1, 2)


@pytest.mark.parametrize("path", ["lane", "link"])
def test_a_linked_pipe_reader_killed_at_random_leaves_the_rest_to_the_ends_other_holder(path, monkeypatch):
    if path == "link":
        monkeypatch.setattr(shared, "enabled", lambda: False)
    for _ in range(ROUNDS):
        reader_end, writer_end = fiberlite.Pipe(duplex=False)
        results = fiberlite.Queue()
        first = fiberlite.Process(target=link_jobs.relay_pipe, args=(reader_end, results, KILLED, PAUSE))
        first.start()
        for i in range(ITEMS):
            writer_end.send(i)
        reports: list = []
        _kill_at_random(first, results, reports)
        while reader_end.poll(1):  # this process holds the reading end too: the rest is here
            reports.append((HERE, reader_end.recv()))
        _collect(results, reports)  # and the killed reader's last reports
        _check(reports)
