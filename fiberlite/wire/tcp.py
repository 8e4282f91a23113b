"""TCP sockets between processes that reach each other over a network: listening where
peers that are told a host reach this process, dialing one, and a free port.

Every TCP socket fiberlite opens outside nng is made here, so that its flags (no
Nagle delay on every connection, close-on-exec, the bind address of
:func:`~fiberlite.wire.binding.bind_host`) are the same everywhere.
"""
from __future__ import annotations

import socket

from .binding import bind_host

SCHEME = "tcp://"


def _family(host: str) -> socket.AddressFamily:
    return socket.AF_INET6 if ":" in host.strip("[]") else socket.AF_INET


def listen(host: str, backlog: int, port: int = 0) -> tuple[socket.socket, int]:
    """A socket listening for peers that reach this process at ``host`` (on ``port``,
    0: any free one), and its port."""
    bind = bind_host(host).strip("[]")
    listening = socket.create_server((bind, port), family=_family(bind), backlog=backlog)
    return listening, listening.getsockname()[1]


def connect(host: str, port: int, timeout: float | None) -> socket.socket:
    """A connection to ``host:port`` (no Nagle delay; ``timeout`` set). Raises ``OSError``
    (``ConnectionRefusedError`` when nobody listens there)."""
    sock = socket.create_connection((host.strip("[]"), port), timeout=timeout)
    nodelay(sock)
    return sock


def nodelay(sock: socket.socket) -> None:
    """Send small writes at once (an accepted connection needs it set too)."""
    if sock.family in (socket.AF_INET, socket.AF_INET6):
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)


def address(host: str, port: int) -> str:
    """The ``tcp://`` address of ``host:port``."""
    return f"{SCHEME}{host}:{port}"


def host_port(address: str) -> tuple[str, int]:
    """``(host, port)`` of a ``tcp://`` address (``ValueError`` for any other)."""
    if not address.startswith(SCHEME):
        raise ValueError(f"not a tcp:// address: {address!r}")
    host, port = address[len(SCHEME):].rsplit(":", 1)
    return host, int(port)


def free_port() -> int:
    """A TCP port nobody listens on now (another process may take it before it is used)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        probe.bind(("", 0))
        return probe.getsockname()[1]
