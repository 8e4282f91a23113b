"""A lane: one direction of messages shared by every process of one machine.

A lane is a Unix ``SOCK_SEQPACKET`` socket pair. Every writer holds the same *writing*
socket and every reader the same *reading* socket (their descriptors handed out by the
creator's door), so the kernel keeps one FIFO for all of them, as an OS pipe does for
``multiprocessing``:

- a message is one record: sent whole or not at all, received whole by exactly one
  reader, in the order the sends returned, whatever process sent it;
- a writer or reader killed mid-message loses nothing but the message in its hands, and
  leaves nothing half-written for the others;
- no lock is needed by writers or readers, and nothing but the kernel runs in between.

A message larger than :data:`INLINE_MAX` travels as a ``memfd`` attached to its record
(``SCM_RIGHTS``): the reader maps it, so out-of-band buffers are not copied again.
The creator ends a lane's writing side (:meth:`Lane.end_writing`) once no writer is left:
readers get what remains, then ``EOFError``. It ends the reading side
(:meth:`Lane.end_reading`) once no reader is left: writers get ``BrokenPipeError``.
"""
from __future__ import annotations

import array
import errno
import mmap
import os
import select
import socket
import struct
import threading
import time
from typing import Any, Callable

from ...wire import oneway, unix
from ...wire.link.awake import Awake
from ..links.frames import EOF, PICKLED_KIND, item_frame, read_frame
from .watch import Watch

INLINE_MAX = 32 * 1024  # larger messages travel in a memfd of their own
ROOM = 4 << 20  # what a lane may hold (the kernel counts about 1 KiB for a small message)
_LARGE = b"\x10"  # a record that carries a memfd: this byte, the frame's size, the fd
_SIZE = struct.Struct("<Q")
_FD_SPACE = socket.CMSG_SPACE(array.array("i", [0]).itemsize)
_RECV_SIZE = INLINE_MAX + 64
_NOSIGNAL = int(getattr(socket, "MSG_NOSIGNAL", 0))
_DONTWAIT = int(socket.MSG_DONTWAIT | _NOSIGNAL)  # (plain ints: an enum's | costs a call)
_CLOEXEC = int(getattr(socket, "MSG_CMSG_CLOEXEC", 0))
_RECV_NOW = _DONTWAIT | _CLOEXEC
_POLL_IN = select.POLLIN | select.POLLPRI | select.POLLHUP
_POLL_OUT = select.POLLOUT
# the main thread waits in slices of this long: a Ctrl-C that the kernel gave another
# thread is raised in the main thread within a slice, as by the stdlib's waits
SIGNAL_SLICE = 0.02
_MAIN = threading.main_thread().ident
# readers of one lane that may look awake at once (:attr:`Lane.waiting`): one CPU is left
# for the writer, so that spinning readers never take it from the one they wait for
SPINNERS = max(1, len(getattr(os, "sched_getaffinity", lambda _: range(os.cpu_count() or 1))(0)) - 1)


def available() -> bool:
    """Whether this system has what lanes need (Linux: seqpacket pairs and memfds)."""
    return (hasattr(socket, "SOCK_SEQPACKET") and hasattr(os, "memfd_create")
            and hasattr(socket, "MSG_DONTWAIT") and os.uname().sysname == "Linux")


def new_pair() -> tuple[socket.socket, socket.socket]:
    """A new lane's ``(writing, reading)`` sockets."""
    writing, reading = unix.pair(unix.SEQPACKET)
    writing.shutdown(socket.SHUT_RD)  # nothing is ever sent the other way
    _make_room(writing)
    # (the socket's own: every process that holds it reads with it)
    reading.setsockopt(socket.SOL_SOCKET, socket.SO_RCVTIMEO,
                       struct.pack("ll", 0, int(SIGNAL_SLICE * 1_000_000)))
    return writing, reading


def _make_room(writing: socket.socket) -> None:
    """Let the lane hold :data:`ROOM` bytes of messages (a small message takes about
    1 KiB of it): past the system's default maximum where this process may (root)."""
    force = getattr(socket, "SO_SNDBUFFORCE", None)
    try:
        if force is not None:
            writing.setsockopt(socket.SOL_SOCKET, force, ROOM)
            return
    except OSError:
        pass
    try:
        writing.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, ROOM)
    except OSError:
        pass


