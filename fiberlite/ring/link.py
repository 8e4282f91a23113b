"""Byte streams between ring neighbours: the bulk data of ring collectives.

A large all-reduce moves nearly all its bytes between ring neighbours. Sent as
messages, each byte would be pickled into an envelope, copied into an nng message
that nng zeroes first, zeroed and copied again into the receiver's message, and
handed from the receiving thread to the member's. A :class:`NeighbourLink` instead
keeps one TCP connection to each neighbour: arrays are written from their own memory
and read straight into where they belong, so the kernel's copies are the only ones.

Set-up: every member listens before the rendezvous, then dials its right neighbour
and accepts its left one. On each connection both ends prove they hold the run's key
with the wire's challenge-response (:mod:`fiberlite.wire.auth`) and the dialer names
its rank; connections that fail this are closed. The listener closes once the left
neighbour is in.

Transfers: a sending thread writes queued arrays to the right neighbour in order; a
receiving thread reads the next bytes from the left neighbour into the buffers queued
for them, in order. Each transfer gets a ticket; the member's thread waits for
tickets while it reduces what already arrived.

Ending: when the neighbour is gone, what is under way fails and so does everything
later (:class:`NeighbourLinkLost`). :meth:`NeighbourLink.abort` makes waits fail at
once but leaves the connections open (what is already queued is still sent: the
neighbour may need it to see what went wrong); :meth:`NeighbourLink.close` closes
them, after which the neighbours see them end. Members say why they stop before they
close, so neighbours hear the reason first.
"""
from __future__ import annotations

import collections
import logging
import queue
import socket
import struct
import threading
import time
from typing import Any, Callable

import numpy as np

from ..errors import AuthenticationError
from ..wire import auth
from ..wire.binding import bind_host
from ..wire.gate import Check, Gate

log = logging.getLogger(__name__)

HANDSHAKE_SECONDS = 10.0   # per connection, for the challenge-response and the rank
SAME_HOST_BUFFER = 256 << 10   # socket buffers between members on one host: the bytes in
                               # flight stay in the CPU's caches (the kernel doubles it)
BACKLOG = 16
HANDSHAKES_AT_ONCE = 16    # connections checked at the same time (see _accept)
_IDENT = struct.Struct("<8sqq")   # magic, rank of the dialer, world size
_IDENT_MAGIC = b"FLlink01"


class NeighbourLinkLost(ConnectionError):
    """The connection to neighbour ``rank`` ended or failed (or the link was aborted)."""

    def __init__(self, rank: int | None, why: str) -> None:
        super().__init__(f"the link to rank {rank} failed ({why})")
        self.rank = rank
        self.why = why


def _bind(host: str) -> tuple[str, socket.AddressFamily]:
    """Where to listen so that jobs reaching ``host`` reach the listener (as the hub)."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    return bind_host(host).strip("[]"), family


def _remaining(deadline: float | None) -> float | None:
    if deadline is None:
        return None
    left = deadline - time.monotonic()
    if left <= 0:
        raise TimeoutError
    return left


def _tune(sock: socket.socket, option: int, same_host: bool) -> None:
    """No Nagle delay; on one host, small socket buffers (``option``: ``SO_SNDBUF`` or
    ``SO_RCVBUF``). Between hosts the kernel sizes them for the network's latency."""
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    if same_host and SAME_HOST_BUFFER:
        sock.setsockopt(socket.SOL_SOCKET, option, SAME_HOST_BUFFER)


