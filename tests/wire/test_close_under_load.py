"""Closing never hangs: every socket, server, link and hub is opened, used and closed
over and over while another thread is blocked sending or receiving on it.

Each round asserts that the close returns, and that the blocked thread comes back,
within ``DEADLINE``; each path asserts that no thread is left behind. The rounds per
path are few enough for the suite; ``FIBERLITE_CLOSE_ROUNDS=<n>`` runs ``n`` of them
per path (``FIBERLITE_CLOSE_ROUNDS=2000`` for thousands).
"""
from __future__ import annotations

import os
import secrets
import threading
import time
from typing import Callable

import numpy as np
import pytest

from fiberlite.errors import ConnectionLost
from fiberlite.ring.link import NeighbourLink, NeighbourLinkLost
from fiberlite.runtime.hub import Hub, Servant
from fiberlite.wire.client import Client
from fiberlite.wire import link as links
from fiberlite.wire.link import Link
from fiberlite.wire.server import Server

KEY = secrets.token_bytes(32)
DEADLINE = 5.0  # seconds a close, or the wake-up of a blocked thread, may take
ROUNDS = int(os.environ.get("FIBERLITE_CLOSE_ROUNDS", "0"))


def rounds(default: int) -> int:
    return ROUNDS or default


class Blocked:
    """``fn`` run on a thread of its own, its outcome kept (the value or the exception)."""

    def __init__(self, fn: Callable[[], object]) -> None:
        self.outcome: object = None
        self._fn = fn
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def _run(self) -> None:
        try:
            self.outcome = self._fn()
        except BaseException as exc:
            self.outcome = exc

    def returned(self) -> object:
        """The outcome, once the thread is back (fails after ``DEADLINE``)."""
        self.thread.join(DEADLINE)
        assert not self.thread.is_alive(), "a thread blocked on a closed object never returned"
        return self.outcome


def timed_close(close: Callable[[], None]) -> float:
    start = time.monotonic()
    close()
    took = time.monotonic() - start
    assert took < DEADLINE, f"close took {took:.1f} s"
    return took


class Stats:
    """How many rounds ran and the slowest close, reported at the end of a path."""

    def __init__(self) -> None:
        self.rounds = 0
        self.worst = 0.0

    def add(self, took: float) -> None:
        self.rounds += 1
        self.worst = max(self.worst, took)


# threads of the whole process, started by the first link that needs them and kept for
# the next ones (the liveness probes of every link)
PROCESS_WIDE = {"fiberlite-liveness"}


def python_threads_since(before: set) -> list[threading.Thread]:
    """Threads started since `before`, leaving out nng's own threads.

    A callback that nng runs on one of its threads registers that thread as a
    `threading._DummyThread` (for instance when it asks `threading.current_thread()`).
    Such an entry stays listed for as long as the process lives and cannot be joined;
    it is nng's thread, not one the code under test started.
    """
    return [t for t in set(threading.enumerate()) - before
            if not isinstance(t, threading._DummyThread) and t.name not in PROCESS_WIDE]


@pytest.fixture
def no_thread_left():
    """Every thread started during the test has ended by its end."""
    before = set(threading.enumerate())
    stats = Stats()
    yield stats
    deadline = time.monotonic() + DEADLINE
    for thread in python_threads_since(before):
        thread.join(max(0.0, deadline - time.monotonic()))
    left = [t.name for t in python_threads_since(before) if t.is_alive()]
    assert not left, f"threads left behind: {left}"
    print(f"{stats.rounds} rounds, slowest close {stats.worst * 1000:.0f} ms")


def pause(i: int) -> None:
    """Every other round, let the blocked thread get deeper into nng before the close."""
    if i % 2:
        time.sleep(0.0005 * (i % 7))  # timing spread, not synchronisation


def held_server(use_tls: bool):
    """A server that keeps every request unanswered, and an event set once one arrived."""
    arrived = threading.Event()
    held = []

    def handler(request, message):
        held.append(request)
        arrived.set()
    server = Server(KEY, "127.0.0.1", handler, lambda peer: None, lambda fn: fn(), use_tls=use_tls)
    return server, arrived


