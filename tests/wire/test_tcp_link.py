"""The TCP flavour of a link (wire/link/tcp), its many-peer listener and the address table."""
from __future__ import annotations

import os
import queue
import select
import socket
import threading

import numpy as np
import pytest

from fiberlite.errors import AuthenticationError
from fiberlite.wire import auth
from fiberlite.wire import link as links
from fiberlite.wire import tcp
from fiberlite.wire.link import LinkCanceled, LinkClosed, LinkTimeout
from fiberlite.wire.link.tcp import TcpLink

KEY = os.urandom(32)


def _pair(buffer: int | None = None) -> tuple[TcpLink, TcpLink]:
    reader = TcpLink.listen("127.0.0.1", KEY)
    accepted: list = []
    thread = threading.Thread(target=lambda: accepted.append(reader.accept(KEY, buffer)))
    thread.start()
    writer = links.dial(reader.address, KEY)
    thread.join(15)
    assert accepted == [True]
    return reader, writer


def test_the_address_table_sends_tcp_to_the_tcp_flavour_and_refuses_unknown_schemes():
    reader, writer = _pair()
    try:
        assert reader.address.startswith("tcp://127.0.0.1:")
        assert type(writer) is TcpLink
        assert writer.send(b"hello", -1)
        assert reader.recv(5000) == b"hello"
    finally:
        reader.close()
        writer.close()
    with pytest.raises(ValueError, match="starts with one of"):
        links.dial("udp://127.0.0.1:9", KEY)


def test_a_peer_without_the_key_is_refused_and_nothing_it_sends_is_read():
    reader = TcpLink.listen("127.0.0.1", KEY)
    accepted: list = []
    thread = threading.Thread(target=lambda: accepted.append(reader.accept(KEY)))
    thread.start()
    try:
        with pytest.raises(AuthenticationError):
            TcpLink.dial(reader.address, os.urandom(32))
        # random bytes instead of the handshake: closed, nothing answered
        with socket.create_connection(tcp.host_port(reader.address), timeout=10) as raw:
            raw.sendall(os.urandom(auth.HELLO_SIZE))
            assert raw.recv(100) == b""
        writer = TcpLink.dial(reader.address, KEY)   # the right key still gets in
        thread.join(15)
        assert accepted == [True]
        assert writer.send(b"after", -1)
        assert reader.recv(5000) == b"after"
        writer.close()
    finally:
        reader.close()
        thread.join(15)


def test_recv_into_reads_a_large_array_in_place_after_small_frames_and_acks():
    reader, writer = _pair()
    try:
        data = np.arange(3_000_000, dtype=np.float32)   # 12 MB: more than a socket holds
        sender = threading.Thread(target=lambda: (writer.send(b"small", -1), writer.send(memoryview(data).cast("B"), -1)))
        sender.start()
        assert reader.acknowledge()   # an acknowledgement in line, the other way
        assert reader.recv(5000) == b"small"
        into = np.zeros_like(data)
        assert reader.recv_into(into) == data.nbytes
        sender.join(15)
        assert np.array_equal(into, data)
        writer.recv_nowait()   # reads (and counts) the acknowledgement
        assert writer.acknowledged() == 1
    finally:
        reader.close()
        writer.close()


def test_recv_into_reads_the_frames_as_one_stream_whatever_the_cut():
    reader, writer = _pair()
    try:
        parts = [np.arange(5, dtype=np.int64), np.zeros(0, np.uint8), np.arange(7, dtype=np.float32),
                 np.arange(300_000, dtype=np.float64)]
        sent = b"".join(p.tobytes() for p in parts)
        writer.acknowledge()   # (acknowledgements among the frames are counted, not read as bytes)
        sender = threading.Thread(target=lambda: [writer.send(memoryview(p).cast("B"), -1) for p in parts])
        sender.start()
        cuts = [np.empty(3, np.uint8), np.empty(61, np.uint8), np.empty(len(sent) - 64 - 10, np.uint8),
                np.empty(10, np.uint8)]
        for cut in cuts:
            assert reader.recv_into(cut) == cut.nbytes
        sender.join(15)
        assert b"".join(c.tobytes() for c in cuts) == sent
        assert reader.acknowledged() == 1
    finally:
        reader.close()
        writer.close()


def test_close_wakes_a_reader_blocked_for_ever():
    reader, writer = _pair()
    errors: list = []
    started = threading.Event()

    def read() -> None:
        started.set()
        try:
            reader.recv_into(bytearray(1 << 20))
        except (LinkClosed, LinkCanceled) as exc:
            errors.append(exc)

    thread = threading.Thread(target=read)
    thread.start()
    started.wait(5)
    reader.close()
    thread.join(5)
    assert not thread.is_alive() and len(errors) == 1
    writer.close()


def test_the_peer_leaving_ends_a_receive_and_a_timeout_is_a_timeout():
    reader, writer = _pair()
    try:
        with pytest.raises(LinkTimeout):
            reader.recv(50)
        lost = threading.Event()
        reader.on_lost(lost.set)
        writer.close()
        assert lost.wait(5)
        with pytest.raises((LinkCanceled, LinkTimeout)):
            reader.recv(5000)
    finally:
        reader.close()