class _Transfers:
    """Buffers sent (or received) on one connection, in order, by one thread; each gets
    a ticket, and :meth:`wait` returns once that ticket's transfer is done."""

    def __init__(self, sock: socket.socket, receive: bool, peer: int, name: str) -> None:
        self.peer = peer
        self._sock = sock
        self._receive = receive
        self._cond = threading.Condition(threading.Lock())
        self._queue: collections.deque[memoryview] = collections.deque()
        self.issued = 0
        self.completed = 0
        self.error: str | None = None   # why the connection cannot be used any more
        self.aborted = False            # waits fail; a sender still sends what is queued
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)
        self._thread.start()

    def put(self, buffer: np.ndarray) -> int:
        """Queue ``buffer`` (contiguous; writable to receive into); its ticket."""
        if not buffer.flags.c_contiguous:
            raise ValueError("ring link transfers need contiguous arrays")
        view = memoryview(buffer.reshape(-1).view(np.uint8))
        with self._cond:
            self.issued += 1
            if self.error is None and not self.aborted:
                self._queue.append(view)
                self._cond.notify_all()
            return self.issued

    def _run(self) -> None:
        sock, receive, cond = self._sock, self._receive, self._cond
        while True:
            with cond:
                while not self._queue and self.error is None and not self.aborted:
                    cond.wait()
                if self.error is not None or not self._queue:
                    return
                view = self._queue[0]
            try:
                if receive:
                    done, size = 0, len(view)
                    while done < size:
                        n = sock.recv_into(view[done:], size - done, socket.MSG_WAITALL)
                        if not n:
                            raise ConnectionError("the connection ended")
                        done += n
                else:
                    sock.sendall(view)
            except OSError as exc:
                self._fail(str(exc) or type(exc).__name__)
                return
            finally:
                del view
            with cond:
                if self._queue:
                    self._queue.popleft()
                self.completed += 1
                cond.notify_all()

    def _fail(self, why: str) -> None:
        with self._cond:
            if self.error is None:
                self.error = why
            self._queue.clear()
            self._cond.notify_all()

    def wait(self, ticket: int, deadline: float | None) -> None:
        """Until transfer ``ticket`` is done; :class:`NeighbourLinkLost` if the connection
        failed (or the link was aborted) first, builtin ``TimeoutError`` after
        ``deadline`` (``time.monotonic``)."""
        with self._cond:
            while self.completed < ticket:
                if self.error is not None or self.aborted:
                    raise NeighbourLinkLost(self.peer, self.error or "the link was aborted")
                if deadline is None:
                    self._cond.wait()
                    continue
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    raise TimeoutError
                self._cond.wait(remaining)

    def abort(self) -> None:
        """Fail waits now. A receiver stops after the transfer under way; a sender still
        sends what is queued (a neighbour may need it to see what went wrong) until the
        connection closes."""
        with self._cond:
            self.aborted = True
            if self._receive:
                self._queue.clear()
            self._cond.notify_all()

    def join(self, timeout: float) -> None:
        self._thread.join(timeout)


class _Visitor(Check):
    """A connection being checked (cut off by the gate until its check is over)."""

    __slots__ = ("sock",)

    def __init__(self, sock: socket.socket) -> None:
        super().__init__(sock.fileno)
        self.sock = sock