class Lane:
    """This process's view of a lane: its writing and/or reading socket."""

    __slots__ = ("writing", "reading", "waiting", "watch", "_poll_in", "_awake", "__weakref__")

    def __init__(self, writing: socket.socket | None, reading: socket.socket | None) -> None:
        self.writing = writing
        self.reading = reading
        # (add, address): a count in shared memory of the readers waiting on the lane,
        # which ``add(address, delta)`` changes atomically (returning the old count);
        # only the first :data:`SPINNERS` of them look awake. None: every reader does
        self.waiting: tuple[Callable[[int, int], int], int] | None = None
        # a queue's: which one of the readers waits on the lane (None: each of them)
        self.watch: Watch | None = None
        self._poll_in = threading.local()  # a poll object per thread (one is not to be shared)
        self._awake = Awake()  # a read looks awake before it sleeps

    # -- sending -----------------------------------------------------------------------
    def send(self, payload: Any, block: bool = True) -> bool:
        """Send ``payload`` (a :class:`~fiberlite.wire.codec.Payload`) as one message;
        with ``block`` false, return False instead of waiting for room."""
        if oneway.unsettled:  # (what this process's one-way calls did is seen first)
            oneway.settle()
        frame = item_frame(payload)
        if type(frame) is bytes and len(frame) <= INLINE_MAX:  # as nearly always: one record,
            try:                                                # and room for it now
                self.writing.send(frame, _DONTWAIT)
            except BlockingIOError:
                if not block:
                    return False
            except BrokenPipeError:
                raise BrokenPipeError(32, "the other end of the pipe is closed") from None
            else:
                if self.watch is not None:
                    self.watch.sent()
                return True
        if block and threading.get_ident() == _MAIN:  # (waits in slices: see SIGNAL_SLICE)
            while not self._send_frame(frame, _DONTWAIT):
                self.wait_writable(SIGNAL_SLICE)
            return True
        return self._send_frame(frame, _NOSIGNAL if block else _DONTWAIT)

    def _send_frame(self, frame: Any, flags: int) -> bool:
        """Send one frame (bytes, or a tuple of parts) with ``flags``; False when the lane
        had no room and ``flags`` say not to wait."""
        try:
            if type(frame) is bytes:
                if len(frame) <= INLINE_MAX:
                    self.writing.send(frame, flags)
                    if self.watch is not None:
                        self.watch.sent()
                    return True
                parts = [frame]
            else:
                parts = list(frame)
                if sum(memoryview(p).nbytes for p in parts) <= INLINE_MAX:
                    self.writing.sendmsg(parts, (), flags)
                    if self.watch is not None:
                        self.watch.sent()
                    return True
            if not self._send_large(parts, flags):
                return False
            if self.watch is not None:
                self.watch.sent()
            return True
        except BlockingIOError:
            return False
        except BrokenPipeError:
            raise BrokenPipeError(32, "the other end of the pipe is closed") from None

    def _send_large(self, parts: list, flags: int) -> bool:
        fd = os.memfd_create("fiberlite-message", os.MFD_CLOEXEC)
        try:
            size = 0
            for part in parts:
                view = memoryview(part).cast("B")
                while view:
                    written = os.pwrite(fd, view, size)
                    size += written
                    view = view[written:]
            fds = [(socket.SOL_SOCKET, socket.SCM_RIGHTS, array.array("i", [fd]))]
            record = [_LARGE + _SIZE.pack(size)]
            pause = 0.001
            while True:
                try:
                    self.writing.sendmsg(record, fds, flags)
                    return True
                except OSError as exc:  # as many memfds are on their way as this user may
                    if exc.errno != errno.ETOOMANYREFS:  # have in flight: wait for readers
                        raise
                    if flags & socket.MSG_DONTWAIT:
                        return False
                time.sleep(pause)
                pause = min(0.05, pause * 2)
        finally:
            os.close(fd)

    def wait_writable(self, timeout: float | None) -> bool:
        """Wait until a message could be sent (or the lane ended); False after ``timeout``
        (a wait of the main thread for ever is one slice: its caller looks again)."""
        if timeout is None and threading.get_ident() == _MAIN:
            timeout = SIGNAL_SLICE
        poller = select.poll()
        poller.register(self.writing, _POLL_OUT)
        return bool(poller.poll(None if timeout is None else max(0, int(timeout * 1000))))

    # -- receiving ---------------------------------------------------------------------
    def receive(self, timeout: float | None = None, wake: Callable[[], bool] | None = None) -> Any:
        """The next message: a Payload, None after ``timeout`` (0: do not wait), or
        :data:`~fiberlite.runtime.links.frames.EOF` once every writer has gone; a wait
        also ends (None) at the end of a slice (:data:`SIGNAL_SLICE`) when ``wake()``."""
        sock = self.reading
        try:
            data, ancillary, _, _ = sock.recvmsg(_RECV_SIZE, _FD_SPACE, _RECV_NOW)
            return self._decode(data, ancillary)
        except BlockingIOError:
            if timeout is not None and timeout <= 0:
                return None
        if self.watch is not None:
            return self.watch.receive(self, timeout, wake)
        waiting = self.waiting
        if waiting is None:
            return self._wait(timeout, True, wake)
        add, address = waiting
        try:
            return self._wait(timeout, add(address, 1) < SPINNERS, wake)
        finally:
            add(address, -1)

    def take_now(self) -> Any:
        """The next message if one is there now (or the end), else None."""
        try:
            data, ancillary, _, _ = self.reading.recvmsg(_RECV_SIZE, _FD_SPACE, _RECV_NOW)
        except BlockingIOError:
            return None
        return self._decode(data, ancillary)

    def receive_now(self) -> Any:
        """The next message if one is there now, else None: a small message that is a
        pickle alone (as nearly all are) as the pickle's bytes, for the caller to load,
        any other as :meth:`receive` returns it."""
        try:
            data, ancillary, _, _ = self.reading.recvmsg(_RECV_SIZE, _FD_SPACE, _RECV_NOW)
        except BlockingIOError:
            return None
        if data[:1] == PICKLED_KIND and not ancillary:
            return data[1:]
        return self._decode(data, ancillary)

    def watch_wait(self, timeout: float | None, wake: Callable[[], bool] | None) -> Any:
        """Wait for the next message as the lane's one watcher (:mod:`.watch`)."""
        return self._wait(timeout, True, wake)

    def _wait(self, timeout: float | None, look: bool, wake: Callable[[], bool] | None) -> Any:
        """:meth:`receive` once nothing was there: looking awake first when ``look``."""
        sock = self.reading
        if look:
            got = self._awake.look(lambda: sock.recvmsg(_RECV_SIZE, _FD_SPACE, _RECV_NOW), self.readable_now)
            if got is not None:
                return self._decode(got[0], got[1])
        # a blocking read: the kernel wakes one waiting reader per message (a poll would
        # wake them all); it returns every SIGNAL_SLICE (the socket's receive timeout),
        # so that a Ctrl-C meant for this thread is raised within a slice
        deadline = None if timeout is None else time.monotonic() + max(0.0, timeout)
        while True:
            left = None if deadline is None else deadline - time.monotonic()
            if left is not None and left < SIGNAL_SLICE:  # the last moments: poll
                if left <= 0 or not self._wait_readable(left):
                    return None
                flags = _RECV_NOW
            else:
                flags = _CLOEXEC
            try:
                data, ancillary, _, _ = sock.recvmsg(_RECV_SIZE, _FD_SPACE, flags)
            except BlockingIOError:  # a slice passed, or another reader was first
                if wake is not None and wake():
                    return None
                continue
            return self._decode(data, ancillary)

    def readable_now(self) -> bool:
        """Whether a message (or the end) is there, without waiting (no exception when not)."""
        return bool(self._poller().poll(0))

    def _wait_readable(self, seconds: float) -> bool:
        return bool(self._poller().poll(max(1, int(seconds * 1000 + 0.999))))

    def _poller(self) -> Any:
        """This thread's poll object on the reading socket (a poll object raises when two
        threads poll with it at once)."""
        local = self._poll_in
        try:
            return local.poller
        except AttributeError:
            poller = local.poller = select.poll()
            poller.register(self.reading, _POLL_IN)
            return poller

    def poll(self, timeout: float | None = 0.0) -> bool:
        """Whether a message (or the end) is there to read, waiting up to ``timeout``."""
        if timeout is not None and timeout <= 0:
            poller = select.poll()
            poller.register(self.reading, _POLL_IN)
            return bool(poller.poll(0))
        deadline = None if timeout is None else time.monotonic() + timeout
        main = threading.get_ident() == _MAIN
        while True:
            left = SIGNAL_SLICE if deadline is None else deadline - time.monotonic()
            if left <= 0:
                return False
            if self._wait_readable(min(left, SIGNAL_SLICE) if main else left):
                return True

    @staticmethod
    def _decode(data: bytes, ancillary: list) -> Any:
        if not data:
            return EOF
        if data[:1] == _LARGE:
            fds = array.array("i")
            for level, kind, cdata in ancillary:
                if level == socket.SOL_SOCKET and kind == socket.SCM_RIGHTS:
                    fds.frombytes(cdata[:len(cdata) - len(cdata) % fds.itemsize])
            if len(fds) != 1:
                for fd in fds:
                    os.close(fd)
                raise ConnectionError("a lane's large message came without its memory")
            try:
                size = _SIZE.unpack_from(data, 1)[0]
                memory = mmap.mmap(fds[0], size, flags=mmap.MAP_PRIVATE) if size else b""  # (copy on write)
            finally:
                os.close(fds[0])
            return read_frame(memoryview(memory))
        for level, kind, cdata in ancillary:  # (none is sent with a small message)
            if level == socket.SOL_SOCKET and kind == socket.SCM_RIGHTS:
                for fd in array.array("i", cdata[:len(cdata) - len(cdata) % 4]):
                    os.close(fd)
        return read_frame(data)

    # -- ending ------------------------------------------------------------------------
    def end_writing(self) -> None:
        """No writer is left: readers get what remains, then EOF."""
        _shutdown(self.writing, socket.SHUT_WR)

    def end_reading(self) -> None:
        """No reader is left: every send now raises BrokenPipeError."""
        _shutdown(self.reading, socket.SHUT_RD)

    def close(self) -> None:
        for sock in (self.writing, self.reading):
            if sock is not None:
                sock.close()


def _shutdown(sock: socket.socket | None, how: int) -> None:
    if sock is not None:
        try:
            sock.shutdown(how)
        except OSError:
            pass
