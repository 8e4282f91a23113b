"""Direct calls: requests to a hub on TCP links, read and written by the threads that
make and answer them.

An nng request crosses threads of nng's on both sides (the sender's, the receiver's,
then the waiting thread is woken), which costs a call several TCP round trips. The
calls that are most of a shared primitive's cost (a lock's acquire, an event's wait)
take this path instead when the hub's connections are plain TCP (TLS keeps nng):

- The job asks the hub, over its nng connection, for an *offer*: the address of the
  hub's :class:`DirectServer` and a ticket that names that nng connection. A direct
  connection is a TCP link (:mod:`.link.tcp`): it proves the run's key at the server's
  :class:`~.link.listener.Listener`, then sends the ticket as its first frame: its
  requests are then handled as the nng connection's (the same peer), so what the job
  holds is the same whichever path a call took.
- One request at a time on a connection (but for the call that withdraws an
  interrupted one): each request and each reply is one frame of the link, the pickled
  ``(sequence number, after, envelope)`` (a reply is ``(sequence number, answer)``, the
  number its request's; user objects travel as the :class:`~.codec.Payload` they are
  in, pickled by their sender). The calling thread sends and reads its reply itself; a
  process keeps a few connections per hub, one per thread calling at the same moment.
- A *one-way* request (sequence number 0) is answered by nobody: its ``after`` is its
  own number among the process's one-way requests to this hub (1, 2, ...). Every
  request's ``after`` is the number of the last one-way request the process had sent
  when it sent it: the server handles a process's one-way requests in their order and
  keeps a request back (with whatever follows it on its connection) until those before
  it are handled, whichever connection they came on (:mod:`.oneway` says who waits for
  them). A request with no envelope (None) is answered at once, once its turn comes:
  it tells the caller that what it sent before is handled.
- The server's one thread reads every direct connection (a selector over the links'
  sockets) and hands each request to the hub's handler, which may answer it later from
  any thread.
- When the nng connection ends, its direct connections are closed on the server's
  thread before the hub hears of the loss (:meth:`DirectServer.end_peer`), so that no
  request of a peer is handled after what it held was recovered.
"""
from __future__ import annotations

import collections
import logging
import os
import secrets
import select
import socket
import threading
from pickle import dumps as _dumps, loads as _loads
from typing import Any, Callable

from . import codec, tcp
from .link import LinkError, StreamLink
from .link.listener import Listener
from .link.tcp import TcpLink

log = logging.getLogger(__name__)

TICKET_BYTES = 16
TAKEN = b""  # the server's answer to a ticket it took: the caller's first request may go
SEND_MS = 30_000  # how long a reply may wait for room in its connection's buffer
WHOLE_AT_ONCE = 16 * 1024  # a request this small leaves in one system call, or not at all


def _encode(seq: int, message: Any) -> bytes:
    return _dumps((seq, message), codec.PROTOCOL)


def _encode_request(seq: int, after: int, message: Any) -> bytes:
    return _dumps((seq, after, message), codec.PROTOCOL)


# -- the hub's side ---------------------------------------------------------------------------
class DirectRequest:
    """One request of a direct connection, answered once with :meth:`reply` or :meth:`fail`."""

    __slots__ = ("_conn", "peer", "_seq")

    def __init__(self, conn: "_Served", peer: int, seq: int) -> None:
        self._conn: _Served | None = conn
        self.peer = peer
        self._seq = seq

    def reply(self, value: Any = None) -> None:
        self._answer((True, value))

    def fail(self, exc: BaseException) -> None:
        self._answer((False, exc))

    def _answer(self, value: tuple) -> None:
        conn, self._conn = self._conn, None
        if conn is None:
            raise RuntimeError("request answered twice")
        try:
            data = _encode(self._seq, value)
        except Exception as exc:
            data = _encode(self._seq, (False, TypeError(f"reply could not be pickled: {exc}")))
        conn.send(data)