@pytest.mark.parametrize("closed", ["server", "client"])
@pytest.mark.parametrize("use_tls", [False, True], ids=["tcp", "tls"])
def test_closing_either_end_wakes_a_caller_waiting_for_its_reply(use_tls, closed, no_thread_left):
    for i in range(rounds(150 if use_tls else 300)):
        server, arrived = held_server(use_tls)
        client = Client(server.address, KEY)
        call = Blocked(lambda: client.request("hold"))
        if i % 3:
            assert arrived.wait(DEADLINE)
        pause(i)
        first, second = (server, client) if closed == "server" else (client, server)
        no_thread_left.add(timed_close(first.close))
        assert isinstance(call.returned(), ConnectionLost)
        second.close()


TRANSPORTS = {"local": (False, True), "tcp": (False, False), "tls": (True, False)}


def linked_pair(transport: str) -> tuple[Link, Link]:
    use_tls, same_machine = TRANSPORTS[transport]
    reader = links.listen("127.0.0.1", KEY, use_tls, same_machine)
    accepting = Blocked(lambda: reader.accept(KEY))
    writer = links.dial(reader.address, KEY)
    assert accepting.returned() is True
    return reader, writer


@pytest.mark.parametrize("transport", list(TRANSPORTS))
def test_link_close_wakes_its_reader(transport, no_thread_left):
    for i in range(rounds(150 if transport == "tls" else 300)):
        reader, writer = linked_pair(transport)
        first = threading.Event()

        def read_all():
            got = 0
            while True:
                reader.recv()
                got += 1
                first.set()
        reading = Blocked(read_all)
        if i % 3:
            assert writer.send(b"item", 10_000)
            assert first.wait(DEADLINE)  # the reader is back in recv() for the next one
        pause(i)
        no_thread_left.add(timed_close(reader.close))
        assert isinstance(reading.returned(), Exception)
        writer.close()


@pytest.mark.parametrize("transport", ["local", "tcp"])
def test_link_close_wakes_a_sender_waiting_for_room(transport, no_thread_left):
    frame = b"x" * 4096  # the queues fill in a few thousand sends, as many as of 16 bytes on nng
    for i in range(rounds(20)):
        reader, writer = linked_pair(transport)
        while writer.send(frame):  # fills the link's queues (no reader takes anything)
            pass
        sending = Blocked(lambda: writer.send(frame, 60_000))
        pause(i)
        no_thread_left.add(timed_close(writer.close))
        # False, or True when the peer's socket took enough for this one to fit
        assert sending.returned() in (False, True)
        reader.close()


def ring_pair() -> tuple[NeighbourLink, NeighbourLink]:
    a, b = NeighbourLink("127.0.0.1"), NeighbourLink("127.0.0.1")
    joining = [Blocked(lambda: a.connect(0, 2, b.address, KEY, time.monotonic() + 20)),
               Blocked(lambda: b.connect(1, 2, a.address, KEY, time.monotonic() + 20))]
    assert [j.returned() for j in joining] == [None, None]
    return a, b


def test_ring_link_close_wakes_a_receiver(no_thread_left):
    for i in range(rounds(150)):
        a, b = ring_pair()
        into = np.empty(1 << 20, np.uint8)  # more than is ever sent
        ticket = b.receive(into)
        if i % 3:
            a.send(np.ones(1000, np.uint8))
        waiting = Blocked(lambda: b.wait_received(ticket, time.monotonic() + 60))
        pause(i)
        no_thread_left.add(timed_close(b.close))
        assert isinstance(waiting.returned(), NeighbourLinkLost)
        a.close()


class HoldingServant(Servant):
    """Answers nothing: every request waits until the hub closes."""

    def __init__(self, arrived: threading.Event) -> None:
        self.arrived = arrived
        self.held: list = []

    def op_hold(self, request) -> None:
        self.held.append(request)
        self.arrived.set()


def test_hub_close_wakes_a_caller_of_its_servant(no_thread_left):
    for i in range(rounds(200)):
        hub = Hub("127.0.0.1")
        arrived = threading.Event()
        oid = hub.register(HoldingServant(arrived)).oid
        client = Client(hub.address, _hub_key())
        call = Blocked(lambda: client.request((oid, "hold", ())))
        if i % 3:
            assert arrived.wait(DEADLINE)
        pause(i)
        no_thread_left.add(timed_close(hub.close))
        assert isinstance(call.returned(), ConnectionLost)
        client.close()


def _hub_key() -> bytes:
    from fiberlite.runtime import identity
    return identity.key()
