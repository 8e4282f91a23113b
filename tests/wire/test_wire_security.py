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
    sock = pynng.Req0(dial=echo_ref.address, recv_timeout=1000, resend_time=-1)
    try:
        with pytest.raises(pynng.NNGException):
            sock.send(codec.encode((echo_ref.oid, "echo", (Trace(marker),))))
            sock.recv()  # the server closes the connection without answering
    finally:
        sock.close()
    _assert_still_serving(echo_ref)


def test_pickle_instead_of_proof_is_never_loaded(echo_ref, marker):
    sock = pynng.Req0(dial=echo_ref.address, recv_timeout=2000, resend_time=-1)
    try:
        nonce = auth.new_nonce()
        sock.send(auth.hello(nonce))
        assert sock.recv().startswith(auth.CHALLENGE)
        with pytest.raises(pynng.NNGException):
            sock.send(pickle.dumps(Trace(marker)))
            sock.recv()
    finally:
        sock.close()
    _assert_still_serving(echo_ref)


def test_forged_proof_is_rejected(echo_ref, marker):
    sock = pynng.Req0(dial=echo_ref.address, recv_timeout=2000, resend_time=-1)
    try:
        nonce = auth.new_nonce()
        sock.send(auth.hello(nonce))
        server_nonce = sock.recv()[len(auth.CHALLENGE):len(auth.CHALLENGE) + auth.NONCE_SIZE]
        with pytest.raises(pynng.NNGException):
            sock.send(auth.proof(b"guessed key", nonce, server_nonce))
            sock.recv()
    finally:
        sock.close()
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
