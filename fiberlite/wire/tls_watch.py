"""Connections to a TLS listener that never finish their TLS handshake are cut off.

With ``tls`` on, nng accepts connections itself (the door cannot front TLS: nng's
``socket://`` transport carries plain connections) and keeps one whose peer never
completes the TLS handshake for ever. A peer that completes it holds the run's
pre-shared key, and only then does nng make it a pipe. So a connection on a TLS
listening port that is not a pipe is one that has not proved the key. One thread per
process, while a TLS listener is open, looks at the process's own TCP connections now
and then (psutil) and shuts down those that have waited longer than ``auth_timeout``
or, beyond ``auth_pending_limit`` per listener, the oldest. A shut-down connection
fails inside nng, which closes it itself: its descriptor is never closed under nng.
"""
from __future__ import annotations

import logging
import threading
import time
import weakref
from typing import Callable

import pynng

from .gate import shut_down

log = logging.getLogger(__name__)

PERIOD = 1.0   # seconds between looks (at most; a quarter of the deadline if that is less)

Address = tuple[str, int]


class _Watched:
    """One TLS listener: its port and the remote addresses of its pipes."""

    def __init__(self, sock: pynng.Socket, port: int, timeout: float, limit: int) -> None:
        self.port = port
        self.timeout = timeout
        self.limit = limit
        self.pipes: dict[int, Address] = {}     # pipe id -> its peer's address
        self.waiting: dict[Address, float] = {}  # a connection that is no pipe -> first seen
        self.cut = 0
        self._lock = threading.Lock()
        sock.add_post_pipe_connect_cb(self._added)
        sock.add_post_pipe_remove_cb(self._removed)

    def _added(self, pipe: pynng.Pipe) -> None:   # (nng's thread)
        try:
            address = _address(pipe.remote_address)
        except pynng.NNGException:
            return
        with self._lock:
            self.pipes[pipe.id] = address

    def _removed(self, pipe: pynng.Pipe) -> None:   # (nng's thread)
        with self._lock:
            self.pipes.pop(pipe.id, None)

    def overdue(self, connections: dict[Address, int], now: float) -> list[tuple[int, Address]]:
        """The (descriptor, peer) of each connection to cut off now."""
        with self._lock:
            piped = set(self.pipes.values())
        waiting = {peer: fd for peer, fd in connections.items() if peer not in piped}
        self.waiting = {peer: self.waiting.get(peer, now) for peer in waiting}
        by_age = sorted(self.waiting, key=self.waiting.__getitem__)
        late = [peer for peer in by_age if now - self.waiting[peer] >= self.timeout]
        excess = by_age[:max(0, len(by_age) - self.limit)]
        return [(waiting[peer], peer) for peer in dict.fromkeys(late + excess)]


def _address(sockaddr) -> Address:
    text = str(sockaddr)   # pynng: "1.2.3.4:5678" or "[::1]:5678"
    host, port = text.rsplit(":", 1)
    return host.strip("[]"), int(port)


class _Watch:
    """The process's watching thread (one at most, while something is watched) and what
    it watches."""

    def __init__(self) -> None:
        self._watched: "weakref.WeakKeyDictionary[object, _Watched]" = weakref.WeakKeyDictionary()
        self._lock = threading.Lock()
        self._wake = threading.Event()
        self._thread: threading.Thread | None = None

    def add(self, owner: object, sock: pynng.Socket, port: int,
            timeout: float | None = None, limit: int | None = None) -> _Watched:
        if timeout is None or limit is None:
            from .. import config
            timeout = config.get("auth_timeout") if timeout is None else timeout
            limit = config.get("auth_pending_limit") if limit is None else limit
        watched = _Watched(sock, port, timeout, limit)
        with self._lock:
            self._watched[owner] = watched
            if self._thread is None:
                self._thread = threading.Thread(target=self._run, name="fiberlite-tls-watch",
                                                daemon=True)
                self._thread.start()
        self._wake.set()
        return watched

    def remove(self, owner: object) -> None:
        with self._lock:
            self._watched.pop(owner, None)
        self._wake.set()

    def _run(self) -> None:
        """Look now and then; end once nothing is watched (the next add starts another)."""
        while True:
            with self._lock:
                watched = list(self._watched.values())
                if not watched:
                    self._thread = None
                    return
            try:
                self._look(watched)
            except Exception:   # psutil failing must not end the watch
                log.exception("the TLS watch could not look at this process's connections")
            self._wake.wait(min([PERIOD] + [w.timeout / 4 for w in watched]))
            self._wake.clear()

    @staticmethod
    def _look(watched: list[_Watched]) -> None:
        import psutil   # here: a TLS listener's process only (its import costs a job's start)
        by_port: dict[int, dict[Address, int]] = {w.port: {} for w in watched}
        for conn in psutil.Process().net_connections(kind="tcp"):
            if (conn.status == psutil.CONN_ESTABLISHED and conn.raddr and conn.fd >= 0
                    and conn.laddr.port in by_port):
                by_port[conn.laddr.port][(conn.raddr.ip, conn.raddr.port)] = conn.fd
        now = time.monotonic()
        for w in watched:
            for fd, peer in w.overdue(by_port[w.port], now):
                if _shut_down(fd, w.port, peer):
                    w.cut += 1
                    if w.cut in (1, 100, 10_000):
                        log.warning("TLS listener on port %d: cut off a connection that had not "
                                    "completed the TLS handshake (it waited too long, or too "
                                    "many waited; %d so far)", w.port, w.cut)


def _shut_down(fd: int, port: int, peer: Address) -> bool:
    """Shut down the connection on ``fd`` if it still is the one from ``peer`` to ``port``
    (nng then closes it itself)."""
    return shut_down(fd, lambda sock: sock.getsockname()[1] == port
                     and sock.getpeername()[:2] == peer)


_watch = _Watch()


def watch(owner: object, sock: pynng.Socket, port: int, timeout: float | None = None,
          limit: int | None = None) -> Callable[[], None]:
    """Watch the TLS listener of ``sock`` on ``port`` for as long as ``owner`` lives (or
    until the returned function is called): connections that are not pipes after
    ``timeout`` seconds, or beyond ``limit`` of them, are cut off (settings
    ``auth_timeout`` and ``auth_pending_limit`` when None)."""
    _watch.add(owner, sock, port, timeout, limit)
    return lambda: _watch.remove(owner)