def test_a_listener_serves_many_peers_and_close_ends_their_links():
    served = threading.Semaphore(0)

    def echo(sock: socket.socket) -> None:
        link = links.StreamLink.over(sock, "served")
        served.release()
        try:
            while True:
                link.send(link.recv(), -1)
        except links.LinkError:
            return

    for scheme, where in (("tcp", "127.0.0.1"), ("abstract", "test")):
        listener = links.serve(scheme, where, KEY, echo, "an echo")
        callers = [links.dial(listener.address, KEY) for _ in range(3)]
        for i, caller in enumerate(callers):
            assert caller.send(b"%d" % i, -1)
            assert caller.recv(5000) == b"%d" % i
        for _ in callers:
            assert served.acquire(timeout=5)
        assert listener.connections == 3
        listener.close()
        for caller in callers:
            with pytest.raises((LinkCanceled, LinkTimeout, LinkClosed)):
                caller.recv(5000)
            caller.close()


def test_a_connection_handed_over_outlives_the_listener_closed_before_serve_returned():
    """A listener that hands its connections over (a TCP link's, a ring link's) leaves one
    alone once passed on, even while the thread that passed it has not returned yet (a
    thread descheduled there on a loaded machine): closing the listener then shut the
    connection down under its new owner, whose first receive saw the end."""
    from fiberlite.wire.link.listener import Listener
    handed: queue.SimpleQueue = queue.SimpleQueue()
    release = threading.Event()

    def hand_over(sock: socket.socket) -> None:
        handed.put(sock)
        release.wait(10)   # still inside serve when the owner closes the listener

    listener = Listener.tcp("127.0.0.1", KEY, hand_over, "a hand-over", hands_over=True)
    caller = links.dial(listener.address, KEY)
    try:
        owned = links.StreamLink.over(handed.get(timeout=10), "owned")
        listener.close()
        assert caller.send(b"after the listener closed", -1)
        assert owned.recv(5000) == b"after the listener closed"
        assert owned.send(b"and back", -1)
        assert caller.recv(5000) == b"and back"
        owned.close()
    finally:
        release.set()
        caller.close()


def test_an_acknowledgement_alone_wakes_no_receive_and_is_counted_with_the_next_frame():
    reader, writer = _pair()
    try:
        sock = socket.socket(fileno=os.dup(writer.fileno()))
        try:
            assert reader.acknowledge()
            # the kernel holds a lone acknowledgement below the socket's low-water mark
            assert not select.select([sock], [], [], 0.2)[0]
            with pytest.raises(LinkTimeout):
                writer.recv(100)
            assert reader.send(b"x", -1)   # a one-byte frame (padded): readable at once
            assert select.select([sock], [], [], 5)[0]
        finally:
            os.close(sock.detach())
        assert writer.recv(5000) == b"x"
        assert writer.acknowledged() == 1
        assert reader.acknowledge()
        assert writer.recv_nowait() is None   # a look reads what is there, and counts it
        assert writer.acknowledged() == 2
    finally:
        reader.close()
        writer.close()


@pytest.mark.parametrize("frame", [b"a", b""], ids=["one byte", "empty"])
@pytest.mark.parametrize("wait", ["for ever", "timeout", "look", "recv_into"])
def test_a_short_frame_arriving_alone_is_read_at_once(wait, frame):
    """Frames of one byte or none are padded past the low-water mark that keeps
    acknowledgements quiet: none waits for the next frame or a timeout (read as a
    stream, an empty one adds nothing)."""
    reader, writer = _pair()
    try:
        got: list = []

        def read() -> None:
            if wait == "for ever":
                got.append(reader.recv(-1))
            elif wait == "timeout":
                got.append(reader.recv(10_000))
            elif wait == "look":   # once the socket says it is readable, a look reads it
                select.select([reader.fileno()], [], [], 10)
                got.append(reader.recv_nowait())
            else:
                into = bytearray(2)
                reader.recv_into(into, -1)
                got.append(bytes(into))
        thread = threading.Thread(target=read)
        thread.start()
        assert writer.send(frame, -1)   # alone: 8 or 9 bytes unpadded, below the low-water mark
        rest = (b"b",) if frame else (b"x", b"y")
        if wait == "recv_into":
            assert writer.send(rest, -1)   # a frame of parts
        thread.join(5)   # within the receive's own wait (10 s) or the socket's timeout
        assert not thread.is_alive()
        assert got == [frame + b"".join(rest) if wait == "recv_into" else frame]
        assert writer.send((frame,), -1) and reader.recv(5000) == frame   # as parts: the same
        assert writer.send(b"after", -1) and reader.recv(5000) == b"after"
    finally:
        reader.close()
        writer.close()


def test_a_reader_told_by_its_selector_takes_every_frame_that_arrived_in_one_read():
    reader, writer = _pair()
    try:
        assert reader.recv_ready() == []  # (nothing yet: no wait)
        writer.send(b"one", -1)
        writer.send(b"two", -1)
        poller = select.poll()
        poller.register(reader.fileno(), select.POLLIN)
        assert poller.poll(5000)
        got = reader.recv_ready()
        while len(got) < 2:  # (the two may come in two segments)
            assert poller.poll(5000)
            got += reader.recv_ready()
        assert got == [b"one", b"two"]
        writer.close()
        assert poller.poll(5000)
        assert reader.recv_ready() == [] and reader.lost
    finally:
        reader.close()
        writer.close()

