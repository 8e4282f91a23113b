"""Unix sockets between processes of one machine: listening on a name of Linux's abstract
namespace (no file to remove; reachable from every process that shares the network
namespace), dialing one, socket pairs, and descriptors passed along a message
(``SCM_RIGHTS``).

Every abstract name fiberlite listens on is made here, so that its shape
(``fiberlite-<what>-<pid>-<random>``) and the socket's flags are the same everywhere.
"""
from __future__ import annotations

import os
import secrets
import socket

STREAM = socket.SOCK_STREAM
SEQPACKET = socket.SOCK_SEQPACKET


def abstract_name(what: str) -> str:
    """A fresh abstract name for a listener of ``what`` in this process."""
    return f"fiberlite-{what}-{os.getpid()}-{secrets.token_hex(8)}"


def listen_abstract(what: str, backlog: int, *, blocking: bool = True) -> tuple[socket.socket, str]:
    """A stream socket listening on a fresh abstract name: the socket and the name.
    Raises ``OSError`` where abstract sockets do not exist."""
    name = abstract_name(what)
    listening = socket.socket(socket.AF_UNIX, STREAM | socket.SOCK_CLOEXEC)
    try:
        listening.bind("\0" + name)
        listening.listen(backlog)
        listening.setblocking(blocking)
    except BaseException:
        listening.close()
        raise
    return listening, name


def connect_abstract(name: str, timeout: float | None) -> socket.socket:
    """A stream socket connected to the listener on abstract ``name``, with ``timeout``
    set. Raises ``OSError`` (``ConnectionRefusedError`` when nobody listens there)."""
    sock = socket.socket(socket.AF_UNIX, STREAM | socket.SOCK_CLOEXEC)
    try:
        sock.settimeout(timeout)
        sock.connect("\0" + name)
    except BaseException:
        sock.close()
        raise
    return sock


def pair(kind: int = STREAM) -> tuple[socket.socket, socket.socket]:
    """Two connected Unix sockets of ``kind`` (:data:`STREAM` or :data:`SEQPACKET`)."""
    return socket.socketpair(socket.AF_UNIX, kind)


def adopt(fd: int) -> socket.socket:
    """A socket object owning the descriptor ``fd`` (inherited, or passed by a peer)."""
    return socket.socket(fileno=fd)


def send_fds(sock: socket.socket, data: bytes, fds: list[int]) -> None:
    """Send ``data`` as one message with copies of the descriptors ``fds`` alongside
    (the caller keeps its own and closes them when it likes)."""
    socket.send_fds(sock, [data], fds)


def recv_fds(sock: socket.socket, size: int, most: int) -> tuple[bytes, list[int]]:
    """One message of up to ``size`` bytes and the descriptors that came with it (at
    most ``most``; the caller owns them). ``b""``: the peer closed its end."""
    data, fds, _flags, _address = socket.recv_fds(sock, size, most)
    return data, fds
