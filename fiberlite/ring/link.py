"""Byte streams between ring neighbours: the bulk data of ring collectives.

A large all-reduce moves nearly all its bytes between ring neighbours. Sent as
messages, each byte would be pickled into an envelope, copied into an nng message
that nng zeroes first, zeroed and copied again into the receiver's message, and
handed from the receiving thread to the member's. A :class:`NeighbourLink` instead
keeps a TCP link of the wire's (:class:`~fiberlite.wire.link.tcp.TcpLink`) to each
neighbour: arrays are written from their own memory and read straight into where they
belong (:meth:`~fiberlite.wire.link.StreamLink.recv_into`, which reads the frames as
one stream, so the receiver cuts it its own way), so the kernel's copies are nearly
the only ones.

Set-up: every member listens before the rendezvous, then dials its right neighbour
and accepts its left one. On each connection both ends prove they hold the run's key
(the wire's :class:`~fiberlite.wire.link.Listener`, which checks each connection on a
thread of its own, under a deadline and a bound) and the dialer names its rank in its
first frame; connections that fail this are closed. The listener closes once the left
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

import numpy as np

from ..errors import AuthenticationError
from ..wire import tcp
from ..wire.link import Listener, LinkError
from ..wire.link.tcp import TcpLink

log = logging.getLogger(__name__)

HANDSHAKE_SECONDS = 10.0   # per connection, for the challenge-response and the rank
SAME_HOST_BUFFER = 256 << 10   # socket buffers between members on one host: the bytes in
                               # flight stay in the CPU's caches (the kernel doubles it)
BACKLOG = 16
HANDSHAKES_AT_ONCE = 16    # connections checked at the same time (see Listener)
_IDENT = struct.Struct("<8sqq")   # magic, rank of the dialer, world size
_IDENT_MAGIC = b"FLlink01"


class NeighbourLinkLost(ConnectionError):
    """The connection to neighbour ``rank`` ended or failed (or the link was aborted)."""

    def __init__(self, rank: int | None, why: str) -> None:
        super().__init__(f"the link to rank {rank} failed ({why})")
        self.rank = rank
        self.why = why


def _remaining(deadline: float | None) -> float | None:
    if deadline is None:
        return None
    left = deadline - time.monotonic()
    if left <= 0:
        raise TimeoutError
    return left


class _Transfers:
    """Buffers sent (or received) on one connection, in order, by one thread; each gets
    a ticket, and :meth:`wait` returns once that ticket's transfer is done."""

    def __init__(self, link: TcpLink, receive: bool, peer: int, name: str) -> None:
        self.peer = peer
        self._link = link
        link.awake = False   # its thread only waits: it sleeps at once
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
        link, receive, cond = self._link, self._receive, self._cond
        while True:
            with cond:
                while not self._queue and self.error is None and not self.aborted:
                    cond.wait()
                if self.error is not None or not self._queue:
                    return
                view = self._queue[0]
            try:
                if receive:
                    link.recv_into(view)
                elif not link.send(view, -1):
                    raise ConnectionError("the connection ended")
            except (OSError, LinkError) as exc:
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


