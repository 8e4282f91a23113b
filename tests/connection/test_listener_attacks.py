"""``Listener.accept`` against peers that do not play along: silent, resetting, flooding
or announcing huge messages, with raw sockets; real clients are accepted meanwhile."""
from __future__ import annotations

import os
import socket
import struct
import threading
import time

import pytest

import fiberlite
from fiberlite.connection import Client, Listener

pytestmark = pytest.mark.timeout(60)
MiB = 1 << 20


@pytest.fixture
def settings():
    """``settings(**values)``: set fiberlite settings for this test only."""
    from fiberlite import config
    before = config.settings()
    changed: list[str] = []

    def change(**values):
        changed.extend(values)
        fiberlite.init(**values)
    yield change
    fiberlite.init(**{name: before[name] for name in changed})


def accept_one(listener, results):
    try:
        results.append(listener.accept())
    except BaseException as exc:   # what escapes accept() is what the test looks at
        results.append(exc)


def client_in_background(address):
    """A real Client connecting on a thread: (thread, [connection or error])."""
    got: list = []

    def connect():
        try:
            got.append(Client(address))
        except BaseException as exc:
            got.append(exc)
    thread = threading.Thread(target=connect, daemon=True)
    thread.start()
    return thread, got


def closed_by_peer(sock: socket.socket, timeout: float) -> bool:
    """Whether the listener ends ``sock`` within ``timeout`` (reading what it sent)."""
    sock.settimeout(timeout)
    try:
        while sock.recv(4096):
            pass
        return True
    except (ConnectionResetError, BrokenPipeError):
        return True
    except socket.timeout:
        return False


def open_fds() -> int:
    return len(os.listdir("/proc/self/fd"))


def rss() -> int:
    with open("/proc/self/statm") as fh:
        return int(fh.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def test_a_silent_peer_does_not_hold_up_the_next_client():
    with Listener() as listener:
        silent = socket.create_connection(listener.address)
        t, got = client_in_background(listener.address)
        started = time.monotonic()
        with listener.accept() as server:
            assert time.monotonic() - started < 5   # not the silent peer's deadline (10 s)
            t.join(20)
            client = got[0]
            client.send("hello")
            assert server.recv() == "hello"
            client.close()
        silent.close()


def test_a_silent_peer_is_closed_at_the_deadline(settings):
    settings(auth_timeout=1.0)
    results: list = []
    with Listener() as listener:
        accepting = threading.Thread(target=accept_one, args=(listener, results), daemon=True)
        accepting.start()
        with socket.create_connection(listener.address) as silent:
            started = time.monotonic()
            assert closed_by_peer(silent, 20)
            assert 0.8 < time.monotonic() - started < 10
    accepting.join(20)
    assert len(results) == 1 and isinstance(results[0], OSError)   # closed, not the peer's error
    assert "listener is closed" in str(results[0])


def test_a_peer_that_resets_during_the_challenge_does_not_escape_accept():
    with Listener() as listener:
        results: list = []
        accepting = threading.Thread(target=accept_one, args=(listener, results), daemon=True)
        accepting.start()
        for _ in range(5):
            rude = socket.create_connection(listener.address)
            rude.recv(4)   # the challenge has begun
            rude.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
            rude.close()   # RST
        t, got = client_in_background(listener.address)
        accepting.join(20)
        t.join(20)
        assert len(results) == 1 and not isinstance(results[0], BaseException), results
        results[0].send(42)
        assert got[0].recv() == 42
        results[0].close()
        got[0].close()


def test_a_flood_of_silent_connections_is_bounded_and_clients_still_connect(settings):
    limit, count = 20, 400
    settings(auth_pending_limit=limit)
    with Listener(backlog=count) as listener:
        before = open_fds()
        flood = [socket.create_connection(listener.address) for _ in range(count)]
        accepted = []
        for _ in range(3):   # real clients connect during the flood, each accepted
            t, got = client_in_background(listener.address)
            accepted.append(listener.accept())
            t.join(20)
            assert not isinstance(got[0], BaseException), got
            accepted[-1].send("ok")
            assert got[0].recv() == "ok"
            got[0].close()
        # the flood's connections in this process: the attacker's own ends (count)
        # plus at most the bound of accepted ones, and the three clients' both ends
        assert open_fds() - before < count + limit + 3 * 2 + 5
        closed = sum(closed_by_peer(s, 0.5) for s in flood[:count - limit - 10])
        assert closed == count - limit - 10   # the oldest were cut off to make room
        for conn in accepted:
            conn.close()
        for s in flood:
            s.close()


def test_a_huge_announced_message_costs_no_memory():
    with Listener() as listener:
        results: list = []
        accepting = threading.Thread(target=accept_one, args=(listener, results), daemon=True)
        accepting.start()
        before = rss()
        with socket.create_connection(listener.address) as attacker:
            attacker.recv(4096)   # the challenge
            attacker.sendall(struct.pack("!i", 0x7FFFFFFF))   # answer: 2 GiB follow
            sent = 0
            chunk = b"\0" * MiB
            with pytest.raises(OSError):
                while sent < 512 * MiB:
                    attacker.sendall(chunk)
                    sent += len(chunk)
        assert sent < 64 * MiB
        assert rss() - before < 64 * MiB
        t, got = client_in_background(listener.address)
        accepting.join(20)
        t.join(20)
        assert len(results) == 1 and not isinstance(results[0], BaseException), results
        results[0].close()
        got[0].close()
