"""A server reports a peer lost only after it has handled every request that peer sent.

A client job sends numbered one-way requests and is SIGKILLed (by itself, once they
are on their way) while the server is still busy with the first: every request
written before the kill is handled, in order, and ``on_peer_lost`` comes after the
last of them, never during or before. A receipt for a queue item, sent just before a
reader dies, relies on this: handled after the loss, the item would already have been
given to another reader."""
from __future__ import annotations

import os
import secrets
import threading

import pytest

from fiberlite.runtime.scheduler import Scheduler
from interpreters import start_python
from fiberlite.wire.client import Client
from fiberlite.wire.server import Server

pytestmark = pytest.mark.timeout(120)

KEY = secrets.token_bytes(32)
ROUNDS = int(os.environ.get("FIBERLITE_KILL_ROUNDS", "5"))
LAST_HANDLING = 0.3  # seconds the handling of each of the last requests takes
COUNT = 200  # one-way requests per round (fewer than the client's CAST_WINDOW: no SYNC)

# the client: COUNT one-way requests, then one more sent and waited for (nng hands a
# connection one message at a time, so once that one is taken every earlier one has been
# written to the connection), then SIGKILL itself
CLIENT = r"""
import os, signal, sys
from fiberlite.wire import codec
from fiberlite.wire.client import Client
client = Client(sys.argv[1], bytes.fromhex(sys.argv[2]))
for i in range(int(sys.argv[3])):
    client.cast(("item", i))
client._enter()
client._context().send_frame(codec.encode(("item", int(sys.argv[3])), codec.NO_REPLY), wait=True)
os.kill(os.getpid(), signal.SIGKILL)
"""


class Recorder:
    """A server's handler and peer-loss callback that write down what happens in turn."""

    def __init__(self) -> None:
        self.events: list[tuple] = []
        self.lock = threading.Lock()
        self.killed = threading.Event()  # the first request waits for the client's death
        self.lost = threading.Event()
        self.handling = 0  # handlers running now

    def handle(self, request, message) -> None:
        kind, n = message
        if kind == "ask":  # from the test: every earlier request has been handled
            request.reply()
            return
        with self.lock:
            self.handling += 1
        if n == 0:
            assert self.killed.wait(60)
        elif n >= COUNT - 1:  # the last ones: the loss, if reported too early, comes meanwhile
            self.lost.wait(LAST_HANDLING)
        with self.lock:
            self.handling -= 1
            self.events.append(("item", request.peer, n))

    def peer_lost(self, peer: int) -> None:
        with self.lock:
            self.events.append(("lost", peer, self.handling))
        self.lost.set()


def test_every_request_of_a_killed_peer_is_handled_before_it_is_reported_lost():
    scheduler = Scheduler("test-peer-lost")
    recorder = Recorder()
    server = Server(KEY, "127.0.0.1", recorder.handle, recorder.peer_lost, scheduler.call_soon)
    asker = Client(server.address, KEY)
    try:
        for _ in range(ROUNDS):
            recorder.events.clear()
            recorder.killed.clear()
            recorder.lost.clear()
            client = start_python("-c", CLIENT, server.address, KEY.hex(), COUNT)
            assert client.wait(60) == -9
            recorder.killed.set()
            assert recorder.lost.wait(30), "the killed client's connection was never reported lost"
            assert asker.request(("ask", None)) == (True, None)  # whatever was still queued is in
            events = list(recorder.events)
            lost_at = [i for i, event in enumerate(events) if event[0] == "lost"]
            assert len(lost_at) == 1, events[-5:]
            peer = events[lost_at[0]][1]
            items = [n for kind, p, n in events if kind == "item" and p == peer]
            # every request written before the kill (and perhaps the last one) was handled, in order
            assert items in (list(range(COUNT)), list(range(COUNT + 1))), items[:5] + ["..."] + items[-5:]
            # ... before the loss was reported, and none was being handled at that moment
            assert events[lost_at[0]] == ("lost", peer, 0)
            assert lost_at[0] == len(events) - 1, events[lost_at[0]:][:5]
    finally:
        asker.close()
        server.close()
        scheduler.stop()