class NeighbourLink:
    """This member's connections to its ring neighbours: :meth:`send` goes to the right
    neighbour (rank + 1), :meth:`receive` comes from the left one (rank - 1)."""

    def __init__(self, host: str) -> None:
        self._lock = threading.Lock()
        self._aborted = False
        self._closed = False
        self._sockets: list[socket.socket] = []
        self._out: _Transfers | None = None
        self._in: _Transfers | None = None
        self.left: int | None = None
        self.right: int | None = None
        bind, family = _bind(host.strip("[]"))
        self._accepting = False   # a thread is in _accept: it closes the listener
        self._listener: socket.socket | None = socket.create_server((bind, 0), family=family,
                                                                    backlog=BACKLOG)
        port = self._listener.getsockname()[1]
        self.address = f"tcp://{host}:{port}"

    def __repr__(self) -> str:
        return f"<NeighbourLink {self.address} left={self.left} right={self.right}>"

    # -- set-up ------------------------------------------------------------------------------
    def connect(self, rank: int, world_size: int, right_address: str, key: bytes,
                deadline: float | None = None, same_host: tuple[bool, bool] = (False, False)) -> None:
        """Dial the right neighbour at ``right_address`` and accept the left one, both
        authenticated; ``same_host``: whether the left and the right neighbour run on
        this host. Raises ``ConnectionError`` (or builtin ``TimeoutError``)."""
        self.left, self.right = (rank - 1) % world_size, (rank + 1) % world_size
        accepted: dict[str, Any] = {}

        def accept_left() -> None:
            try:
                accepted["socket"] = self._accept(world_size, key, deadline, same_host[0])
            except BaseException as exc:
                accepted["error"] = exc

        thread = threading.Thread(target=accept_left, name="fiberlite-ring-link-accept", daemon=True)
        thread.start()
        try:
            right = self._dial(right_address, rank, world_size, key, deadline, same_host[1])
        except BaseException:
            self._close_listener()   # the accepting thread stops too
            thread.join()
            raise
        thread.join()
        self._close_listener()
        if "error" in accepted:
            raise accepted["error"]
        left = accepted["socket"]
        with self._lock:
            if self._aborted:
                raise NeighbourLinkLost(None, "the link was aborted")
            self._out = _Transfers(right, False, self.right, "fiberlite-ring-link-send")
            self._in = _Transfers(left, True, self.left, "fiberlite-ring-link-receive")

    def _track(self, sock: socket.socket) -> socket.socket:
        with self._lock:
            if self._aborted:
                sock.close()
                raise NeighbourLinkLost(None, "the link was aborted")
            self._sockets.append(sock)
        return sock

    def _drop(self, sock: socket.socket) -> None:
        with self._lock:
            if sock in self._sockets:
                self._sockets.remove(sock)
        try:
            sock.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass
        sock.close()

    def _close_listener(self) -> None:
        """Stop listening (any thread): a thread blocked in accept returns.

        The socket is closed here, or, while a thread accepts on it, by that thread once
        its accept has returned: closed under a blocked accept, its descriptor could be
        reused by another socket and the accept would wait on that one instead."""
        with self._lock:
            listener, self._listener = self._listener, None
            accepting = self._accepting
        if listener is None:
            return
        try:
            listener.shutdown(socket.SHUT_RDWR)   # wakes a thread blocked in accept
        except OSError:
            pass
        if not accepting:
            listener.close()

    def _dial(self, address: str, rank: int, world_size: int, key: bytes,
              deadline: float | None, same_host: bool) -> socket.socket:
        host, port = address[len("tcp://"):].rsplit(":", 1)
        try:
            sock = self._track(socket.create_connection((host.strip("[]"), int(port)),
                                                        timeout=_remaining(deadline)))
        except OSError as exc:
            raise ConnectionError(f"cannot connect the ring link to rank {self.right} at "
                                  f"{address}: {exc}") from None
        shake = time.monotonic() + HANDSHAKE_SECONDS
        try:
            until = shake if deadline is None else min(deadline, shake)
            try:
                auth.prove_on(sock, key, f"rank {self.right} at {address}", until)
            except AuthenticationError as exc:
                raise ConnectionError(str(exc)) from None
            sock.settimeout(_remaining(until))
            sock.sendall(_IDENT.pack(_IDENT_MAGIC, rank, world_size))
            sock.settimeout(None)
            _tune(sock, socket.SO_SNDBUF, same_host)
        except BaseException as exc:
            self._drop(sock)   # the other end stops waiting for this handshake
            if isinstance(exc, OSError) and not isinstance(exc, ConnectionError):
                raise ConnectionError(f"the ring link to rank {self.right} failed during its "
                                      f"handshake: {exc}") from None
            raise
        return sock

    def _accept(self, world_size: int, key: bytes, deadline: float | None,
                same_host: bool) -> socket.socket:
        """The left neighbour's connection, once it authenticated; others are closed.

        Each connection is checked on a thread of its own, so one that never speaks
        does not hold up the neighbour behind it. The checks are under a
        :class:`~fiberlite.wire.gate.Gate`: a connection is cut off after
        :data:`HANDSHAKE_SECONDS`, and at most :data:`HANDSHAKES_AT_ONCE` are checked at
        once (to make room, the one that has shown least is cut off first)."""
        passed: queue.SimpleQueue[socket.socket] = queue.SimpleQueue()
        gate = Gate(HANDSHAKE_SECONDS, HANDSHAKES_AT_ONCE, f"the ring link at {self.address}")

        def check(visitor: _Visitor) -> None:
            try:
                why = self._check_dialer(visitor.sock, world_size, key, lambda: gate.started(visitor))
            except Exception as exc:   # never leave a connection unanswered on a dead thread
                why = f"broke its check ({type(exc).__name__}: {exc})"
            visitor.over()
            if why is None and gate.passed(visitor):
                passed.put(visitor.sock)
                self._close_listener()   # wakes the accept below
                return
            gate.forget(visitor)
            if why is not None:
                log.warning("ring link: closed a connection that %s", why)
            self._drop(visitor.sock)

        with self._lock:
            listener = self._listener
            if listener is None:
                raise ConnectionError("the ring link stopped listening before the left neighbour connected")
            self._accepting = True
        try:
            return self._accept_on(listener, passed, gate, check, deadline, same_host)
        finally:
            gate.close()
            with self._lock:
                self._accepting = False
                stopped = self._listener is None
            if stopped:
                listener.close()

    def _accept_on(self, listener: socket.socket, passed: queue.SimpleQueue, gate: Gate,
                   check: Callable[["_Visitor"], None], deadline: float | None,
                   same_host: bool) -> socket.socket:
        """The accept loop of :meth:`_accept`: each connection to ``check`` on a thread."""
        while passed.empty() and self._listener is not None:
            try:
                listener.settimeout(_remaining(deadline))
                sock, _ = listener.accept()
            except TimeoutError:
                raise TimeoutError(f"rank {self.left} did not connect its ring link in time") from None
            except OSError as exc:
                if not passed.empty():
                    break
                raise ConnectionError(f"no ring link from rank {self.left}: {exc}") from None
            self._track(sock)
            visitor = _Visitor(sock)
            gate.admit(visitor, visitor.cut)
            threading.Thread(target=check, args=(visitor,), name="fiberlite-ring-link-handshake",
                             daemon=True).start()
        try:
            sock = passed.get_nowait()
        except queue.Empty:
            raise ConnectionError("the ring link stopped listening before the left neighbour connected") from None
        sock.settimeout(None)
        _tune(sock, socket.SO_RCVBUF, same_host)
        return sock

    def _check_dialer(self, sock: socket.socket, world_size: int, key: bytes,
                      started: Callable[[], None]) -> str | None:
        """Run the server side of the handshake; None when the peer is the left neighbour."""
        try:
            until = time.monotonic() + HANDSHAKE_SECONDS
            if not auth.check_on(sock, key, until, started):
                return "did not prove it holds the run's key"
            ident = auth.read_exact(sock, _IDENT.size, until)
            if len(ident) < _IDENT.size:
                return "ended before naming its rank"
            magic, rank, size = _IDENT.unpack(ident)
        except OSError as exc:
            return f"failed the handshake ({exc or type(exc).__name__})"
        if magic != _IDENT_MAGIC or rank != self.left or size != world_size:
            return f"is not rank {self.left} of this ring"
        return None

    # -- transfers ------------------------------------------------------------------------------
    def send(self, data: np.ndarray) -> int:
        """Queue ``data`` (contiguous, left unchanged until sent) for the right
        neighbour; its ticket for :meth:`wait_sent`."""
        return self._out.put(data)

    def receive(self, into: np.ndarray) -> int:
        """Queue a receive of the next ``into.nbytes`` bytes from the left neighbour into
        ``into`` (contiguous, writable); its ticket for :meth:`wait_received`."""
        return self._in.put(into)

    def wait_sent(self, ticket: int, deadline: float | None = None) -> None:
        self._out.wait(ticket, deadline)

    def wait_received(self, ticket: int, deadline: float | None = None) -> None:
        self._in.wait(ticket, deadline)

    # -- ending ---------------------------------------------------------------------------------
    def abort(self) -> None:
        """Make waits fail now, and every later transfer (any thread). The connections
        stay open until :meth:`close`: neighbours learn why from the ring first."""
        with self._lock:
            if self._aborted:
                return
            self._aborted = True
            transfers = [t for t in (self._out, self._in) if t is not None]
            connecting = [] if transfers else list(self._sockets)
        for t in transfers:
            t.abort()
        self._close_listener()   # a connect under way stops
        for sock in connecting:
            try:
                sock.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass

    def close(self) -> None:
        """Close the connections (what was sent is still delivered) and stop the threads."""
        self._close_listener()
        with self._lock:
            if self._closed:
                return
            self._closed = self._aborted = True
            sockets, self._sockets = self._sockets, []
            transfers = [t for t in (self._out, self._in) if t is not None]
        for t in transfers:
            t.abort()
        for sock in sockets:
            try:
                sock.shutdown(socket.SHUT_RDWR)   # wakes the threads blocked on it
            except OSError:
                pass
            sock.close()
        for t in transfers:
            t.join(5)
