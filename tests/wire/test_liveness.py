"""Both ends of a connection give a silent other end up within ``peer_timeout``.

The other end is a real process frozen with SIGSTOP: its connections stay open and its
kernel keeps acknowledging what arrives, as a paused container's does, so only the
probes of :mod:`fiberlite.wire.liveness` can tell. A process that is merely busy in
Python answers, and is kept."""
from __future__ import annotations

import os
import secrets
import signal
import subprocess
import sys
import threading
import time

import pytest

import fiberlite
from fiberlite import config
from fiberlite.errors import ConnectionLost
from fiberlite.runtime.scheduler import Scheduler
from fiberlite.wire import liveness
from fiberlite.wire.client import Client
from fiberlite.wire.server import Server
from waiting import eventually

pytestmark = pytest.mark.timeout(120)

KEY = secrets.token_bytes(32)
TIMEOUT = 1.0
# a connection is given up 3 to 4 ticks (of a quarter of the timeout) after the last thing
# heard on it, which an idle one heard up to a tick before it fell silent: no sooner than
EARLIEST = TIMEOUT / 2

# a client in a process of its own: says hello, then waits for its connection's end,
# or (busy SECONDS) spins in Python without a call and says whether it is still connected
CLIENT = r"""
import sys, threading, time
from fiberlite.wire.client import Client
client = Client(sys.argv[1], bytes.fromhex(sys.argv[2]))
lost = threading.Event()
client.on_lost(lost.set)
client.request("hello")
print("ready", flush=True)
if sys.argv[3] == "busy":
    end = time.monotonic() + float(sys.argv[4])
    while time.monotonic() < end:
        pass
    print("connected" if client.alive else "lost", flush=True)
elif sys.argv[3] == "calls":   # (after a pause of its own) calls for a while
    sys.stdin.readline()
    end = time.monotonic() + float(sys.argv[4])
    while time.monotonic() < end and client.alive:
        client.request("hello")
        time.sleep(0.05)
    print("connected" if client.alive else "lost", flush=True)
else:
    print("lost" if lost.wait(60) else "still connected", flush=True)
"""

# a server in a process of its own: answers everything but "wait"; prints its address,
# then (busy SECONDS) spins in Python, or waits for its stdin to close
SERVER = r"""
import sys, time
from fiberlite.runtime.scheduler import Scheduler
from fiberlite.wire.server import Server
held = []
def handle(request, message):
    if message == "wait":
        held.append(request)
    else:
        request.reply(message)
server = Server(bytes.fromhex(sys.argv[1]), "127.0.0.1", handle, lambda peer: None,
                Scheduler().call_soon, use_tls=sys.argv[2] == "tls")
print(server.address, flush=True)
if len(sys.argv) > 3:
    end = time.monotonic() + float(sys.argv[3])
    while time.monotonic() < end:
        pass
sys.stdin.read()
"""


@pytest.fixture
def peer_timeout():
    """Sets ``peer_timeout`` in this process (``peer_timeout(seconds)``), restored after."""
    def set_to(seconds: float) -> None:
        fiberlite.init(peer_timeout=seconds)
        liveness.reconfigure()
    set_to(TIMEOUT)
    yield set_to
    set_to(config.SETTINGS["peer_timeout"].default)


def spawn(script: str, *args: str, timeout: float = TIMEOUT) -> subprocess.Popen:
    env = dict(os.environ, FIBERLITE_PEER_TIMEOUT=str(timeout))
    return subprocess.Popen([sys.executable, "-c", script, *args], stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, text=True, env=env)


def finish(proc: subprocess.Popen) -> None:
    proc.send_signal(signal.SIGCONT)
    proc.kill()
    proc.wait(10)


class Events:
    """A server's handler and callbacks, writing down what happens to which peer."""

    def __init__(self) -> None:
        self.events: list[tuple[str, int]] = []
        self.peers: list[int] = []

    def handle(self, request, message) -> None:
        self.peers.append(request.peer)
        request.reply(message)

    def silent(self, peer: int) -> None:
        self.events.append(("silent", peer))

    def lost(self, peer: int) -> None:
        self.events.append(("lost", peer))


