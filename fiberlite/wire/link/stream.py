"""Frames over a connected stream socket (TCP, or Unix between processes of one machine),
written by the sending thread and read by the receiving thread themselves.

Each frame is a length and its bytes: no thread in between, one system call each way
for a small frame, and the parts of a frame (large out-of-band buffers) go out without
being joined first. :meth:`StreamLink.recv_into` reads the frames as one byte stream
straight into memory the caller gives (bulk data: an array received in place).

A frame whose first part went out but not the rest (the reader's socket is full) is
finished by a thread of its own (:class:`~.sockets.Backlog`): the sender never blocks
unless it said it may, and a frame is never cut. One process-wide thread
(:class:`~.sockets.Watch`) hears of every stream link whose peer hangs up, for
:meth:`StreamLink.on_lost`.

Acknowledgements travel in line, as one-byte frames (:data:`~.base.ACK`) that a receive
counts and skips (the local flavour counts them in shared memory). Every other frame of
one byte or none carries padding up to :data:`QUIET_LOWAT` bytes (:data:`PADDED` in its
length, :func:`padding`), so that an acknowledgement alone is the only thing shorter: a
flavour with :attr:`StreamLink.quiet_acks` (TCP) has the kernel wake a receiver waiting
for a new frame only once that many bytes are there, so an acknowledgement that arrives
alone wakes nobody and is counted with what follows it. The flavours (:mod:`.local`,
:mod:`.tcp`) make the connection, prove the key, and hand it over.
"""
from __future__ import annotations

import os
import select
import socket
import struct
import threading
import time
from typing import Any, Callable

from .. import oneway
from .awake import SPIN_SECONDS, Awake
from .base import ACK, LinkCanceled, LinkClosed, LinkTimeout, LossCallbacks
from .bulk import BulkReads
from .sockets import SOCKET_BUFFER, Backlog, rest_of, send_blocking, tune, unwatch, watch

HEADER = struct.Struct("<Q")  # each frame: its length, then its bytes
PADDED = 1 << 63  # in a length: padding follows the frame (one of one byte or none, see padding)
_ACK_FRAME = HEADER.pack(1) + ACK  # what an acknowledgement is on the wire: 9 bytes
QUIET_LOWAT = len(_ACK_FRAME) + 1  # fewer bytes than this: an acknowledgement alone


def padding(size: int) -> int:
    """The bytes of padding after a padded frame of ``size`` bytes (0 or 1): up to
    :data:`QUIET_LOWAT` on the wire."""
    return QUIET_LOWAT - HEADER.size - size
CHUNK = 256 * 1024  # read at most this much at a time; larger frames get a buffer of their own
CANCEL_CHECK_US = 20_000  # a receive blocked for ever looks at cancel() this often
_POLL_IN = select.POLLIN | select.POLLPRI
_DONTWAIT = socket.MSG_DONTWAIT | getattr(socket, "MSG_NOSIGNAL", 0)


