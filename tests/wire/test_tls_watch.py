"""With ``tls`` on, connections that never complete the TLS handshake are cut off: after
``auth_timeout``, and beyond ``auth_pending_limit`` at once; a job still connects."""
from __future__ import annotations

import secrets
import socket
import threading

import psutil
import pytest

import fiberlite
from fiberlite import config
from fiberlite.wire import tls
from fiberlite.wire.client import Client
from fiberlite.wire.server import Server
from waiting import eventually

KEY = secrets.token_bytes(32)
LIMIT = 16
TIMEOUT = 2.0
SILENT = 200


@pytest.fixture
def tls_server():
    before = {name: config.get(name) for name in ("auth_timeout", "auth_pending_limit")}
    fiberlite.init(auth_timeout=TIMEOUT, auth_pending_limit=LIMIT)
    server = Server(KEY, "127.0.0.1", lambda request, message: request.reply(message),
                    lambda peer: None, lambda fn: threading.Thread(target=fn).start(), use_tls=True)
    yield server
    server.close()
    fiberlite.init(**before)


def accepted(port: int) -> int:
    """Connections this process holds open on the listening side of ``port``."""
    return sum(1 for c in psutil.Process().net_connections(kind="tcp")
               if c.laddr and c.laddr.port == port and c.status == psutil.CONN_ESTABLISHED)


def test_silent_connections_to_a_tls_listener_are_bounded_then_cut_off(tls_server):
    host, port = tls.host_port(tls_server.address)
    silent = [socket.create_connection((host, port)) for _ in range(SILENT)]
    try:
        eventually(lambda: accepted(port) <= LIMIT, TIMEOUT,
                   lambda: f"{accepted(port)} silent connections kept, bound {LIMIT}:")
        client = Client(tls_server.address, KEY)   # a job connects during the flood
        assert client.request("hello") == (True, "hello")
        eventually(lambda: accepted(port) == 1, 3 * TIMEOUT,
                   lambda: f"{accepted(port) - 1} silent connections outlived the deadline:")
        assert client.request("still here") == (True, "still here")
        client.close()
    finally:
        for s in silent:
            s.close()


def test_silent_connections_to_a_tls_pipe_link_are_bounded_and_its_writer_links(tls_server):
    from fiberlite.wire.link.nng import NngLink as Link
    reader = Link.listen("127.0.0.1", KEY, True)
    host, port = tls.host_port(reader.address)
    silent = [socket.create_connection((host, port)) for _ in range(SILENT)]
    accepted_by: list[bool] = []
    accepting = threading.Thread(target=lambda: accepted_by.append(reader.accept(KEY)), daemon=True)
    try:
        eventually(lambda: accepted(port) <= LIMIT, TIMEOUT,
                   lambda: f"{accepted(port)} silent connections kept, bound {LIMIT}:")
        accepting.start()
        writer = Link.dial(reader.address, KEY)
        accepting.join(10)
        assert accepted_by == [True]
        writer.close()
    finally:
        reader.close()
        for s in silent:
            s.close()
