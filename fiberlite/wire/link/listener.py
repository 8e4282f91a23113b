"""A listening stream socket that serves many peers, each over a link of its own.

Each connection proves the run's key (:func:`~fiberlite.wire.auth.check_on`) on a thread
of its own, under a :class:`~fiberlite.wire.gate.Gate` (a deadline, and a bound on the
connections that have not proved it yet): nothing is read from a peer before. A proven
connection is handed to ``serve(sock)`` on that same thread, which makes it a link of its
flavour (:meth:`~.stream.StreamLink.over`); :meth:`Listener.close` stops listening and shuts
down every connection still served, which ends the link on it. A listener that
``hands_over`` its connections only passes each one on (``serve`` queues it for another
thread): from then on it is that thread's, and :meth:`Listener.close` leaves it alone,
even while ``serve`` has not returned yet.
"""
from __future__ import annotations

import socket
import threading
import time
from typing import Callable

from .. import auth, tcp, unix
from ..gate import Check, Gate

HANDSHAKE_SECONDS = 10.0
UNPROVEN_AT_ONCE = 64  # connections that have not proved the key yet, at most
BACKLOG = 128
ABSTRACT = "abstract://"


class Listener:
    """Calls ``serve(sock)`` for every peer that proves ``key``, a thread per connection
    (``hands_over``: ``serve`` takes the connection over, see the module's doc)."""

    def __init__(self, listening: socket.socket, address: str, key: bytes,
                 serve: Callable[[socket.socket], None], where: str, *,
                 limit: int = UNPROVEN_AT_ONCE, timeout: float = HANDSHAKE_SECONDS,
                 hands_over: bool = False) -> None:
        self.address = address
        self._hands_over = hands_over
        self._listening: socket.socket | None = listening
        self._key = key
        self._serve = serve
        self._where = where
        self._lock = threading.Lock()
        self._served: set[socket.socket] = set()
        self._checking: set[Check] = set()  # connections proving the key now
        self._closed = False
        self._timeout = timeout
        self._gate = Gate(timeout, limit, where)
        threading.Thread(target=self._accept, args=(listening,), daemon=True,
                         name="fiberlite-link-accept").start()

    @classmethod
    def tcp(cls, host: str, key: bytes, serve: Callable[[socket.socket], None], where: str,
            **options) -> "Listener":
        """Listening on TCP for peers that reach this process at ``host``."""
        listening, port = tcp.listen(host, BACKLOG)
        return cls(listening, tcp.address(host, port), key, serve, where, **options)

    @classmethod
    def abstract(cls, what: str, key: bytes, serve: Callable[[socket.socket], None], where: str,
                 **options) -> "Listener":
        """Listening on a fresh abstract Unix name (``OSError`` where there are none)."""
        listening, name = unix.listen_abstract(what, BACKLOG)
        return cls(listening, ABSTRACT + name, key, serve, where, **options)

    @property
    def connections(self) -> int:
        """Connections proved and served now."""
        with self._lock:
            return len(self._served)

    def _accept(self, listening: socket.socket) -> None:
        try:
            while True:
                try:
                    sock, _ = listening.accept()
                except OSError:
                    return  # closed
                tcp.nodelay(sock)
                check = Check(sock.fileno)
                with self._lock:
                    self._checking.add(check)
                self._gate.admit(check, check.cut)
                threading.Thread(target=self._check, args=(sock, check), daemon=True,
                                 name=f"{self._where}-connection").start()
        finally:
            listening.close()  # here, once accept returned: never under a blocked accept

    def _check(self, sock: socket.socket, check: Check) -> None:
        proved = auth.check_on(sock, self._key, time.monotonic() + self._timeout,
                               lambda: self._gate.started(check))
        check.over()
        with self._lock:
            self._checking.discard(check)
        if not self._gate.passed(check) or not proved:
            sock.close()
            return
        sock.settimeout(None)
        with self._lock:
            if self._closed:
                sock.close()
                return
            kept = not self._hands_over  # (a connection handed over is its new owner's to end)
            if kept:
                self._served.add(sock)
        try:
            self._serve(sock)
        finally:
            if kept:
                with self._lock:
                    self._served.discard(sock)

    def close(self) -> None:
        """Stop listening, cut off the connections still proving the key and shut down
        every connection still served (the link on it ends for the thread in ``serve``)."""
        with self._lock:
            self._closed = True
            served, self._served = list(self._served), set()
            checking = list(self._checking)
            listening, self._listening = self._listening, None
        self._gate.close()
        if listening is not None:
            try:
                listening.shutdown(socket.SHUT_RDWR)  # wakes the accepting thread, which closes it
            except OSError:
                pass
        for check in checking:
            check.cut()
        for sock in served:
            try:
                sock.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