class NeighbourLink:
    """This member's connections to its ring neighbours: :meth:`send` goes to the right
    neighbour (rank + 1), :meth:`receive` comes from the left one (rank - 1)."""

    def __init__(self, host: str) -> None:
        self._lock = threading.Lock()
        self._aborted = False
        self._closed = False
        self._links: list[TcpLink] = []
        self._out: _Transfers | None = None
        self._in: _Transfers | None = None
        self.left: int | None = None
        self.right: int | None = None
        self._listening: socket.socket | None
        self._listening, port = tcp.listen(host, BACKLOG)
        self._listener: Listener | None = None
        self._proven: queue.SimpleQueue[TcpLink | None] = queue.SimpleQueue()
        self.address = tcp.address(host, port)

    def __repr__(self) -> str:
        return f"<NeighbourLink {self.address} left={self.left} right={self.right}>"

    # -- set-up ------------------------------------------------------------------------------
    def connect(self, rank: int, world_size: int, right_address: str, key: bytes,
                deadline: float | None = None, same_host: tuple[bool, bool] = (False, False)) -> None:
        """Dial the right neighbour at ``right_address`` and accept the left one, both
        authenticated; ``same_host``: whether the left and the right neighbour run on
        this host. Raises ``ConnectionError`` (or builtin ``TimeoutError``)."""
        self.left, self.right = (rank - 1) % world_size, (rank + 1) % world_size
        buffer = SAME_HOST_BUFFER if same_host[0] and SAME_HOST_BUFFER else None
        self._start_listening(world_size, key, buffer)
        try:
            right = self._dial(right_address, rank, world_size, key, deadline, same_host[1])
            left = self._wait_left(deadline)
        finally:
            self._close_listener()
        with self._lock:
            if self._aborted:
                raise NeighbourLinkLost(None, "the link was aborted")
            self._out = _Transfers(right, False, self.right, "fiberlite-ring-link-send")
            self._in = _Transfers(left, True, self.left, "fiberlite-ring-link-receive")

    def _start_listening(self, world_size: int, key: bytes, buffer: int | None) -> None:
        """Check every connection: the left neighbour's goes to :attr:`_proven`."""

        def serve(sock: socket.socket) -> None:   # on the connection's thread, key proved
            try:
                link = self._track(TcpLink.over(sock, self.address, buffer))
            except NeighbourLinkLost:
                return   # (closed: the link was aborted)
            why = self._check_dialer(link, world_size)
            if why is None:
                self._proven.put(link)
                return
            log.warning("ring link: closed a connection that %s", why)
            self._drop(link)

        with self._lock:
            listening, self._listening = self._listening, None
            if listening is None or self._aborted:
                if listening is not None:
                    listening.close()
                raise NeighbourLinkLost(None, "the link was aborted")
            self._listener = Listener(listening, self.address, key, serve, f"the ring link at {self.address}",
                                      limit=HANDSHAKES_AT_ONCE, timeout=HANDSHAKE_SECONDS, hands_over=True)

    def _check_dialer(self, link: TcpLink, world_size: int) -> str | None:
        """None when the peer names itself as the left neighbour, else why not."""
        try:
            ident = link.recv(int(HANDSHAKE_SECONDS * 1000))
        except (LinkError, OSError):
            return "ended before naming its rank"
        if len(ident) != _IDENT.size:
            return f"is not rank {self.left} of this ring"
        magic, rank, size = _IDENT.unpack(ident)
        if magic != _IDENT_MAGIC or rank != self.left or size != world_size:
            return f"is not rank {self.left} of this ring"
        return None

    def _wait_left(self, deadline: float | None) -> TcpLink:
        try:
            left = self._proven.get(timeout=_remaining(deadline))
        except queue.Empty:
            raise TimeoutError(f"rank {self.left} did not connect its ring link in time") from None
        except TimeoutError:
            raise TimeoutError(f"rank {self.left} did not connect its ring link in time") from None
        if left is None:
            raise NeighbourLinkLost(None, "the link was aborted")
        return left

    def _track(self, link: TcpLink) -> TcpLink:
        with self._lock:
            if self._aborted:
                link.close()
                raise NeighbourLinkLost(None, "the link was aborted")
            self._links.append(link)
        return link

    def _drop(self, link: TcpLink) -> None:
        with self._lock:
            if link in self._links:
                self._links.remove(link)
        link.close()

    def _close_listener(self) -> None:
        """Stop listening (any thread); a wait for the left neighbour ends."""
        with self._lock:
            listener, self._listener = self._listener, None
            listening, self._listening = self._listening, None
        if listener is not None:
            listener.close()
        if listening is not None:
            listening.close()
        self._proven.put(None)

    def _dial(self, address: str, rank: int, world_size: int, key: bytes,
              deadline: float | None, same_host: bool) -> TcpLink:
        wait = HANDSHAKE_SECONDS if deadline is None else min(HANDSHAKE_SECONDS, _remaining(deadline))
        buffer = SAME_HOST_BUFFER if same_host and SAME_HOST_BUFFER else None
        try:
            link = self._track(TcpLink.dial(address, key, buffer, wait))
        except AuthenticationError as exc:
            raise ConnectionError(str(exc)) from None
        except NeighbourLinkLost:
            raise
        except OSError as exc:
            raise ConnectionError(f"cannot connect the ring link to rank {self.right} at "
                                  f"{address}: {exc}") from None
        if not link.send(_IDENT.pack(_IDENT_MAGIC, rank, world_size), int(wait * 1000)):
            self._drop(link)   # the other end stops waiting for this handshake
            raise ConnectionError(f"the ring link to rank {self.right} failed during its handshake")
        return link

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
            connecting = [] if transfers else list(self._links)
        for t in transfers:
            t.abort()
        self._close_listener()   # a connect under way stops
        for link in connecting:
            link.close()

    def close(self) -> None:
        """Close the connections (what was sent is still delivered) and stop the threads."""
        self._close_listener()
        with self._lock:
            if self._closed:
                return
            self._closed = self._aborted = True
            links, self._links = self._links, []
            transfers = [t for t in (self._out, self._in) if t is not None]
        for t in transfers:
            t.abort()
        for link in links:
            link.close()   # wakes the threads blocked on it
        for t in transfers:
            t.join(5)
