"""Direct calls: requests to a hub on plain TCP connections, read and written by the
threads that make and answer them.

An nng request crosses threads of nng's on both sides (the sender's, the receiver's,
then the waiting thread is woken), which costs a call several TCP round trips. The
calls that are most of a shared primitive's cost (a lock's acquire, an event's wait)
take this path instead when the hub's connections are plain TCP (TLS keeps nng):

- The job asks the hub, over its nng connection, for an *offer*: the address of the
  hub's :class:`DirectServer` and a ticket that names that nng connection. A direct
  connection proves the run's key at the server's door (:class:`~.doorman.Doorman`),
  then presents the ticket: its requests are then handled as the nng connection's
  (the same peer), so what the job holds is the same whichever path a call took.
- One request at a time on a connection (but for the call that withdraws an
  interrupted one): ``u32`` length + ``u32`` sequence number + the pickled envelope,
  each way (a reply carries its request's number; user objects travel as the
  :class:`~.codec.Payload` they are in, pickled by their sender). The calling thread sends and reads its reply itself; a process keeps a few
  connections per hub, one per thread calling at the same moment.
- The server's one thread reads every direct connection (a selector) and hands each
  request to the hub's handler, which may answer it later from any thread.
- When the nng connection ends, its direct connections are closed on the server's
  thread before the hub hears of the loss (:meth:`DirectServer.end_peer`), so that no
  request of a peer is handled after what it held was recovered.
"""
from __future__ import annotations

import collections
import logging
import secrets
import select
from pickle import dumps as _dumps, loads as _loads
import socket
import struct
import threading
import time
from typing import Any, Callable

from . import auth, codec
from .doorman import Doorman, listen_tcp
from .handover import TCP, no_delay

log = logging.getLogger(__name__)

LENGTH = struct.Struct("<I")
SEQ = struct.Struct("<I")
HEAD = struct.Struct("<II")  # length, sequence number
TICKET_BYTES = 16
READ_SIZE = 1 << 16
SEND_SECONDS = 30.0  # how long a reply may wait for room in its connection's buffer


def frame_bytes(message: Any, seq: int = 0) -> bytes:
    """``message`` framed for a direct connection: its length, ``seq``, its pickle."""
    body = _dumps(message, codec.PROTOCOL)
    return HEAD.pack(len(body) + 4, seq) + body


def _message(frame: bytes) -> Any:
    """The envelope of a frame (after its length)."""
    return _loads(memoryview(frame)[4:])


def split_frames(buffer: bytearray) -> list[bytes]:
    """The whole frames at the start of ``buffer`` (taken out of it)."""
    frames, start, size = [], 0, len(buffer)
    while size - start >= 4:
        (length,) = LENGTH.unpack_from(buffer, start)
        if size - start - 4 < length:
            break
        frames.append(bytes(buffer[start + 4:start + 4 + length]))
        start += 4 + length
    if start:
        del buffer[:start]
    return frames


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
            data = frame_bytes(value, self._seq)
        except Exception as exc:
            data = frame_bytes((False, TypeError(f"reply could not be pickled: {exc}")), self._seq)
        conn.send(data)


