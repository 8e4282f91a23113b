"""No byte from a socket is unpickled before its peer proved it holds the run's key."""
from __future__ import annotations

import os
import pickle
import socket
import struct

import pynng
import pytest

import fiberlite
from fiberlite.runtime import hub, identity
from fiberlite.errors import AuthenticationError
from fiberlite.wire import auth, codec, tls
from fiberlite.wire.client import Client
from fiberlite.wire.server import Server
from raw_peer import say_hello
from unpickle_trap import Trace

pytestmark = pytest.mark.timeout(60)


@pytest.fixture
def marker(tmp_path):
    path = str(tmp_path / "unpickled")
    yield path
    assert not os.path.exists(path), "a message from an unauthenticated peer was unpickled"


@pytest.fixture
def echo_ref():
    class Echo(hub.Servant):
        def op_echo(self, request, value):
            request.reply(value)
    return hub.get_hub().register(Echo())


def _assert_still_serving(ref):
    client = Client(ref.address, identity.key())
    try:
        assert client.request((ref.oid, "echo", ("still here",))) == (True, "still here")
    finally:
        client.close()


def test_wrong_key_is_refused(echo_ref, marker):
    with pytest.raises(AuthenticationError):
        Client(echo_ref.address, b"not the key" * 3)
    _assert_still_serving(echo_ref)


def test_pickle_instead_of_handshake_is_never_loaded(echo_ref, marker):
    # an nng peer is closed before nng's own greeting: no message of it is ever read
    with pytest.raises(pynng.NNGException):
        sock = pynng.Req0(dial=echo_ref.address, recv_timeout=1000, resend_time=-1)
        try:
            sock.send(codec.encode((echo_ref.oid, "echo", (Trace(marker),))))
            sock.recv()
        finally:
            sock.close()
    with socket.create_connection(tls.host_port(echo_ref.address), timeout=5) as s:
        s.sendall(codec.encode((echo_ref.oid, "echo", (Trace(marker),))))
        assert _closed_by_server(s)
    _assert_still_serving(echo_ref)


def _closed_by_server(s: socket.socket) -> bool:
    """Whether the server ends ``s`` without sending it anything more."""
    try:
        return s.recv(1) == b""
    except ConnectionResetError:
        return True


def _challenged(address: str) -> tuple[socket.socket, bytes, bytes]:
    """A raw connection that sent a HELLO and read the CHALLENGE: (it, client nonce,
    server nonce)."""
    s = socket.create_connection(tls.host_port(address), timeout=5)
    nonce, challenge = say_hello(s)
    return s, nonce, challenge[len(auth.CHALLENGE):len(auth.CHALLENGE) + auth.NONCE_SIZE]


def test_pickle_instead_of_proof_is_never_loaded(echo_ref, marker):
    s, _, _ = _challenged(echo_ref.address)
    with s:
        s.sendall(pickle.dumps(Trace(marker)))
        assert _closed_by_server(s)
    _assert_still_serving(echo_ref)


def test_forged_proof_is_rejected(echo_ref, marker):
    s, nonce, server_nonce = _challenged(echo_ref.address)
    with s:
        s.sendall(auth.proof(b"guessed key", nonce, server_nonce))
        assert _closed_by_server(s)
    _assert_still_serving(echo_ref)


@pytest.mark.parametrize("junk", [
    os.urandom(4096),
    b"\x00SP\x00\x00\x30\x00\x00",  # an nng header, then nothing
    b"\x00SP\x00\x00\x30\x00\x00" + struct.pack(">Q", 100) + b"short",  # truncated frame
    b"GET / HTTP/1.1\r\nHost: x\r\n\r\n",
])
def test_raw_tcp_junk_and_truncated_frames_are_dropped(echo_ref, marker, junk):
    with socket.create_connection(tls.host_port(echo_ref.address), timeout=5) as s:
        s.sendall(junk)
    _assert_still_serving(echo_ref)


def test_client_refuses_server_without_the_key(marker):
    def handler(request, message):  # pragma: no cover - never reached
        request.reply(Trace(marker))
    server = Server(b"another run's key", "127.0.0.1", handler, lambda peer: None, lambda fn: fn())
    try:
        with pytest.raises(AuthenticationError):
            Client(server.address, identity.key())
    finally:
        server.close()


def test_child_job_authenticates_with_inherited_key():
    q = fiberlite.Queue()
    p = fiberlite.Process(target=q.put, args=("authenticated",))
    p.start()
    assert q.get(timeout=30) == "authenticated"
    p.join()


def test_a_peer_that_speaks_nng_first_is_closed_and_the_log_says_why(caplog):
    """A job of an older fiberlite (an image built before the door) dials with nng: the
    door closes it at its greeting, and its warning names the likely cause."""
    server = Server(identity.key(), "127.0.0.1", lambda request, message: None,
                    lambda peer: None, lambda fn: fn())
    try:
        with caplog.at_level("WARNING", logger="fiberlite.wire.doorman"):
            with socket.create_connection(tls.host_port(server.address), timeout=5) as s:
                s.sendall(b"\x00SP\x00\x00\x30\x00\x00")
                assert _closed_by_server(s)
        assert "spoke nng before proving the key" in caplog.text
        assert "is its image built from this version?" in caplog.text
    finally:
        server.close()
