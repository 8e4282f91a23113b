"""A link carried by a TCP connection: two processes that reach each other over a network.

The reader listens (:class:`~.listener.Listener`: every connection proves the run's key
on a thread of its own, under a deadline and a bound) and keeps the first connection that
proves it; the writer dials and proves it. From then on it is a
:class:`~.stream.StreamLink`: frames written and read by the calling threads themselves,
acknowledgements in line, and :meth:`~.stream.StreamLink.recv_into` for bulk data.
Socket buffers are left to the kernel, which sizes TCP's to the network, unless the
caller asks for a size (:meth:`TcpLink.dial`'s ``buffer``).

An acknowledgement that arrives alone wakes no receiver (:data:`~.stream.QUIET_LOWAT`): the
reader of a pipe that answers what it receives acknowledges it first, and its answer
would otherwise cost the other side two wake-ups. A receive looks awake first as any
stream link's does (:mod:`.awake`): a peer whose answers take longer than a look (a
network's round trip) soon makes it look rarely, and it does not look while the
machine has no CPU to spare.
"""
from __future__ import annotations

import queue
import socket
import time

from .. import tcp
from .listener import Listener
from .sockets import dial_proven
from .stream import StreamLink

SCHEME = tcp.SCHEME
HANDSHAKE_TIMEOUT = 10.0


class TcpLink(StreamLink):
    """One end of a TCP link; one receiving and one sending thread at a time."""

    quiet_acks = True  # an acknowledgement alone wakes no receive (a peer's system call each)

    def __init__(self, address: str = "") -> None:
        super().__init__(address)
        self._listener: Listener | None = None
        self._proven: queue.SimpleQueue[socket.socket] | None = None

    @classmethod
    def listen(cls, host: str, key: bytes) -> "TcpLink":
        """A link waiting for its writer, which reaches this process at ``host``
        (:attr:`address`: where to dial)."""
        link = cls()
        proven: queue.SimpleQueue[socket.socket] = queue.SimpleQueue()
        link._proven = proven
        link._listener = Listener.tcp(host, key, proven.put, "a TCP link", limit=8, hands_over=True)
        link.address = link._listener.address
        return link

    def accept(self, key: bytes, buffer: int | None = None) -> bool:
        """Take the first connection whose peer proves ``key`` (those that do not are
        closed) within the handshake's time: whether one did. Stops listening."""
        listener, self._listener = self._listener, None
        if listener is None:
            return self._sock is not None
        deadline = time.monotonic() + HANDSHAKE_TIMEOUT
        try:
            while not self._closed:
                left = deadline - time.monotonic()
                if left <= 0:
                    return False
                try:
                    sock = self._proven.get(timeout=min(left, 0.1))
                except queue.Empty:
                    continue
                return self._connected(sock, buffer)
            return False
        finally:
            listener.close()
            self._drop_unused()

    def _drop_unused(self) -> None:
        while True:
            try:
                self._proven.get_nowait().close()
            except queue.Empty:
                return

    @classmethod
    def dial(cls, address: str, key: bytes, buffer: int | None = None,
             timeout: float = HANDSHAKE_TIMEOUT) -> "TcpLink":
        """Connect to the reader at ``address`` and prove the key within ``timeout``
        seconds (``ConnectionError``, or :class:`~fiberlite.errors.AuthenticationError`
        when the reader does not prove it)."""
        return cls.over(prove_dialed(address, key, timeout), address, buffer)

    def close(self) -> None:
        """Close the link (and stop listening, if it still does)."""
        listener, self._listener = self._listener, None
        if listener is not None:
            listener.close()
        super().close()


def prove_dialed(address: str, key: bytes, timeout: float = HANDSHAKE_TIMEOUT) -> socket.socket:
    """A TCP connection to ``address`` whose listener proved ``key`` (and this process
    too): ``ConnectionRefusedError`` when nobody listens, ``ConnectionError`` when it
    fails otherwise, :class:`~fiberlite.errors.AuthenticationError` for a wrong key."""
    host, port = tcp.host_port(address)
    sock = dial_proven(lambda wait: tcp.connect(host, port, wait), address, key, timeout)
    sock.settimeout(None)
    return sock
