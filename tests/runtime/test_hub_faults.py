"""Readers that compete for a queue or a pipe end get through the hub (no link), and
are SIGKILLed at random moments: no item reaches two readers, and none is lost but the
one a killed reader had got and not yet passed on (the stdlib loses that one too).

An item the hub has sent to a reader stays lent to that reader's connection until its
receipt, sent before ``get()`` / ``recv()`` returns, comes back; a reader killed with a
reply on its way leaves the item to the others.

Accounting: each reader moves items one by one to ``results`` (reported before its next
read), and writes down in a file of its own each item it gets before that item's receipt
leaves. Every item must be reported exactly once, except the last item a killed reader
wrote down (got, perhaps, and not reported). ``FIBERLITE_KILL_ROUNDS`` sets the rounds."""
from __future__ import annotations

import collections
import os
import random
import signal
import time

import pytest

import fiberlite
from fiberlite.runtime.lanes import shared as lanes
from fiberlite.runtime.links import servant as link_servant
import link_jobs
from fiberlite.runtime.hub import get_hub
from waiting import eventually

pytestmark = pytest.mark.timeout(120)
ROUNDS = int(os.environ.get("FIBERLITE_KILL_ROUNDS", "2"))
READERS = 3
KILLS = 4  # per round
ITEMS = 800
PAUSE = 0.004  # a reader's pause after each item, at most (random)


class Readers:
    """``READERS`` reader jobs (``start(tag, note_path)``), each replaced when killed."""

    def __init__(self, start, notes) -> None:
        self._start = start
        self._notes = notes
        self._serial = 0
        self.jobs = [self._new() for _ in range(READERS)]
        self.killed: list[str] = []  # the names of the killed readers' notes

    def _new(self):
        self._serial += 1
        return self._start(self._serial, str(self._notes / f"{self._serial}.txt"))

    def kill_one(self) -> None:
        victim = random.choice(self.jobs)
        os.kill(victim.pid, signal.SIGKILL)
        victim.join(30)
        assert victim.exitcode == -signal.SIGKILL
        self.killed.append(f"{victim._fl_serial}.txt")
        self.jobs[self.jobs.index(victim)] = self._new()

    def join(self) -> None:
        for job in self.jobs:
            job.join(60)
            assert job.exitcode == 0


def _run_round(start, send, results, notes) -> tuple[collections.Counter, list[str]]:
    """Send ``ITEMS`` items to competing readers, kill ``KILLS`` of them at random
    moments, end the survivors; what was reported, and the notes of the killed readers."""
    readers = Readers(start, notes)
    reports: list = []

    def take(timeout: float) -> None:
        report = results.get(timeout=timeout)
        if report[0] != link_jobs.READY:  # (a reader starting)
            reports.append(report)
    for _ in range(READERS):  # all compete from the first item: none reads alone, over a link
        assert results.get(timeout=60)[0] == link_jobs.READY
    for i in range(ITEMS):
        send(i)
    for target in sorted(random.sample(range(50, ITEMS - 150), KILLS)):
        while len(reports) < target:
            take(30)
        time.sleep(random.uniform(0, 2 * PAUSE))  # (a random kill moment, not a synchronisation)
        readers.kill_one()
    for _ in readers.jobs:
        send(None)
    readers.join()  # a job's puts have landed once it has exited
    while True:
        try:
            take(0.2)
        except fiberlite.queues.Empty:
            break
    return collections.Counter(item for _, item in reports), readers.killed


def _noted(path) -> list[int]:
    """The items a reader wrote down, in order."""
    return [int(line) for line in path.read_text().split() if line != "None"] if path.exists() else []


def _check(counts: collections.Counter, killed: list[str], notes, path: str = "hub") -> list:
    """Nothing twice; lost only what a killed reader had got (the lost items). A read
    through the hub is noted before its receipt, so what a killed reader held is known;
    a lane's reader may be killed between its read and its note: at most one item each."""
    duplicated = {item: n for item, n in counts.items() if n > 1}
    assert not duplicated, f"delivered twice: {duplicated}"
    assert set(counts) <= set(range(ITEMS)), "an item never sent"
    if path == "lane":
        lost = sorted(set(range(ITEMS)) - set(counts))
        assert len(lost) <= len(killed), f"lost {lost} with {len(killed)} readers killed"
        return lost
    noted = set().union(*(_noted(path) for path in notes.iterdir()))
    assert set(counts) <= noted, "items read over a link: this test is about reads through the hub"
    lost = sorted(set(range(ITEMS)) - set(counts))
    held = set()  # per killed reader, what it got and did not report: its last item at most
    for path in killed:
        got = _noted(notes / path)
        unreported = [item for item in got if item not in counts]
        assert unreported in ([], got[-1:]), (path, unreported)
        held.update(unreported)
    assert set(lost) <= held, f"lost {sorted(set(lost) - held)}, which no killed reader had got"
    assert len(lost) <= len(killed)
    return lost


@pytest.fixture(params=["lane", "hub"])
def path(request, monkeypatch):
    """Competing readers of this machine read the object's lane; without lanes (the
    path of other machines), each read goes through the creator's hub."""
    if request.param == "hub":
        monkeypatch.setattr(lanes, "enabled", lambda: False)
        # nor a link: a reader alone for RELINK_QUIET (its rivals being replaced, or slow
        # to run on a loaded machine) would be linked and read over it
        monkeypatch.setattr(link_servant, "RELINK_QUIET", float("inf"))
    return request.param


