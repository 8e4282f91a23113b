"""``Pipe()`` and ``Connection``: two ends that may live in any two jobs.

Both ends are served by the hub of the process that created the pipe: each end reads
from its own channel and writes into the other's. The pipe knows which processes hold
each end; once every holder of one end has closed it (or exited), the other end reads
what is left and then gets ``EOFError``, and writing to it raises ``BrokenPipeError``.
"""
from __future__ import annotations

from typing import Any

from .channel import Channel
from .errors import BufferTooShort
from .hub import LOCAL_PEER, LockedServant, ObjectRef, get_hub
from .wire.codec import Payload


class PipeServant(LockedServant):
    """Two channels and the holders of each end."""

    def __init__(self, duplex: bool) -> None:
        super().__init__()
        # inbox[e] holds what end e will read
        self.inbox = (Channel(), Channel())
        self.holders: tuple[set[int], set[int]] = ({LOCAL_PEER}, {LOCAL_PEER})
        self.pending = [0, 0]  # ends pickled for another job and not yet attached there
        if not duplex:  # end 0 only reads, end 1 only writes
            self.inbox[1].close_writers()

    def op_send(self, request, end: int, payload: Payload) -> None:
        with self._lock:
            actions = self.inbox[1 - end].put(request, payload, True, None, self.schedule_expiry)
        self.run_actions(actions)

    def op_recv(self, request, end: int) -> None:
        with self._lock:
            actions = self.inbox[end].get(request, True, None, self.schedule_expiry)
        self.run_actions(actions)

    def op_poll(self, request, end: int, timeout: float | None) -> None:
        with self._lock:
            actions = self.inbox[end].get(request, timeout is None or timeout > 0, timeout,
                                          self.schedule_expiry, peek=True)
        self.run_actions(actions)

    def op_export(self, request, end: int) -> None:
        with self._lock:
            self.pending[end] += 1
        request.reply()

    def op_attach(self, request, end: int) -> None:
        with self._lock:
            if self.pending[end] > 0:
                self.pending[end] -= 1
            self.holders[end].add(request.peer)
        request.reply()

    def op_close(self, request, end: int) -> None:
        with self._lock:
            self.holders[end].discard(request.peer)
            actions = self._check_end(end)
        request.reply()
        self.run_actions(actions)

    def _check_end(self, end: int) -> list:
        if self.holders[end] or self.pending[end]:
            return []
        # nobody holds `end` any more: its peer reads EOF, writes to it break
        return self.inbox[1 - end].close_writers() + self.inbox[end].close_readers()

    def peer_lost(self, peer: int) -> None:
        actions: list = []
        with self._lock:
            for end in (0, 1):
                self.inbox[end].drop_peer(peer)
                if peer in self.holders[end]:
                    self.holders[end].discard(peer)
                    actions += self._check_end(end)
        self.run_actions(actions)


class Connection:
    """One end of a :func:`Pipe` (``multiprocessing.connection.Connection``)."""

    def __init__(self, ref: ObjectRef, end: int, readable: bool, writable: bool) -> None:
        self._ref = ref
        self._end = end
        self._readable = readable
        self._writable = writable
        self._closed = False

    def __reduce__(self):
        self._check_closed()
        self._ref.call("export", self._end)
        return (_attach, (self._ref, self._end, self._readable, self._writable))

    # -- state ---------------------------------------------------------------------------
    @property
    def closed(self) -> bool:
        return self._closed

    @property
    def readable(self) -> bool:
        return self._readable

    @property
    def writable(self) -> bool:
        return self._writable

    def _check_closed(self) -> None:
        if self._closed:
            raise OSError("handle is closed")

    def _check_readable(self) -> None:
        self._check_closed()
        if not self._readable:
            raise OSError("connection is write-only")

    def _check_writable(self) -> None:
        self._check_closed()
        if not self._writable:
            raise OSError("connection is read-only")

    def fileno(self) -> int:
        raise OSError("fiberlite connections have no file descriptor; use poll()")

    def close(self) -> None:
        if not self._closed:
            self._closed = True
            try:
                self._ref.call("close", self._end)
            except (ConnectionError, ReferenceError):
                pass

    def __enter__(self) -> "Connection":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    # -- sending -------------------------------------------------------------------------
    def send(self, obj: Any) -> None:
        """Send a picklable object to the other end."""
        self._check_writable()
        self._ref.cast("send", self._end, Payload.pack(obj))

    def send_bytes(self, buf: Any, offset: int = 0, size: int | None = None) -> None:
        """Send bytes from a bytes-like object (a slice of it with ``offset``/``size``)."""
        self._check_writable()
        view = memoryview(buf)
        if view.itemsize > 1:
            view = view.cast("B")
        n = len(view)
        if offset < 0:
            raise ValueError("offset is negative")
        if n < offset:
            raise ValueError("buffer length < offset")
        if size is None:
            size = n - offset
        elif size < 0:
            raise ValueError("size is negative")
        elif offset + size > n:
            raise ValueError("buffer length < offset + size")
        self._ref.cast("send", self._end, Payload.raw(bytes(view[offset:offset + size])))

    # -- receiving -----------------------------------------------------------------------
    def _receive(self) -> Payload:
        self._check_readable()
        return self._ref.call("recv", self._end)

    def recv(self) -> Any:
        """Receive an object; ``EOFError`` when the other end is closed and nothing is left."""
        return self._receive().unpack()

    def recv_bytes(self, maxlength: int | None = None) -> bytes:
        """Receive a message as bytes."""
        if maxlength is not None and maxlength < 0:
            raise ValueError("negative maxlength")
        data = self._receive().as_bytes()
        if maxlength is not None and len(data) > maxlength:
            self.close()
            raise OSError("bad message length")
        return data

    def recv_bytes_into(self, buf: Any, offset: int = 0) -> int:
        """Receive a message into ``buf`` at ``offset``; ``BufferTooShort`` if it does not fit."""
        view = memoryview(buf)
        if view.itemsize > 1:
            view = view.cast("B")
        if offset < 0 or offset > len(view):
            raise ValueError("offset out of bounds" if offset > len(view) else "negative offset")
        data = self._receive().as_bytes()
        if len(data) > len(view) - offset:
            raise BufferTooShort(data)
        view[offset:offset + len(data)] = data
        return len(data)

    def poll(self, timeout: float | None = 0.0) -> bool:
        """Whether there is something to read (or EOF), waiting up to ``timeout`` (None: forever)."""
        self._check_readable()
        return self._ref.call("poll", self._end, timeout)

    def __repr__(self) -> str:
        return f"<Connection end={self._end} of {self._ref}{' closed' if self._closed else ''}>"


def _attach(ref: ObjectRef, end: int, readable: bool, writable: bool) -> Connection:
    ref.call("attach", end)
    return Connection(ref, end, readable, writable)


def Pipe(duplex: bool = True) -> tuple[Connection, Connection]:
    """Two connected ends; with ``duplex=False`` the first only receives, the second only sends."""
    ref = get_hub().register(PipeServant(duplex))
    if duplex:
        return Connection(ref, 0, True, True), Connection(ref, 1, True, True)
    return Connection(ref, 0, True, False), Connection(ref, 1, False, True)
