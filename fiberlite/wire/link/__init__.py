"""Links: a direct, authenticated connection between two processes, carrying frames.

The reading process listens (:func:`listen`; :func:`serve` for a server of many
peers), the writing one dials it (:func:`dial`, which the address's scheme sends to its
flavour); both prove the run's key (:mod:`fiberlite.wire.auth`) before any frame passes.
Three transports carry links behind one interface (:class:`Link`), and the caller
chooses (:mod:`fiberlite.runtime.machine` knows whether the peer shares this machine):

- :mod:`.nng` (``nng+tcp://``, ``tls+tcp://``): an nng PAIR socket, over TCP (TLS with
  the ``tls`` setting): any two processes that reach each other;
- :mod:`.tcp` (``tcp://``): a TCP connection read and written by the calling threads
  themselves (:mod:`.stream`), with :meth:`~.stream.StreamLink.recv_into` for bulk data;
- :mod:`.local` (``local://``): a Unix stream socket in Linux's abstract namespace, the
  same frames: two processes of one machine; ``abstract://`` is a server's abstract
  name (:mod:`.abstract`), dialed by many callers of its machine.

A frame is ``bytes``, or a tuple of bytes-like parts sent as one frame (out-of-band
buffers that are not copied into one message first). The reader acknowledges each
frame it consumed (:meth:`Link.acknowledge`): nng carries acknowledgements in line, a
local link counts them in memory both processes map, so that they wake nobody. A
receive raises
:class:`LinkTimeout`, :class:`LinkCanceled` or :class:`LinkClosed`, never a transport's
own error.
"""
from __future__ import annotations

import socket
from typing import Callable

from .base import ACK, Link, LinkCanceled, LinkClosed, LinkError, LinkTimeout
from .listener import Listener
from .stream import StreamLink

__all__ = ["ACK", "Link", "LinkError", "LinkTimeout", "LinkCanceled", "LinkClosed", "Listener",
           "StreamLink", "listen", "serve", "dial"]


def listen(host: str, key: bytes, use_tls: bool = False, same_machine: bool = False) -> Link:
    """A listening end for one writer that reaches this process at ``host``: a Unix socket
    when the writer is on this machine (``same_machine``, and no ``use_tls``), nng when
    links must be encrypted (``use_tls``), else TCP."""
    if use_tls:
        from .nng import NngLink
        return NngLink.listen(host, key, True)
    if same_machine:
        from .local import LocalLink, available
        if available():
            return LocalLink.listen(key)
    from .tcp import TcpLink
    return TcpLink.listen(host, key)


def serve(scheme: str, where: str, key: bytes, serve_one: Callable[[socket.socket], None],
          name: str) -> Listener:
    """A listener for many peers, each proving ``key`` (:class:`~.listener.Listener`):
    ``scheme`` ``"tcp"`` listens where peers that reach this process at host ``where``
    arrive, ``"abstract"`` on a fresh abstract Unix name made for ``where`` (what listens).
    ``serve_one(sock)`` gets each proven connection on a thread of its own; a link over
    it is ``StreamLink.over(sock, address)``."""
    if scheme == "tcp":
        return Listener.tcp(where, key, serve_one, name)
    if scheme == "abstract":
        return Listener.abstract(where, key, serve_one, name)
    raise ValueError(f"cannot serve many peers on {scheme!r}: use 'tcp' or 'abstract'")


def _dial_local(address: str, key: bytes) -> Link:
    from .local import LocalLink
    return LocalLink.dial(address, key)


def _dial_abstract(address: str, key: bytes) -> Link:
    from .abstract import dial
    return dial(address, key)


def _dial_tcp(address: str, key: bytes) -> Link:
    from .tcp import TcpLink
    return TcpLink.dial(address, key)


def _dial_nng(address: str, key: bytes) -> Link:
    from .nng import NngLink
    return NngLink.dial(address, key)


FLAVOURS: dict[str, Callable[[str, bytes], Link]] = {
    "local": _dial_local,        # one writer of this machine (shared acknowledgement count)
    "abstract": _dial_abstract,  # one of many callers of this machine (a Listener)
    "tcp": _dial_tcp,            # a TCP link, or one of many callers (a Listener)
    "nng+tcp": _dial_nng,        # an nng PAIR over TCP
    "tls+tcp": _dial_nng,        # an nng PAIR over TLS
}


def dial(address: str, key: bytes) -> Link:
    """Dial the listening end at ``address`` and prove ``key`` (``ConnectionError`` or
    :class:`~fiberlite.errors.AuthenticationError` when that fails); its scheme names the
    flavour (:data:`FLAVOURS`)."""
    dial_flavour = FLAVOURS.get(address.split("://", 1)[0])
    if dial_flavour is None:
        raise ValueError(f"cannot dial {address!r}: a link address starts with one of "
                         f"{', '.join(s + '://' for s in FLAVOURS)}")
    return dial_flavour(address, key)