@pytest.mark.parametrize("kind", ["Queue", "JoinableQueue", "SimpleQueue"])
def test_queue_readers_through_the_hub_killed_at_random_lose_only_what_they_had_got(kind, path, tmp_path):
    joinable = kind == "JoinableQueue"
    for round_ in range(ROUNDS):
        q = getattr(fiberlite, kind)()
        results = fiberlite.Queue()
        notes = tmp_path / str(round_)
        notes.mkdir()

        def start(serial, note_path):
            job = fiberlite.Process(target=link_jobs.relay_noting,
                                    args=(q, results, serial, PAUSE, note_path, joinable))
            job._fl_serial = serial
            job.start()
            return job
        counts, killed = _run_round(start, q.put, results, notes)
        lost = _check(counts, killed, notes, path)
        servant = q._servant
        if path == "lane":
            assert q.empty()
        else:
            assert not servant.channel.items and not servant.channel.lent
        if joinable:  # not marked done: per kill, at most the item the killed reader had got,
            # and a None per survivor (relay_noting does not mark those)
            done = q._lane.state.counts[1] if path == "lane" else servant.unfinished
            unfinished = done - READERS
            assert len(lost) <= unfinished <= len(killed), (lost, unfinished, len(killed))


def test_pipe_end_readers_through_the_hub_killed_at_random_lose_only_what_they_had_got(path, tmp_path):
    for round_ in range(ROUNDS):
        reader_end, writer_end = fiberlite.Pipe(duplex=False)
        results = fiberlite.Queue()
        notes = tmp_path / str(round_)
        notes.mkdir()

        def start(serial, note_path):
            job = fiberlite.Process(target=link_jobs.relay_noting,
                                    args=(reader_end, results, serial, PAUSE, note_path))
            job._fl_serial = serial
            job.start()
            return job
        counts, killed = _run_round(start, writer_end.send, results, notes)
        _check(counts, killed, notes, path)
        if path == "hub":
            assert not get_hub().servant(reader_end._ref.oid).inbox[0].lent
        else:
            assert not reader_end.poll(0)


@pytest.mark.usefixtures("without_lanes")  # (receipts are the hub path's)
def test_a_receipt_goes_with_the_next_request_or_on_its_own_soon_after():
    q, out = fiberlite.Queue(), fiberlite.Queue()
    q.put("first")
    q.put("second")
    job = fiberlite.Process(target=link_jobs.pass_one_then_hold_one, args=(q, out))
    job.start()
    try:
        assert out.get(timeout=60) == "first"
        channel = q._servant.channel
        # the receipt for "first" came with the put, handled before it
        assert all("first" not in [p.unpack() for p in lent.values()] for lent in channel.lent.values())
        # "second" is got, and its receipt leaves on its own: nothing is lent any more
        eventually(lambda: not channel.items and not channel.lent,
                   what=lambda: f"the queue emptied (items {channel.items}, lent {channel.lent})")
    finally:
        job.kill()
        job.join(30)
    with pytest.raises(fiberlite.queues.Empty):  # "second" was the killed job's: it stays gone
        q.get(timeout=0.5)


@pytest.mark.usefixtures("without_lanes")
def test_a_read_made_directly_carries_the_receipt_of_the_item_before_it():
    """A job's reads through the hub are direct calls (not its nng connection, where
    receipts ride): the next read carries the receipts all the same, so the item the
    job got before it is the job's before the next one is lent (not only once the
    receipts' timer sends them)."""
    q, out = fiberlite.Queue(), fiberlite.Queue()
    for item in ("first", "second"):
        q.put(item)
    servant = q._servant
    lent_at_read: list = []
    receive = servant.op_receive

    def noting(request, slot, block=True, timeout=None):
        lent_at_read.append(sorted(p.unpack() for p in servant.channel.lent.get(request.peer, {}).values()))
        receive(request, slot, block, timeout)
    servant.op_receive = noting
    job = fiberlite.Process(target=link_jobs.get_two_with_late_receipts, args=(q, out))
    job.start()
    assert out.get(timeout=60) == ("first", "second")
    job.join(30)
    assert lent_at_read == [[], []]  # ("first" confirmed when the second read came)


def test_the_recovery_of_a_lost_peer_hears_of_it_after_every_other_servant():
    """What recovers a lost job's holdings is told last, once every servant has withdrawn
    the calls it was still making for that job (else one granted after the recovery
    would be held for ever)."""
    from fiberlite.runtime.hub import Servant
    heard: list[str] = []

    class Heard(Servant):
        def __init__(self, name: str, last: bool) -> None:
            self.name, self.hears_loss_last = name, last

        def peer_lost(self, peer: int) -> None:
            heard.append(self.name)

    hub = get_hub()
    oids = [hub.register(Heard(name, last)).oid
            for name, last in (("recovery", True), ("lock", False), ("semaphore", False))]
    try:
        hub._peer_lost(-12345)  # a peer no other servant knows
    finally:
        for oid in oids:
            hub.unregister(oid)
    assert heard[-1] == "recovery" and sorted(heard[:-1]) == ["lock", "semaphore"]
