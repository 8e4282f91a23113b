"""A connection that ends while it is handed to nng is reported, never taken for alive.

The door proves the key on a plain connection and then hands it to nng: the
connection may end right then (the other side's process is killed). A client or link
whose connection ended before its constructor returned must say so at once; taken for
alive, its first request would wait for a connection that never comes back.
"""
from __future__ import annotations

import secrets
import threading

import pytest

from fiberlite.wire import client as client_module
from fiberlite.wire import dialer
from fiberlite.wire.link import nng as link_module
from fiberlite.wire.client import Client
from fiberlite.wire.link.nng import NngLink as Link
from fiberlite.wire.server import Server

KEY = secrets.token_bytes(32)
DEADLINE = 10
REAL_DIAL = dialer.dial


def dial_then_lose(close_other_side):
    """dialer.dial that, once the connection is nng's, closes the other side and
    returns only after nng has reported the connection's end."""
    def dial(sock, guard, address, key, timeout):
        pipe = REAL_DIAL(sock, guard, address, key, timeout)
        ended = threading.Event()
        sock.add_post_pipe_remove_cb(lambda _pipe: ended.set())  # after the owner's own
        close_other_side()
        assert ended.wait(DEADLINE), "the other side closed, yet nng saw no end"
        return pipe
    return dial


def test_a_client_whose_connection_ends_as_it_is_made_raises(monkeypatch):
    server = Server(KEY, "127.0.0.1", lambda request, message: request.reply(message),
                    lambda peer: None, lambda fn: threading.Thread(target=fn).start())
    monkeypatch.setattr(client_module.dialer, "dial", dial_then_lose(server.close))
    with pytest.raises(ConnectionError, match="ended as it was made"):
        Client(server.address, KEY)


def test_a_link_whose_connection_ends_as_it_is_made_raises(monkeypatch):
    reader = Link.listen("127.0.0.1", KEY, False)
    accepted = threading.Thread(target=reader.accept, args=(KEY,), daemon=True)
    accepted.start()
    monkeypatch.setattr(link_module.dialer, "dial", dial_then_lose(reader.close))
    try:
        with pytest.raises(ConnectionError, match="ended as it was handed over"):
            Link.dial(reader.address, KEY)
    finally:
        reader.close()
        accepted.join(DEADLINE)
