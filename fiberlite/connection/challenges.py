"""The listening side of :class:`~fiberlite.connection.listener.Listener`: connections
accepted as they come, each challenged on a thread of its own.

One peer that connects and says nothing does not hold up the others: every new
connection is challenged (the standard library's HMAC challenge, both ways) while
the listener goes on accepting, and :meth:`Acceptor.accept` returns the first that
passed. The challenges are under a :class:`~fiberlite.wire.gate.Gate`: a peer that has
not answered within the ``auth_timeout`` setting is cut off, and at most
``auth_pending_limit`` are challenged at once (the oldest is cut off to make room).
A peer that resets or hangs up during its challenge is simply dropped; one that
answers with the wrong key makes :meth:`~Acceptor.accept` raise
``AuthenticationError``, as in the standard library.
"""
from __future__ import annotations

import collections
import logging
import multiprocessing.connection as _stdlib
import os
import selectors
import socket
import threading
from typing import Any

from ..wire.gate import Check, Gate

log = logging.getLogger(__name__)


def listening_socket(address: Any, family: str, backlog: int) -> socket.socket:
    """A socket of ``family`` (``"AF_INET"``, ``"AF_INET6"``, ``"AF_UNIX"``) listening at
    ``address``."""
    sock = socket.socket(getattr(socket, family))
    try:
        if family != "AF_UNIX":
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind(address)
        sock.listen(backlog)
    except BaseException:
        sock.close()
        raise
    return sock


class _Challenge(Check):
    """One connection being challenged (cut off by the gate until the challenge is over)."""

    __slots__ = ("conn",)

    def __init__(self, conn: _stdlib.Connection) -> None:
        super().__init__(conn.fileno)
        self.conn = conn


class Acceptor:
    """Accepts on ``sock`` and challenges each peer with ``key``."""

    def __init__(self, sock: socket.socket, key: bytes, gate: Gate) -> None:
        self._sock = sock
        self._key = key
        self._gate = gate
        self._lock = threading.Lock()
        self._ready: collections.deque[tuple[_stdlib.Connection | None, Any, Exception | None]] = \
            collections.deque()
        self._wake_reader, self._wake_writer = socket.socketpair()
        self._closed = False
        self._accepting = 0   # threads in accept(): the last to leave after close() ends the waker
        sock.setblocking(False)

    def accept(self) -> tuple[_stdlib.Connection, Any]:
        """The next connection whose peer passed the challenge, and its address."""
        with self._lock:
            if self._closed:
                raise OSError("listener is closed")
            self._accepting += 1
        try:
            return self._next()
        finally:
            with self._lock:
                self._accepting -= 1
                last = self._closed and not self._accepting
            if last:
                self._close_waker()

    def _next(self) -> tuple[_stdlib.Connection, Any]:
        with selectors.DefaultSelector() as selector:
            selector.register(self._sock, selectors.EVENT_READ)
            selector.register(self._wake_reader, selectors.EVENT_READ)
            while True:
                with self._lock:
                    if self._closed:
                        raise OSError("listener is closed")
                    if self._ready:
                        conn, address, error = self._ready.popleft()
                        if error is not None:
                            raise error
                        return conn, address
                for key, _ in selector.select():
                    if key.fileobj is self._wake_reader:
                        self._wake_reader.recv(4096)
                    else:
                        self._take_one()

    def _take_one(self) -> None:
        try:
            sock, address = self._sock.accept()
        except (BlockingIOError, InterruptedError, ConnectionAbortedError):
            return   # another thread took it, or the peer left before it was accepted
        sock.setblocking(True)
        challenge = _Challenge(_stdlib.Connection(sock.detach()))
        self._gate.admit(challenge, challenge.cut)
        threading.Thread(target=self._challenge, args=(challenge, address), daemon=True,
                         name="fiberlite-listener-challenge").start()

    def _challenge(self, challenge: _Challenge, address: Any) -> None:
        conn = challenge.conn
        error: Exception | None = None
        try:
            _stdlib.deliver_challenge(conn, self._key)
            _stdlib.answer_challenge(conn, self._key)
        except _stdlib.AuthenticationError as exc:
            error = exc
        except (OSError, EOFError, AssertionError) as exc:   # reset, hung up, cut off, garbage
            log.debug("a connection from %s ended during its challenge: %r", address, exc)
            challenge.over()
            self._gate.forget(challenge)
            conn.close()
            return
        challenge.over()
        if not self._gate.passed(challenge) and error is None:
            conn.close()   # cut off at the deadline just as it answered
            return
        if error is not None:
            conn.close()
            conn = None
        with self._lock:
            if self._closed:
                if conn is not None:
                    conn.close()
                return
            self._ready.append((conn, address, error))
        self._wake()

    def _wake(self) -> None:
        try:
            self._wake_writer.send(b"\0")
        except OSError:
            pass

    def close(self) -> None:
        """Stop accepting; connections that passed but were not taken are closed, those
        still being challenged are closed when their challenge ends."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
            ready, self._ready = list(self._ready), collections.deque()
            idle = not self._accepting
        self._gate.close()
        for conn, _, _ in ready:
            if conn is not None:
                conn.close()
        self._sock.close()
        if idle:
            self._close_waker()
        else:
            self._wake()

    def _close_waker(self) -> None:
        self._wake_reader.close()
        self._wake_writer.close()


def unlink_quietly(path: Any) -> None:
    """Remove the file of a Unix socket at ``path`` (not an abstract one), if it exists."""
    if isinstance(path, str) and path and not path.startswith("\0"):
        try:
            os.unlink(path)
        except OSError:
            pass