class _Served:
    """A proven direct connection on the server, and the peer it speaks for once its
    ticket came."""

    __slots__ = ("sock", "buffer", "peer", "_lock")

    def __init__(self, sock: socket.socket) -> None:
        self.sock = sock
        self.buffer = bytearray()
        self.peer: int | None = None
        self._lock = threading.Lock()

    def send(self, data: bytes) -> None:
        with self._lock:
            try:
                sent = self.sock.send(data, socket.MSG_DONTWAIT)
            except BlockingIOError:
                sent = 0
            except OSError:  # (closed: its peer went, or was given up)
                return
            if sent < len(data):  # (a large reply: it waits for room, for a while)
                self.sock.settimeout(SEND_SECONDS)
                try:
                    self.sock.sendall(memoryview(data)[sent:])
                except OSError:
                    pass
                finally:
                    self.sock.settimeout(None)


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
        listening, self.address = listen_tcp(host)
        self._poll = select.epoll()
        self._served: dict[int, _Served] = {}  # descriptor -> connection
        self._wake_r, self._wake_w = socket.socketpair()
        self._wake_r.setblocking(False)
        self._wake_w.setblocking(False)
        self._poll.register(self._wake_r.fileno(), select.EPOLLIN)
        self._door = Doorman(listening, key, None, None, f"direct calls at {self.address}",
                             hand_over=self._admit)
        self._thread = threading.Thread(target=self._serve, name="fiberlite-direct", daemon=True)
        self._thread.start()
        self._door.serve()

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
        """(the door's thread) A peer proved the key: its ticket is read on this server's thread."""
        with self._lock:
            if self._closed:
                sock.close()
                return
            self._arrived.append(sock)
        self._wake()

    def _wake(self) -> None:
        try:
            self._wake_w.send(b"x")
        except OSError:  # full (a wake-up is pending anyway) or closed
            pass

    def _serve(self) -> None:
        try:
            while not self._closed:
                wake, served = self._wake_r.fileno(), self._served
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
            while self._wake_r.recv(4096):
                pass
        except OSError:
            pass
        with self._lock:
            arrived, self._arrived = self._arrived, []
        for sock in arrived:
            no_delay(sock)
            self._served[sock.fileno()] = _Served(sock)
            self._poll.register(sock.fileno(), select.EPOLLIN)
        while self._ending:
            peer, then = self._ending.popleft()
            with self._lock:
                conns = self._conns.pop(peer, set())
            for conn in conns:
                self._drop(conn)
            try:
                then()
            except Exception:
                log.exception("reporting the loss of peer %s failed", peer)

    def _read(self, conn: _Served) -> None:
        try:
            chunk = conn.sock.recv(READ_SIZE, socket.MSG_DONTWAIT)
        except (BlockingIOError, InterruptedError):
            return
        except OSError:
            chunk = b""
        if not chunk:
            self._drop(conn)
            return
        if not conn.buffer and len(chunk) >= 4 and LENGTH.unpack_from(chunk, 0)[0] == len(chunk) - 4:
            frames = [chunk[4:]]  # (one whole request, as most reads bring)
        else:
            conn.buffer += chunk
            frames = split_frames(conn.buffer)
        for frame in frames:
            if conn.peer is None:
                if not self._take_ticket(conn, frame):
                    return
                continue
            try:
                (seq,) = SEQ.unpack_from(frame, 0)
                message = _message(frame)
            except Exception as exc:
                log.warning("undecodable direct request from peer %s: %s", conn.peer, exc)
                self._drop(conn)
                return
            try:
                self._handler(DirectRequest(conn, conn.peer, seq), message)
            except Exception:  # a handler bug must not stop the server
                log.exception("request handler failed")

    def _take_ticket(self, conn: _Served, ticket: bytes) -> bool:
        with self._lock:
            peer = self._tickets.get(ticket)
            if peer is not None:
                conn.peer = peer
                self._conns.setdefault(peer, set()).add(conn)
        if peer is None:  # (its nng connection ended meanwhile, or a forged ticket)
            self._drop(conn)
            return False
        conn.send(LENGTH.pack(0))  # taken: the caller's first request may go
        return True

    def _drop(self, conn: _Served) -> None:
        if self._served.pop(conn.sock.fileno(), None) is None:
            return
        try:
            self._poll.unregister(conn.sock.fileno())
        except (OSError, ValueError):
            pass
        with self._lock:
            if conn.peer is not None:
                self._conns.get(conn.peer, set()).discard(conn)
        try:
            conn.sock.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass
        conn.sock.close()

    def _shut(self) -> None:
        self._closed = True
        for conn in list(self._served.values()):
            self._drop(conn)
        self._poll.close()
        self._wake_r.close()
        self._wake_w.close()

    def close(self) -> None:
        """Stop: every direct connection closes (their callers fall back to nng)."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
        self._door.close()
        self._wake()
        if threading.current_thread() is not self._thread:
            self._thread.join(5)


# -- the caller's side ------------------------------------------------------------------------
class DirectConnection:
    """One direct connection to a hub, used by one thread at a time."""

    def __init__(self, address: str, ticket: bytes, key: bytes, timeout: float = 10.0) -> None:
        if not address.startswith(TCP):
            raise ValueError(f"not an address of direct calls: {address}")
        host, port = address[len(TCP):].rsplit(":", 1)
        self.broken = False
        self.seq = 0
        self._buffer = bytearray()
        self.sock = sock = socket.create_connection((host.strip("[]"), int(port)), timeout=timeout)
        try:
            no_delay(sock)
            auth.prove_on(sock, key, address, time.monotonic() + timeout)
            sock.settimeout(timeout)
            sock.sendall(LENGTH.pack(len(ticket)) + ticket)
            if self._frame() != b"":
                raise ConnectionError(f"{address} did not take this process's direct connection")
            sock.settimeout(None)
            self._poll = select.poll()
            self._poll.register(sock.fileno(), select.POLLIN)
        except BaseException:
            sock.close()
            raise

    def call(self, message: Any, slice_seconds: float | None) -> Any:
        """Send ``message`` (an envelope) and return the decoded reply ``(ok, value)``.
        ``slice_seconds``: the wait looks up at least that often, so that a signal's
        handler runs in it (the main thread). A request sent in part (a large one,
        interrupted) leaves the connection :attr:`broken`."""
        self.seq = seq = (self.seq + 1) & 0xFFFFFFFF
        data = frame_bytes(message, seq)
        sock = self.sock
        sent = sock.send(data)  # (interrupted, it sent nothing: the connection is as it was)
        if sent < len(data):
            try:
                sock.sendall(memoryview(data)[sent:])
            except BaseException:
                self.broken = True  # sent in part: only closing it ends the request
                raise
        return self.reply(seq, None if slice_seconds is None else int(slice_seconds * 1000))

    def reply(self, seq: int, slice_ms: int | None = None) -> Any:
        """The decoded reply to the request ``seq`` (those to earlier ones are dropped)."""
        while True:
            frame = self._frame(slice_ms)
            if SEQ.unpack_from(frame, 0)[0] == seq:
                return _message(frame)

    def _frame(self, slice_ms: int | None = None) -> bytes:
        buffer = self._buffer
        while True:
            if len(buffer) >= 4:
                (length,) = LENGTH.unpack_from(buffer, 0)
                if len(buffer) >= 4 + length:
                    frame = bytes(buffer[4:4 + length])
                    del buffer[:4 + length]
                    return frame
            if slice_ms is not None:  # a signal's handler runs between looks (its error is raised)
                poll = self._poll.poll
                while not poll(slice_ms):
                    pass
            chunk = self.sock.recv(READ_SIZE)
            if not chunk:
                raise ConnectionError("the direct connection was closed")
            if not buffer and len(chunk) >= 4 and LENGTH.unpack_from(chunk, 0)[0] == len(chunk) - 4:
                return chunk[4:]  # (one whole reply, as most reads bring)
            buffer += chunk

    def close(self) -> None:
        try:
            self.sock.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass
        self.sock.close()
