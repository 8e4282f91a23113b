"""``fiberlite.connection.Listener`` / ``Client``: jobs that connect to each other by address."""
from __future__ import annotations

import pickle
import socket
import struct
import threading

import numpy as np
import pytest

import fiberlite
from fiberlite.connection import Client, Listener, Pipe, SocketConnection, wait
from fiberlite.errors import AuthenticationError
from fiberlite.runtime.hub import listen_host

pytestmark = pytest.mark.timeout(60)


def call_back(address, authkey=None):
    """A job that connects to ``address``, applies what it receives and sends it back."""
    with Client(address, authkey=authkey) as conn:
        while True:
            item = conn.recv()
            if item is None:
                return
            fn, value = item
            conn.send(fn(value))


def accept_in_background(listener):
    """Accept one connection on a thread: (thread, accepted connections, errors)."""
    accepted, errors = [], []

    def accept():
        try:
            accepted.append(listener.accept())
        except AuthenticationError as exc:
            errors.append(exc)
    thread = threading.Thread(target=accept, daemon=True)
    thread.start()
    return thread, accepted, errors


def test_a_job_connects_with_the_runs_key_and_objects_travel_by_value():
    with Listener() as listener:
        host, port = listener.address
        assert host == listen_host() and port > 0
        p = fiberlite.Process(target=call_back, args=(listener.address,))
        p.start()
        with listener.accept() as conn:
            assert isinstance(conn, SocketConnection)
            offset = 5
            conn.send((lambda x: x + offset, 1))       # a closure: pickled by value
            assert conn.recv() == 6
            array = np.arange(200_000, dtype=np.float64)
            conn.send((lambda a: a * 2, array))
            assert np.array_equal(conn.recv(), array * 2)
            conn.send(None)
            with pytest.raises(EOFError):             # the job closed its end
                conn.recv()
        p.join(30)
        assert p.exitcode == 0


def test_bytes_poll_and_wait_with_pipes():
    with Listener() as listener:
        t, accepted, _ = accept_in_background(listener)
        client = Client(listener.address)
        t.join(20)
        server = accepted[0]
        here, there = Pipe()
        try:
            assert not client.poll(0)
            assert wait([client, here], timeout=0.2) == []
            server.send_bytes(b"0123456789", 2, 5)
            assert wait([client, here], timeout=20) == [client]
            assert client.recv_bytes() == b"23456"
            server.send_bytes(b"abc")
            buf = bytearray(8)
            assert client.recv_bytes_into(buf, 2) == 3 and buf[2:5] == b"abc"
            there.send("pipe")
            assert wait([client, here], timeout=20) == [here]
            assert here.recv() == "pipe"
        finally:
            client.close()
            server.close()
            here.close()
            there.close()
        assert client.closed


def test_a_wrong_key_is_refused_on_both_sides():
    with Listener(authkey=b"right key") as listener:
        t, _, refused = accept_in_background(listener)
        with pytest.raises(AuthenticationError):
            # a listener of this process: the key is proven in the background, and
            # the first read reports the refusal
            Client(listener.address, authkey=b"wrong key").recv()
        t.join(20)
        assert refused and str(listener.address[1]) in str(refused[0])


def test_default_listener_and_client_as_context_managers_on_one_thread():
    with Listener() as listener:
        with Client(listener.address) as client:        # before accept(): must not hang
            client.send("held until the key is proven")
            client.send_bytes(b"0123456789", 2, 3)
            with listener.accept() as server:
                assert server.recv() == "held until the key is proven"
                assert server.recv_bytes() == b"234"
                server.send(1729)
                assert client.recv() == 1729
                assert client.poll(0) is False


def test_families_and_a_bad_family():
    assert fiberlite.connection.families == ["AF_INET", "AF_UNIX"]
    for family in fiberlite.connection.families:
        with Listener(family=family) as listener:
            with pytest.raises(OSError):                # the address is taken
                Listener(listener.address, family)
    with pytest.raises(ValueError, match="AF_INET"):
        Listener(family="AF_PIPE")
    for make in (Listener, fiberlite.connection.Client):  # a Windows named pipe's address
        with pytest.raises(ValueError, match="named pipe"):
            make(r"\\.\pipe\name")


def test_nothing_from_an_unauthenticated_peer_is_unpickled(tmp_path):
    marker = tmp_path / "unpickled"

    class Trace:
        def __reduce__(self):
            return (open, (str(marker), "w"))
    evil = pickle.dumps(Trace())
    with Listener() as listener:
        t, _, errors = accept_in_background(listener)
        with socket.create_connection(listener.address, timeout=20) as sock:
            # the challenge comes first; answer it with a pickle instead of a digest
            header = sock.recv(4)
            (size,) = struct.unpack("!i", header)
            while size:
                size -= len(sock.recv(size))
            sock.sendall(struct.pack("!i", len(evil)) + evil)
            t.join(20)
        assert errors, "the listener accepted a peer that did not answer the challenge"
        assert not marker.exists()


def test_connections_and_listeners_do_not_travel_to_other_jobs():
    with Listener() as listener:
        with pytest.raises(TypeError, match="send its address"):
            pickle.dumps(listener)
        t, accepted, _ = accept_in_background(listener)
        with Client(listener.address) as conn:
            t.join(20)
            with pytest.raises(TypeError, match="call Client\\(\\) there"):
                pickle.dumps(conn)
            p = fiberlite.Process(target=print, args=(conn,))
            with pytest.raises(Exception, match="cannot be sent to another job"):
                p.start()
        accepted[0].close()


def test_connecting_where_nothing_listens_names_the_address():
    with Listener() as listener:
        address = listener.address
    with pytest.raises(ConnectionRefusedError, match=str(address[1])):
        Client(address)


def test_a_bad_authkey_type_is_a_clear_error():
    with pytest.raises(TypeError, match="authkey should be a byte string"):
        Listener(authkey="text")