@pytest.fixture
def server(request, peer_timeout):
    events = Events()
    scheduler = Scheduler()
    server = Server(KEY, "127.0.0.1", events.handle, events.lost, scheduler.call_soon,
                    use_tls=getattr(request, "param", "plain") == "tls", on_peer_silent=events.silent)
    server.events = events
    yield server
    server.close()
    scheduler.stop()


@pytest.mark.parametrize("server", ["plain", "tls"], indirect=True)
def test_a_frozen_client_is_given_up_and_finds_its_connection_closed(server):
    client = spawn(CLIENT, server.address, KEY.hex(), "wait")
    try:
        assert client.stdout.readline() == "ready\n"
        peer, = server.events.peers
        client.send_signal(signal.SIGSTOP)
        frozen = time.monotonic()
        eventually(lambda: ("lost", peer) in server.events.events, TIMEOUT + 10, "the peer's loss")
        assert time.monotonic() - frozen >= EARLIEST
        assert server.events.events == [("silent", peer), ("lost", peer)]
        client.send_signal(signal.SIGCONT)
        assert client.stdout.readline() == "lost\n"   # its own end saw the connection close
    finally:
        finish(client)


def test_a_client_busy_in_python_is_kept(server):
    client = spawn(CLIENT, server.address, KEY.hex(), "busy", str(4 * TIMEOUT))
    try:
        assert client.stdout.readline() == "ready\n"
        assert client.stdout.readline() == "connected\n"   # its probes went out meanwhile
        assert server.events.events == []
    finally:
        finish(client)


def test_a_process_that_was_frozen_itself_gives_its_peers_a_whole_timeout(server, peer_timeout):
    peer_timeout(0)   # the server does not watch: only the frozen client could judge
    client = spawn(CLIENT, server.address, KEY.hex(), "calls", "1.5")
    try:
        assert client.stdout.readline() == "ready\n"
        client.send_signal(signal.SIGSTOP)
        time.sleep(3 * TIMEOUT)   # the pause itself (nothing to wait for: it is the test)
        client.send_signal(signal.SIGCONT)
        client.stdin.write("go\n")
        client.stdin.flush()
        assert client.stdout.readline() == "connected\n"
    finally:
        finish(client)


def start_server(transport: str, busy: float | None = None) -> tuple[subprocess.Popen, str]:
    proc = spawn(SERVER, KEY.hex(), transport, *([str(busy)] if busy else []))
    return proc, proc.stdout.readline().strip()


@pytest.mark.parametrize("transport", ["plain", "tls"])
def test_a_call_waiting_on_a_frozen_server_fails_saying_so(peer_timeout, transport):
    proc, address = start_server(transport)
    client = Client(address, KEY)
    try:
        assert client.request("hello") == (True, "hello")
        lost = threading.Event()
        client.on_lost(lost.set)
        failure: list[BaseException] = []

        def wait_forever() -> None:
            try:
                client.request("wait")
            except BaseException as exc:
                failure.append(exc)
        waiter = threading.Thread(target=wait_forever)
        waiter.start()
        proc.send_signal(signal.SIGSTOP)
        frozen = time.monotonic()
        waiter.join(TIMEOUT + 10)
        assert not waiter.is_alive(), "the call still waits on a frozen server"
        assert time.monotonic() - frozen >= EARLIEST
        error, = failure
        assert isinstance(error, ConnectionLost)
        assert f"answered nothing for {TIMEOUT:g} s" in str(error)
        assert lost.wait(10) and not client.alive
        with pytest.raises(ConnectionLost, match="answered nothing"):
            client.request("hello")
    finally:
        client.close()
        finish(proc)


def test_a_server_busy_in_python_is_kept(peer_timeout):
    proc, address = start_server("plain", busy=4 * TIMEOUT)
    client = Client(address, KEY)
    try:
        assert client.request("hello") == (True, "hello")
        def wait_forever() -> None:
            try:
                client.request("wait")
            except ConnectionLost:   # closed at the end of the test
                pass
        waiter = threading.Thread(target=wait_forever, daemon=True)
        waiter.start()
        waiter.join(3 * TIMEOUT)   # its probes are answered by the server's receiving thread
        assert client.alive and waiter.is_alive()
        assert client.request("hello") == (True, "hello")
    finally:
        client.close()
        finish(proc)
