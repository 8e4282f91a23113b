"""Connections that have not proved the run's key yet: a deadline and a bound.

Every listening socket admits a new connection here and reports when it passes the
handshake of :mod:`fiberlite.wire.auth` (or ends). A connection still waiting after
``timeout`` seconds is closed, and at most ``limit`` wait at once: when one more
arrives, the waiting connection that has shown least (one that has sent nothing
before one that started the handshake), the oldest first, is closed to make room.
So a flood of silent connections costs a bounded number of descriptors and never
keeps out a peer that does the handshake promptly.
"""
from __future__ import annotations

import itertools
import logging
import socket
import threading
import time
from typing import Callable, Hashable

from . import threads

log = logging.getLogger(__name__)


class _Waiting:
    __slots__ = ("close", "started", "order", "deadline")

    def __init__(self, close: Callable[[], None], order: int, deadline: float) -> None:
        self.close = close
        self.started = False   # the peer sent the first step of the handshake
        self.order = order
        self.deadline = deadline


class Gate:
    """The unauthenticated connections of one listening socket, each known by an id.

    Deadlines are met by one thread of the gate's own, running only while some
    connection waits (all share one timeout, so the oldest is always due first)."""

    def __init__(self, timeout: float, limit: int, where: str) -> None:
        threads.prepare()  # a connection may come while this process exits
        self.timeout = timeout
        self.limit = limit
        self.where = where
        self._cond = threading.Condition(threading.Lock())
        self._waiting: dict[Hashable, _Waiting] = {}
        self._order = itertools.count()
        self._watching = False
        self._closed = False
        self.closed_late = 0      # connections closed at the deadline
        self.closed_for_room = 0  # connections closed to keep the bound

    def admit(self, conn: Hashable, close: Callable[[], None]) -> None:
        """A new connection ``conn``; ``close()`` ends it (must not block, any thread)."""
        waiting = _Waiting(close, next(self._order), time.monotonic() + self.timeout)
        with self._cond:
            if self._closed:  # its listening socket is closing
                evicted = [waiting]
            else:
                self._waiting[conn] = waiting
                evicted = self._admit_more()
        for victim in evicted:
            victim.close()

    def close(self) -> None:
        """The listening socket is closing (its owner closes its own connections): forget
        the waiting ones and end the deadline thread."""
        with self._cond:
            self._closed = True
            self._waiting.clear()
            self._cond.notify_all()

    def _admit_more(self) -> list[_Waiting]:
        """(the lock held) Make room under the bound; start the deadline thread."""
        evicted = self._make_room()
        if not self._watching:
            self._watching = True
            threads.start(self._watch, name="fiberlite-auth-deadline")
        return evicted

    def started(self, conn: Hashable) -> None:
        """``conn`` sent the first step of the handshake."""
        with self._cond:
            waiting = self._waiting.get(conn)
            if waiting is not None:
                waiting.started = True

    def passed(self, conn: Hashable) -> bool:
        """``conn`` proved the key: it no longer counts. False if it was closed meanwhile
        (the deadline or the bound ended it first)."""
        with self._cond:
            return self._waiting.pop(conn, None) is not None

    forget = passed  # the connection ended before it proved the key

    def has_room(self) -> bool:
        """Whether one more connection can be admitted without cutting off one that has
        started the handshake (one that has sent nothing may be cut off for it)."""
        with self._cond:
            return len(self._waiting) < self.limit or not all(w.started for w in self._waiting.values())

    def __len__(self) -> int:
        with self._cond:
            return len(self._waiting)

    def _make_room(self) -> list[_Waiting]:
        excess = len(self._waiting) - self.limit
        if excess <= 0:
            return []
        victims = sorted(self._waiting.items(), key=lambda item: (item[1].started, item[1].order))[:excess]
        for conn, _ in victims:
            del self._waiting[conn]
        self.closed_for_room += len(victims)
        if self.closed_for_room in (1, 100, 10_000):
            log.warning("%s: more than %d connections have not authenticated; the least advanced "
                        "are closed (%d so far): someone is connecting without the run's key",
                        self.where, self.limit, self.closed_for_room)
        return [waiting for _, waiting in victims]

    def _watch(self) -> None:
        while True:
            with self._cond:
                if not self._waiting:
                    self._watching = False
                    return
                conn, oldest = next(iter(self._waiting.items()))
                late = oldest.deadline - time.monotonic()
                if late > 0:
                    self._cond.wait(late)
                    continue
                del self._waiting[conn]
                self.closed_late += 1
            log.info("%s: a connection did not authenticate within %g s; closed", self.where, self.timeout)
            oldest.close()


class Check:
    """A connection under check on a thread of its own: :meth:`cut` (the close given to
    :meth:`Gate.admit`) shuts it down from any thread, which wakes the checking thread,
    until that thread says the check is :meth:`over` (then it owns the descriptor alone)."""

    __slots__ = ("fileno", "_lock", "_over")

    def __init__(self, fileno: Callable[[], int]) -> None:
        self.fileno = fileno
        self._lock = threading.Lock()
        self._over = False

    def cut(self) -> None:
        with self._lock:
            fd = self.fileno()
            if self._over or fd < 0:   # (closed by its owner meanwhile)
                return
            shut_down(fd)

    def over(self) -> None:
        with self._lock:
            self._over = True


def shut_down(fd: int, still_it: Callable[[socket.socket], bool] | None = None) -> bool:
    """Shut down the connection on descriptor ``fd`` (whoever owns it then sees it end
    and closes it; the descriptor itself is never closed here), if ``still_it(sock)``
    says it is still the connection meant. Whether it was shut down."""
    try:
        sock = socket.socket(fileno=fd)
    except OSError:
        return False
    try:
        if still_it is not None and not still_it(sock):
            return False
        sock.shutdown(socket.SHUT_RDWR)
        return True
    except OSError:
        return False
    finally:
        sock.detach()