class StreamLink(BulkReads, LossCallbacks):
    """One end of a link over a stream socket; one receiving and one sending thread at a time."""

    acks_in_line = True  # acknowledgements are one-byte frames among the others
    settles = True  # a frame waits for this process's unsettled one-way calls (.oneway)
    quiet_acks = False  # an acknowledgement alone does not wake a receive (see above)

    def __init__(self, address: str = "") -> None:
        self.address = address
        self.lost = False
        self._sock: socket.socket | None = None
        self._wake = os.eventfd(0, os.EFD_NONBLOCK | os.EFD_CLOEXEC)
        self._inbox = bytearray(CHUNK)  # what was read: frames not yet taken lie in
        self._view = memoryview(self._inbox)  # [_start, _end)
        self._start = self._end = 0
        self._drained = False  # the last read emptied the socket (the next one waits first)
        self._canceled = False  # cancel() was called while a receive blocked for ever
        self._read_poller: Any = None
        self._receiving = False
        self._lock = threading.Lock()
        self._closed = False
        self._lost_callbacks: list[Callable[[], None]] = []
        self._backlog: Backlog | None = None
        self._acks = 0  # acknowledgements read so far (in line)
        self._left = 0  # bytes of the frame recv_into is in that it has not read yet
        self._pad = 0  # bytes of padding after that frame, to skip
        self._lowat = 1  # the socket's SO_RCVLOWAT now (quiet_acks)
        self._awake = Awake()  # see _spin
        self.awake = bool(SPIN_SECONDS)  # a receive that waits looks awake first (.awake)

    @classmethod
    def over(cls, sock: socket.socket, address: str, buffer: int | None = SOCKET_BUFFER) -> "StreamLink":
        """A link over ``sock``, a connection whose peer proved the key (``buffer``: the
        socket buffers to ask for, None to leave them to the kernel)."""
        link = cls(address)
        link._connected(sock, buffer)
        return link

    def _connected(self, sock: socket.socket, buffer: int | None = SOCKET_BUFFER) -> bool:
        tune(sock, CANCEL_CHECK_US, buffer)
        with self._lock:
            if self._closed:
                sock.close()
                return False
            self._sock = sock
        if self.quiet_acks:
            self._set_lowat(sock, QUIET_LOWAT)
        watch(sock.fileno(), self._peer_gone)
        return True

    # -- sending -------------------------------------------------------------------------
    def send(self, frame: Any, timeout_ms: int = 0) -> bool:
        """Send ``frame``, waiting up to ``timeout_ms`` for room (0: not at all, -1: for
        ever); False if it did not go (full, or gone). Once part of a frame is out, the
        rest follows: at once when the caller may wait, else on a thread of its own."""
        if oneway.unsettled and self.settles and frame is not ACK:
            oneway.settle()
        sock = self._sock
        if sock is None or self.lost:
            return False
        sent = 0
        if type(frame) is tuple and sum(memoryview(p).nbytes for p in frame) <= 1:
            frame = b"".join(frame)
        if self._backlog is None and type(frame) is bytes and len(frame) < CHUNK:
            # one small frame: one copy, one call (a frame of one byte or none: see _wire)
            data = HEADER.pack(len(frame)) + frame if len(frame) > 1 else \
                _ACK_FRAME if frame is ACK else _wire(frame)
            try:
                sent = sock.send(data, _DONTWAIT)
            except (BlockingIOError, InterruptedError):
                pass
            except OSError:
                self._peer_gone()
                return False
            if sent == len(data):
                return True  # (as nearly always)
            parts = [data]
        elif type(frame) is tuple:
            parts = [HEADER.pack(sum(memoryview(p).nbytes for p in frame)), *frame]
        else:
            parts = [_wire(frame)] if len(frame) < CHUNK else [HEADER.pack(len(frame)), frame]
        deadline = None if timeout_ms < 0 else time.monotonic() + timeout_ms / 1000
        backlog = self._backlog
        if backlog is not None:
            if not backlog.wait(deadline):
                return False
            self._backlog = None
        if deadline is None:  # the caller waits for ever: the kernel writes it all
            if send_blocking(sock, rest_of(parts, sent)):
                return True
            self._peer_gone()
            return False
        while not sent:
            sent = self._send_some(sock, parts)
            if sent is None:
                return False
            if not sent and not self._wait_writable(sock, deadline):
                return False
        rest = rest_of(parts, sent)
        if rest:
            if timeout_ms == 0:  # the caller may not wait: the rest goes on its own
                rest = [bytes(p) for p in rest]
                self._backlog = Backlog(lambda: self._send_all(sock, rest) if not self._closed else None)
            else:
                return self._send_all(sock, rest)
        return True

    def _wait_writable(self, sock: socket.socket, deadline: float | None) -> bool:
        if deadline is not None and time.monotonic() >= deadline:
            return False
        wait = -1 if deadline is None else max(0, int((deadline - time.monotonic()) * 1000))
        poller = select.poll()
        poller.register(sock, select.POLLOUT)
        poller.register(self._wake, select.POLLIN)
        for fd, events in poller.poll(wait):
            if fd != self._wake and events & (select.POLLERR | select.POLLHUP):
                self._peer_gone()
                return False
        return not self._closed and not self.lost

    def _send_some(self, sock: socket.socket, parts: list) -> int | None:
        """Write what the socket takes of ``parts`` now: how much (None: the peer is gone)."""
        try:
            if len(parts) == 1:
                return sock.send(parts[0], _DONTWAIT)
            return sock.sendmsg(parts, (), _DONTWAIT)
        except (BlockingIOError, InterruptedError):
            return 0
        except OSError:
            self._peer_gone()
            return None

    def _send_all(self, sock: socket.socket, parts: list) -> bool:
        """Write ``parts`` whatever it takes (the start of their frame is out already)."""
        while parts:
            sent = self._send_some(sock, parts)
            if sent is None:
                return False
            parts = rest_of(parts, sent)
            if parts and not sent and not self._wait_writable(sock, None):
                return False
        return True

    # -- receiving -----------------------------------------------------------------------
    def recv(self, timeout_ms: int = -1) -> Any:
        """The next frame; :class:`LinkTimeout` after ``timeout_ms`` (-1: never, and at
        once when the peer has gone and everything it sent is read),
        :class:`LinkCanceled` once :meth:`cancel` is called (or the peer hung up),
        :class:`LinkClosed` once closed."""
        if self._end - self._start >= 8:  # (something read already)
            frame = self._buffered()
            if frame is not None:
                return frame
        lost = self.lost  # a receive that began on a live link is woken by the hang-up
        if timeout_ms < 0 and self._drained and not self.awake and self._end == self._start:
            sock = self._sock  # as nearly always: one blocking call into the empty inbox
            if sock is not None:
                if self.quiet_acks and self._lowat != QUIET_LOWAT:
                    self._set_lowat(sock, QUIET_LOWAT)
                self._receiving = True
                try:
                    got = sock.recv_into(self._view, CHUNK)
                except OSError:  # (woken to look at cancel(), or the end: read on below)
                    got = 0
                self._receiving = False
                if got:
                    self._start, self._end = 0, got
                    self._drained = got < CHUNK
                    frame = self._buffered()
                    if frame is not None:
                        return frame
        deadline = None if timeout_ms < 0 else time.monotonic() + timeout_ms / 1000
        while True:
            frame = self._read(deadline, lost)
            if frame is not None:
                return frame

    def recv_nowait(self) -> Any:
        """The next frame if one has arrived, else None."""
        frame = self._buffered()
        if frame is not None:
            return frame
        try:
            return self._read(0.0, True)
        except (LinkTimeout, LinkCanceled, LinkClosed):
            return None

    def recv_ready(self) -> list:
        """The frames that have arrived, for a reader whose selector said the socket is
        readable: one read at once, without looking first ([]: none whole yet, or the
        peer's end, then :attr:`lost`). The socket will not tell of what it returns again."""
        self._drained = False
        frames = []
        frame = self.recv_nowait()
        while frame is not None:
            frames.append(frame)
            frame = self._buffered()
        return frames

    def _next_size(self) -> int | None:
        """The size of the next frame once its length has arrived (acknowledgements before
        it counted and dropped), else None."""
        start, end = self._start, self._end
        while end - start >= 8:
            (size,) = HEADER.unpack_from(self._inbox, start)
            if size == 1 and self.acks_in_line and end - start < 9:
                break  # an acknowledgement (any other one-byte frame is padded)
            if size != 1 or not self.acks_in_line:
                self._start = start
                size, self._pad = (size & ~PADDED, padding(size & ~PADDED)) if size & PADDED else (size, 0)
                return size
            self._acks += 1
            start += 9
        if start == end:
            start = end = self._end = 0
        self._start = start
        return None

    def _buffered(self) -> Any:
        """A whole frame already read, taken out of the inbox; else None."""
        start, end = self._start, self._end
        if end - start < 8:
            return None
        (size,) = HEADER.unpack_from(self._inbox, start)
        if size == 1 and self.acks_in_line:  # an acknowledgement (or more)
            size = self._next_size()
            if size is None:
                return None
            start, pad = self._start, self._pad
        elif size & PADDED:
            size &= ~PADDED
            pad = padding(size)
        else:
            pad = 0
        stop = start + 8 + size
        if stop + pad > end:
            return None
        frame = bytes(self._view[start + 8:stop])
        stop += pad
        self._pad = 0
        if stop == end:
            self._start = self._end = 0
        else:
            self._start = stop
        return frame

    def _read(self, deadline: float | None, lost: bool) -> Any:
        """Read what has arrived (waiting until ``deadline`` for something); a frame once
        one is whole, else None (read again); :meth:`_fill`'s errors."""
        size = self._next_size()
        if size is not None and size + 8 > CHUNK:  # a large frame: read it into a buffer of its own
            frame = bytearray(size)
            self.recv_into(frame, -1 if deadline is None else max(0, int((deadline - time.monotonic()) * 1000)))
            return frame  # (a frame that began arriving is read whole: see _read_rest)
        if not self._fill(deadline, lost):
            return None
        return self._buffered()

    def _fill(self, deadline: float | None, lost: bool, most: int = CHUNK) -> bool:
        """Read what has arrived into the inbox, waiting until ``deadline`` for something:
        whether anything came. At the end of the peer's bytes: :class:`LinkTimeout` if the
        link was known to be ``lost`` when the receive began (nothing more comes), else
        :class:`LinkCanceled` (look at the link again). Reads ``most`` bytes at most."""
        sock = self._sock
        if sock is None:
            raise LinkClosed("the link is not connected")
        start, end = self._start, self._end
        if end == CHUNK:  # no room left behind what is unread: move it to the front
            self._view[:end - start] = self._view[start:end]
            self._start, self._end = 0, end - start
        end = self._end
        room = min(CHUNK - end, most)
        into = self._view[end:end + room]
        if self.quiet_acks:  # waiting for a new frame: quiet; for the rest of one: any byte
            lowat = QUIET_LOWAT if self._start == end and not self._left and not self._pad else 1
            if lowat != self._lowat:
                self._set_lowat(sock, lowat)
        if self._drained and deadline is None:  # wait for ever: one blocking call, no poll
            self._receiving = True
            try:
                got = self._spin(sock, into, room) if self.awake else None
                if got is None:
                    got = sock.recv_into(into, room)  # (the socket wakes it to look at cancel())
            except (BlockingIOError, InterruptedError):
                got = self._read_blocking(sock, into, room)
            except OSError:
                got = 0
            finally:
                self._receiving = False
        else:
            if self._drained and deadline > time.monotonic():  # the last read took all there
                self._wait_readable(sock, deadline)  # was: wait first (a look reads at once)
            try:
                got = sock.recv_into(into, room, _DONTWAIT)
            except (BlockingIOError, InterruptedError):
                self._drained = True
                self._wait_readable(sock, deadline)
                return False
            except OSError:
                got = 0
        self._drained = got < room or most < CHUNK  # (a read held to a frame's length: wait next)
        if not got:
            self._peer_gone()
            if self._closed:
                raise LinkClosed("the link is closed")
            raise LinkTimeout if lost else LinkCanceled
        self._end += got
        return True

    def _set_lowat(self, sock: socket.socket, lowat: int) -> None:
        try:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVLOWAT, lowat)
        except OSError:
            return
        self._lowat = lowat

    def _spin(self, sock: socket.socket, into: memoryview, room: int) -> int | None:
        """Bytes read awake (:mod:`.awake`), or None: then block."""
        return self._awake.look(lambda: sock.recv_into(into, room, _DONTWAIT))

    def _read_blocking(self, sock: socket.socket, into: memoryview, room: int) -> int:
        """A blocking read (the socket wakes it every ``CANCEL_CHECK_US``); how much came
        (0: the peer's end). :class:`LinkCanceled` once :meth:`cancel` was called."""
        while True:
            self._receiving = True
            try:
                return sock.recv_into(into, room)
            except (BlockingIOError, InterruptedError):
                pass
            except OSError:
                return 0
            finally:
                self._receiving = False
            if self._closed:
                raise LinkClosed("the link is closed")
            if self._canceled:
                self._canceled = False
                raise LinkCanceled

    def _wait_readable(self, sock: socket.socket, deadline: float | None, partial: bool = False) -> None:
        """Wait for bytes (or the peer's hang-up); :class:`LinkTimeout` at ``deadline``,
        :class:`LinkCanceled` when woken by :meth:`cancel`."""
        wait = -1 if deadline is None else max(0, int((deadline - time.monotonic()) * 1000))
        poller = self._read_poller
        if poller is None:
            poller = self._read_poller = select.poll()
            poller.register(sock, _POLL_IN)
            poller.register(self._wake, select.POLLIN)
        self._receiving = True
        try:
            ready = poller.poll(wait)
        finally:
            self._receiving = False
        if len(ready) == 1 and ready[0][0] != self._wake and not self._closed:
            return  # bytes (or the peer's hang-up), as nearly always
        if self._closed:
            raise LinkClosed("the link is closed")
        if any(fd == self._wake for fd, _ in ready):
            self._canceled = False
            try:
                os.eventfd_read(self._wake)
            except BlockingIOError:
                pass
            if not any(fd != self._wake for fd, _ in ready):
                raise LinkCanceled
        if not ready and not partial:
            raise LinkTimeout

    # -- acknowledgements ----------------------------------------------------------------
    def acknowledge(self, timeout_ms: int = 0) -> bool:
        """Tell the peer one more frame is consumed: an acknowledgement in line."""
        return self.send(ACK, timeout_ms)

    def acknowledged(self) -> int:
        """The acknowledgements read so far (they come in line, among the frames)."""
        return self._acks

    def cancel(self) -> None:
        """Wake a thread blocked in :meth:`recv` (:class:`LinkCanceled`): at once when it
        waits with a timeout, within ``CANCEL_CHECK_US`` when it waits for ever."""
        if self._receiving and not self._closed:
            self._canceled = True
            try:
                os.eventfd_write(self._wake, 1)
            except OSError:
                pass

    # -- ending --------------------------------------------------------------------------
    def _peer_gone(self) -> None:
        with self._lock:
            if self.lost:
                return
            self.lost = True
            callbacks, self._lost_callbacks = self._lost_callbacks, []
        self._call_lost(callbacks)

    def close(self) -> None:
        """Close the link: a receive or send under way on another thread fails at once.
        The descriptors are shut down now and closed with the object, so that none is
        closed under a thread still inside a call on it."""
        if not self._mark_closed():
            return
        sock = self._sock
        if sock is not None:
            unwatch(sock.fileno())
            try:
                sock.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
        try:
            os.eventfd_write(self._wake, 1)
        except OSError:
            pass

    def __del__(self) -> None:
        wake = getattr(self, "_wake", -1)
        if wake >= 0:
            self._wake = -1
            os.close(wake)
        sock = getattr(self, "_sock", None)
        if sock is not None:
            sock.close()

    def fileno(self) -> int:
        sock = self._sock
        return -1 if sock is None else sock.fileno()


def _wire(frame: bytes) -> bytes:
    """A small frame as it goes on the wire: its length, its bytes (and a frame of one
    byte or none, but an acknowledgement, padded: see :data:`PADDED`)."""
    if len(frame) <= 1 and frame != ACK:
        return HEADER.pack(len(frame) | PADDED) + frame + bytes(padding(len(frame)))
    return HEADER.pack(len(frame)) + frame