class _OneWay:
    """The request object of a one-way request: its answer goes nowhere (a failure is logged)."""

    __slots__ = ("peer",)

    def __init__(self, peer: int) -> None:
        self.peer = peer

    def reply(self, value: Any = None) -> None:
        pass

    def fail(self, exc: BaseException) -> None:
        log.warning("a one-way request of peer %s failed: %r", self.peer, exc)


class _Served:
    """A proven direct connection on the server, and the peer it speaks for once its
    ticket came. Replies come from any thread, one at a time. ``held``: its requests
    kept back until one-way requests of its peer on other connections are handled."""

    __slots__ = ("link", "peer", "_lock", "held")

    def __init__(self, link: StreamLink) -> None:
        self.link = link
        link.settles = False  # (a reply waits for nothing this process sent elsewhere)
        self.peer: int | None = None
        self._lock = threading.Lock()
        self.held: collections.deque[tuple[int, int, Any]] = collections.deque()

    def send(self, data: bytes) -> None:
        with self._lock:  # at once (the rest of a large one on its own), else for a while
            if not self.link.send(data, 0):
                self.link.send(data, SEND_MS)


class DirectServer:
    """Direct connections to a hub, listening on ``host``; ``handler(request, message)``
    as :class:`~.server.Server`'s (on this server's thread; it must not block)."""

    def __init__(self, key: bytes, host: str, handler: Callable[[Any, Any], None]) -> None:
        self._handler = handler
        self._tickets: dict[bytes, int] = {}     # ticket -> the peer it names
        self._of_peer: dict[int, bytes] = {}
        self._conns: dict[int, set[_Served]] = {}  # peer -> its connections
        self._lock = threading.Lock()
        self._arrived: list[socket.socket] = []
        self._ending: collections.deque[tuple[int, Callable[[], None]]] = collections.deque()
        self._closed = False
        self._poll = select.epoll()
        self._served: dict[int, _Served] = {}  # descriptor -> connection
        self._one_way_done: dict[int, int] = {}  # peer -> its one-way requests handled
        self._holding: dict[int, set[_Served]] = {}  # peer -> its connections with requests held
        self._wake_fd = os.eventfd(0, os.EFD_NONBLOCK | os.EFD_CLOEXEC)
        self._poll.register(self._wake_fd, select.EPOLLIN)
        self._listener = Listener.tcp(host, key, self._admit, "fiberlite-direct")
        self.address = self._listener.address
        self._thread = threading.Thread(target=self._serve, name="fiberlite-direct", daemon=True)
        self._thread.start()

    def offer(self, peer: int) -> tuple[str, bytes]:
        """``(address, ticket)``: how the peer ``peer`` of the hub's nng server calls here."""
        with self._lock:
            ticket = self._of_peer.get(peer)
            if ticket is None:
                ticket = self._of_peer[peer] = secrets.token_bytes(TICKET_BYTES)
                self._tickets[ticket] = peer
        return self.address, ticket

    def end_peer(self, peer: int, then: Callable[[], None]) -> bool:
        """The nng connection of ``peer`` ended: close its direct connections on this
        server's thread, then call ``then()`` there. False (nothing done): the peer never
        took an offer."""
        with self._lock:
            ticket = self._of_peer.pop(peer, None)
            if ticket is None or self._closed:
                return False
            del self._tickets[ticket]
            self._ending.append((peer, then))
        self._wake()
        return True

    def _admit(self, sock: socket.socket) -> None:
        """(the listener's thread) A peer proved the key: its ticket is read on this
        server's thread."""
        with self._lock:
            if self._closed:
                sock.close()
                return
            self._arrived.append(sock)
        self._wake()

    def _wake(self) -> None:
        try:
            os.eventfd_write(self._wake_fd, 1)
        except OSError:  # (cannot be full)
            pass

    def _serve(self) -> None:
        try:
            while not self._closed:
                wake, served = self._wake_fd, self._served
                for fd, _ in self._poll.poll():
                    conn = served.get(fd)
                    if conn is not None:
                        self._read(conn)
                    elif fd == wake:
                        self._woken()
        except Exception:
            if not self._closed:
                log.exception("direct calls at %s failed; calls go through nng", self.address)
        finally:
            self._shut()

    def _woken(self) -> None:
        try:
            os.eventfd_read(self._wake_fd)
        except OSError:
            pass
        with self._lock:
            arrived, self._arrived = self._arrived, []
        for sock in arrived:
            conn = _Served(StreamLink.over(sock, "a direct caller", None))
            self._served[sock.fileno()] = conn
            self._poll.register(sock.fileno(), select.EPOLLIN)
        while self._ending:
            peer, then = self._ending.popleft()
            with self._lock:
                conns = self._conns.pop(peer, set())
            for conn in conns:
                self._drop(conn)
            self._one_way_done.pop(peer, None)
            self._holding.pop(peer, None)
            try:
                then()
            except Exception:
                log.exception("reporting the loss of peer %s failed", peer)

    def _read(self, conn: _Served) -> None:
        """Handle every request that has arrived on ``conn`` (in turn: see the module's
        doc); drop it once its peer is gone."""
        link = conn.link
        frames = link.recv_ready()
        if not frames and link.lost:
            self._drop(conn)
        one_way = False
        for frame in frames:
            if conn.peer is None:
                if not self._take_ticket(conn, frame):
                    return
                continue
            try:
                seq, after, message = _loads(frame)
            except Exception as exc:
                log.warning("undecodable direct request from peer %s: %s", conn.peer, exc)
                self._drop(conn)
                return
            if conn.held or not self._in_turn(conn.peer, seq, after):
                conn.held.append((seq, after, message))
                self._holding.setdefault(conn.peer, set()).add(conn)
                continue
            self._run(conn, seq, after, message)
            one_way = one_way or not seq
        if one_way and conn.peer in self._holding:
            self._run_held(conn.peer)

    def _in_turn(self, peer: int, seq: int, after: int) -> bool:
        """Whether a request may be handled now: the one-way requests before it are."""
        return self._one_way_done.get(peer, 0) >= (after if seq else after - 1)

    def _run(self, conn: _Served, seq: int, after: int, message: Any) -> None:
        if not seq:
            if after <= self._one_way_done.get(conn.peer, 0):
                return  # sent again by a caller that did not know whether it went
            self._one_way_done[conn.peer] = after
            request: Any = _OneWay(conn.peer)
        elif message is None:  # (what the caller sent before is handled)
            conn.send(_encode(seq, (True, None)))
            return
        else:
            request = DirectRequest(conn, conn.peer, seq)
        try:
            self._handler(request, message)
        except Exception:  # a handler bug must not stop the server
            log.exception("request handler failed")

    def _run_held(self, peer: int) -> None:
        """Handle the requests of ``peer`` held back whose turn has come."""
        progress = True
        while progress:
            progress = False
            for conn in list(self._holding.get(peer, ())):
                held = conn.held
                while held and self._in_turn(peer, held[0][0], held[0][1]):
                    self._run(conn, *held.popleft())
                    progress = True
                if not held:
                    self._holding.get(peer, set()).discard(conn)
        if not self._holding.get(peer, True):
            del self._holding[peer]

    def _take_ticket(self, conn: _Served, ticket: bytes) -> bool:
        with self._lock:
            peer = self._tickets.get(bytes(ticket))
            if peer is not None:
                conn.peer = peer
                self._conns.setdefault(peer, set()).add(conn)
        if peer is None:  # (its nng connection ended meanwhile, or a forged ticket)
            self._drop(conn)
            return False
        conn.send(TAKEN)
        return True

    def _drop(self, conn: _Served) -> None:
        fd = conn.link.fileno()
        if self._served.pop(fd, None) is None:
            return
        try:
            self._poll.unregister(fd)
        except (OSError, ValueError):
            pass
        with self._lock:
            if conn.peer is not None:
                self._conns.get(conn.peer, set()).discard(conn)
        if conn.held:
            conn.held.clear()
            self._holding.get(conn.peer, set()).discard(conn)
        conn.link.close()  # (its descriptor closes with the last reference to it)

    def _shut(self) -> None:
        self._closed = True
        for conn in list(self._served.values()):
            self._drop(conn)
        self._poll.close()

    def close(self) -> None:
        """Stop: every direct connection closes (their callers fall back to nng)."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
            arrived, self._arrived = self._arrived, []
        self._listener.close()
        for sock in arrived:
            sock.close()
        self._wake()
        if threading.current_thread() is not self._thread:
            self._thread.join(5)
        if not self._thread.is_alive():  # (nobody wakes it once closed: _admit and end_peer look first)
            os.close(self._wake_fd)
            self._wake_fd = -1


# -- the caller's side ------------------------------------------------------------------------
class DirectConnection:
    """One direct connection to a hub, used by one thread at a time."""

    def __init__(self, address: str, ticket: bytes, key: bytes, timeout: float = 10.0) -> None:
        if not address.startswith(tcp.SCHEME):
            raise ValueError(f"not an address of direct calls: {address}")
        self.broken = False
        self.seq = 0
        self.link = link = TcpLink.dial(address, key, None, timeout)
        link.awake = False  # (the hub runs Python before it answers: a CPU is better left to it)
        link.settles = False  # (the calls on it are what settling waits for)
        try:
            if not link.send(ticket, int(timeout * 1000)) or link.recv(int(timeout * 1000)) != TAKEN:
                raise ConnectionError(f"{address} did not take this process's direct connection")
        except LinkError:
            link.close()
            raise ConnectionError(f"{address} did not take this process's direct connection") from None
        except BaseException:
            link.close()
            raise

    def call(self, message: Any, after: int = 0) -> Any:
        """Send ``message`` (an envelope; None: a call that only waits for its turn) and
        return the decoded reply ``(ok, value)``; it is handled after the process's one-way
        request number ``after``.
        The wait is the link's blocking receive, which wakes every few milliseconds
        (:data:`~.link.stream.CANCEL_CHECK_US`), so that a signal's handler runs in it
        (the main thread). A large request interrupted while it leaves leaves the
        connection :attr:`broken` (only closing it ends the request)."""
        return self.reply(self.request(message, after))

    def request(self, message: Any, after: int = 0) -> int:
        """Send ``message`` as :meth:`call` does, and return its number (its reply is read
        with :meth:`reply` or :meth:`replies`)."""
        self.seq = seq = (self.seq & 0xFFFFFFFF) + 1
        data = _encode_request(seq, after, message)
        try:
            sent = self.link.send(data, -1)
        except BaseException:
            self.broken = len(data) > WHOLE_AT_ONCE  # (a small one went whole, or not at all)
            raise
        if not sent:
            raise ConnectionError("the direct connection was closed")
        return seq

    def post(self, message: Any, number: int) -> bool:
        """Send ``message`` as the process's one-way request ``number`` to this hub;
        False if it did not go (the connection is gone)."""
        try:
            return self.link.send(_encode_request(0, number, message), -1)
        except BaseException:
            self.broken = True  # (whether it went is not known)
            raise

    def reply(self, seq: int) -> Any:
        """The decoded reply to the request ``seq`` (those to earlier ones are dropped)."""
        return self.replies(seq)[seq]

    def replies(self, seq: int) -> dict[int, Any]:
        """The decoded replies that come up to the one to the request ``seq``, by number."""
        got: dict[int, Any] = {}
        while seq not in got:
            try:
                frame = self.link.recv(-1)
            except LinkError:
                raise ConnectionError("the direct connection was closed") from None
            number, reply = _loads(frame)
            got[number] = reply
        return got

    def close(self) -> None:
        self.link.close()
