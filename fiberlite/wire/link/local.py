"""A link carried by a Unix stream socket: two processes of one machine.

The reader listens on a name of its own in Linux's abstract namespace (no file to
remove, reachable from every process that shares this network namespace) and accepts
one writer, which proves the run's key first (:mod:`fiberlite.wire.auth`, the same
handshake as every connection). From then on it is a :class:`~.stream.StreamLink`:
frames written and read by the calling threads themselves.

The reader acknowledges what it consumed by counting in 4 bytes both processes map
(a ``memfd`` the writer makes and passes over the socket once both proved the key):
an acknowledgement costs no system call and wakes nobody; the writer reads the count
when it needs it.
"""
from __future__ import annotations

import os
import socket
import time

from .. import auth, unix
from .sockets import dial_proven, new_ack_lane, take_ack_lane
from .stream import StreamLink

SCHEME = "local://"
HANDSHAKE_TIMEOUT = 10.0


def available() -> bool:
    """Whether this system has abstract Unix sockets and eventfd (Linux)."""
    return hasattr(os, "eventfd") and hasattr(socket, "AF_UNIX") and os.uname().sysname == "Linux"


class LocalLink(StreamLink):
    """One end of a local link; one receiving and one sending thread at a time."""

    acks_in_line = False  # acknowledgements are counted in shared memory, beside the sending

    def __init__(self, listening: socket.socket | None = None, address: str = "") -> None:
        super().__init__(address)
        self._listening = listening
        self._acks: memoryview | None = None  # the shared acknowledgement count

    # -- making one ----------------------------------------------------------------------
    @classmethod
    def listen(cls, key: bytes) -> "LocalLink":
        """A link waiting for its writer on an abstract name of its own (:attr:`address`)."""
        listening, name = unix.listen_abstract("link", 8)
        return cls(listening, SCHEME + name)

    def accept(self, key: bytes) -> bool:
        """Take the first connection whose peer proves ``key`` (those that do not are
        closed), within the handshake's time: whether one did. Stops listening."""
        listening, self._listening = self._listening, None
        if listening is None:
            return self._sock is not None
        deadline = time.monotonic() + HANDSHAKE_TIMEOUT
        try:
            while time.monotonic() < deadline and not self._closed:
                listening.settimeout(max(0.001, deadline - time.monotonic()))
                try:
                    sock, _ = listening.accept()
                except (socket.timeout, OSError):
                    return False
                if auth.check_on(sock, key, deadline):
                    lane = take_ack_lane(sock, deadline)
                    if lane is not None:
                        self._acks = lane
                        return self._connected(sock)
                sock.close()
            return False
        finally:
            listening.close()

    @classmethod
    def dial(cls, address: str, key: bytes) -> "LocalLink":
        """Connect to the reader at ``address`` and prove the key (``ConnectionError`` or
        :class:`~fiberlite.errors.AuthenticationError` when that fails)."""
        name = address[len(SCHEME):]
        fd, lane = new_ack_lane()
        try:
            sock = dial_proven(lambda wait: unix.connect_abstract(name, wait), address, key,
                               HANDSHAKE_TIMEOUT, lambda sock: socket.send_fds(sock, [b"A"], [fd]))
        finally:
            os.close(fd)
        link = cls(address=address)
        link._acks = lane
        link._connected(sock)
        return link

    # -- acknowledgements ----------------------------------------------------------------
    def acknowledge(self, timeout_ms: int = 0) -> bool:
        """Count one more consumed frame where the writer reads it (no system call)."""
        acks = self._acks
        if acks is None or self._closed:
            return False
        acks[0] = (acks[0] + 1) & 0xFFFFFFFF
        return True

    def acknowledged(self) -> int:
        """The count of acknowledged frames, modulo 2**32 (read it as a difference)."""
        acks = self._acks
        return 0 if acks is None else acks[0]

    def close(self) -> None:
        """Close the link (and stop listening, if it still does)."""
        listening, self._listening = self._listening, None
        if listening is not None:
            listening.close()
        super().close()
