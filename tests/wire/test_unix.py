"""Unix sockets of one machine (fiberlite.wire.unix): abstract listeners, dials, pairs and
descriptors passed along a message."""
from __future__ import annotations

import os

import pytest

from fiberlite.wire import unix

pytestmark = pytest.mark.timeout(30)


def test_a_dial_reaches_the_abstract_listener_and_a_name_nobody_holds_is_refused():
    listening, name = unix.listen_abstract("test", 4)
    assert name.startswith(f"fiberlite-test-{os.getpid()}-")
    dialed = unix.connect_abstract(name, 5)
    accepted, _ = listening.accept()
    dialed.sendall(b"ping")
    assert accepted.recv(4) == b"ping"
    for sock in (dialed, accepted, listening):
        sock.close()
    with pytest.raises(ConnectionRefusedError):
        unix.connect_abstract(name, 5)


def test_a_seqpacket_pair_keeps_message_boundaries():
    a, b = unix.pair(unix.SEQPACKET)
    a.send(b"one")
    a.send(b"two")
    assert [b.recv(100), b.recv(100)] == [b"one", b"two"]
    a.close()
    b.close()


def test_descriptors_sent_along_a_message_arrive_open_and_usable():
    a, b = unix.pair(unix.SEQPACKET)
    r, w = os.pipe()
    unix.send_fds(a, b"here", [w])
    os.close(w)  # the receiver's copy stays open
    data, fds = unix.recv_fds(b, 100, 4)
    assert data == b"here" and len(fds) == 1
    os.write(fds[0], b"through the passed descriptor")
    assert os.read(r, 100) == b"through the passed descriptor"
    os.close(fds[0])
    os.close(r)
    a.close()
    assert unix.recv_fds(b, 100, 4) == (b"", []), "the peer's close reads as an empty message"
    b.close()


def test_an_adopted_descriptor_is_a_socket_that_owns_it():
    a, b = unix.pair()
    adopted = unix.adopt(b.detach())
    a.sendall(b"x")
    assert adopted.recv(1) == b"x"
    adopted.close()
    assert a.recv(1) == b"", "closing the adopted socket closed the descriptor"
    a.close()
