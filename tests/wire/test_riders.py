"""Riders (receipts) go with the next message a client sends, or on their own: a message
built after another thread took the riders leaves after that thread's message, so that
it cannot overtake a receipt it does not carry (a reader's report of an item reaching
the server before the receipt for it: killed then, the item would go to another reader
too)."""
from __future__ import annotations

import secrets
import threading

import pytest

from fiberlite.runtime.scheduler import Scheduler
from fiberlite.wire.client import Carrying, Client
from fiberlite.wire.server import Server

pytestmark = pytest.mark.timeout(60)

KEY = secrets.token_bytes(32)


@pytest.fixture
def served():
    """``(client, handled)``: a client of a server that notes each message it handles."""
    scheduler = Scheduler("test-riders")
    handled: list = []
    every = threading.Condition()

    def handle(request, message) -> None:
        with every:
            handled.append(message)
            every.notify_all()
        request.reply()
    server = Server(KEY, "127.0.0.1", handle, lambda peer: None, scheduler.call_soon)
    client = Client(server.address, KEY)

    def wait_for(count: int) -> list:
        with every:
            assert every.wait_for(lambda: len(handled) >= count, 30), handled
            return list(handled)
    try:
        yield client, wait_for
    finally:
        client.close()
        server.close()
        scheduler.stop()


def test_riders_go_with_the_next_message_and_only_once(served):
    client, wait_for = served
    client.ride("receipt 1")
    client.ride("receipt 2")
    client.cast(Carrying(lambda riders: ("first", riders)))
    assert client.request(Carrying(lambda riders: ("second", riders))) == (True, None)
    assert wait_for(2) == [("first", ("receipt 1", "receipt 2")), ("second", ())]


def test_a_message_built_after_the_riders_were_taken_leaves_after_them(served):
    client, wait_for = served
    client.ride("receipt")
    taken, release = threading.Event(), threading.Event()

    def slow_build(riders):  # holds the riders it took, as a thread switched out would
        taken.set()
        assert release.wait(30)
        return ("carrier", riders)
    carrier = threading.Thread(target=client.cast, args=(Carrying(slow_build),))
    carrier.start()
    assert taken.wait(30)
    later = threading.Thread(target=client.cast, args=(Carrying(lambda riders: ("later", riders)),))
    later.start()
    later.join(0.3)  # (it must wait for the carrier; a wrong order would show below anyway)
    release.set()
    carrier.join(30)
    later.join(30)
    assert wait_for(2) == [("carrier", ("receipt",)), ("later", ())]


def test_riders_with_nothing_to_carry_send_nothing(served):
    client, wait_for = served
    client.cast(Carrying(lambda riders: ("receipts", riders) if riders else None))
    client.ride("receipt")
    client.cast(Carrying(lambda riders: ("receipts", riders) if riders else None))
    assert wait_for(1) == [("receipts", ("receipt",))]
    assert client.request(("after", ())) == (True, None)
    assert wait_for(2) == [("receipts", ("receipt",)), ("after", ())]


def test_riders_delivered_by_another_path_are_not_sent_again(served):
    """What a direct call carried and was answered for is dropped; a rider kept after
    that call took its copy still goes with the next message."""
    client, wait_for = served
    client.ride("receipt 1")
    carried = client.peek_riders()  # (a direct call's copy)
    client.ride("receipt 2")
    client.drop_riders(carried)
    client.cast(Carrying(lambda riders: ("next", riders)))
    assert wait_for(1) == [("next", ("receipt 2",))]
