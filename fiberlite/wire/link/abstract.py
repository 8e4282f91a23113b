"""Dialing a listener on an abstract Unix name (``abstract://<name>``, :class:`~.listener.Listener`):
many callers of one machine to one server, each on a :class:`~.stream.StreamLink` of its own."""
from __future__ import annotations

from .. import unix
from .listener import ABSTRACT
from .sockets import dial_proven
from .stream import StreamLink

HANDSHAKE_TIMEOUT = 10.0


def dial(address: str, key: bytes, timeout: float = HANDSHAKE_TIMEOUT) -> StreamLink:
    """A link to the listener at ``address`` once both proved ``key`` within ``timeout``
    seconds (``ConnectionRefusedError`` when nobody listens there, ``ConnectionError`` when
    it fails otherwise, :class:`~fiberlite.errors.AuthenticationError` for a wrong key)."""
    name = address[len(ABSTRACT):]
    sock = dial_proven(lambda wait: unix.connect_abstract(name, wait), address, key, timeout)
    sock.settimeout(None)
    return StreamLink.over(sock, address)
