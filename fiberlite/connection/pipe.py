"""``Pipe()`` and ``Connection``: two ends that may live in any two jobs.

Both ends are served by the hub of the process that created the pipe: each end reads
from its own channel and writes into the other's. The pipe knows which processes hold
each end (a Connection closes when it is collected, as in ``multiprocessing``); once
every holder of one end has closed it (or exited), the other end reads what is left
and then gets ``EOFError``, and writing to it raises ``BrokenPipeError``. When neither
end is held any more, the pipe leaves its hub. An end read by one other job alone is
linked to it (:mod:`fiberlite.runtime.links`): what is sent to it goes straight to that job.
Sends and receives take the route a ``Queue`` takes (:mod:`fiberlite.runtime.links.route`).

The pipe's hub side is :mod:`fiberlite.connection.servant`; what makes
``Connection.fileno()`` readable, :mod:`fiberlite.connection.readiness`; waiting on
several connections at once, :func:`fiberlite.connection.wait`.
"""
from __future__ import annotations

import os
from typing import Any

from ..errors import BufferTooShort
from ..runtime.links import reader as links, route
from ..runtime.finalizing import CastQueue
from ..runtime.handles import job_exports
from ..runtime.hub import ObjectRef, get_hub
from ..wire.codec import Payload
from ..runtime.lanes.feeder import batches
from ..runtime.links.frames import EOF
from ..units import check_timeout
from .pipe_lanes import ReadsThroughHub, lanes_here
from .readiness import _ReadySignal
from .servant import PipeServant

__all__ = ["Pipe", "Connection"]


class Connection:
    """One end of a :func:`Pipe` (``multiprocessing.connection.Connection``)."""

    _signal: "_ReadySignal | None" = None  # made by fileno()
    _servant: "PipeServant | None" = None  # the pipe, when it lives in this process
    _elsewhere = False  # the pipe lives in another process
    _places: tuple | None = None  # where the pipe's lanes are, when it has lanes
    _lanes: tuple | None = None  # (read, write): the lanes this end uses here, if reachable
    _through_hub: ReadsThroughHub | None = None  # this end's reads, when it has lanes not reachable here

    def __init__(self, ref: ObjectRef, end: int, readable: bool, writable: bool,
                 places: tuple | None = None) -> None:
        self._ref = ref
        self._end = end
        self._readable = readable
        self._writable = writable
        self._closed = False
        if places is not None:
            self._places = places
            self._lanes = lanes_here(places, end, readable, writable)
            if self._lanes is None and readable:
                self._through_hub = ReadsThroughHub(ref, end)
        _closes.start()

    def __del__(self) -> None:
        # as a multiprocessing Connection closes its descriptor when collected; a
        # finalizer must not take locks, so a thread of its own does the closing
        if self._signal is not None:
            self._signal.close(wait=False)
        if not getattr(self, "_closed", True):
            self._closed = True
            _closes.put(self._ref, "close", self._end)

    def __reduce__(self):
        self._check_closed()
        token = os.urandom(8)
        self._ref.call("export", self._end, token)
        exports = job_exports()
        if exports is not None:  # pickled for a job: if it never loads it, forget the export
            exports.append((self._ref, "expire", (self._end, token)))
        return (_attach, (self._ref, self._end, self._readable, self._writable, token, self._places))

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
        """A descriptor that is readable while this end has something to read or is at
        EOF, for ``select``, ``selectors`` and ``multiprocessing.connection.wait``.

        It is made on the first call; from then on each receive on this Connection
        costs one more round trip to the pipe (to learn whether more is left)."""
        self._check_closed()
        if self._lanes is not None and self._lanes[0] is not None:
            return self._lanes[0].reading.fileno()  # readable while there is something to read
        if self._signal is None:
            links.unlink_own(self._ref, self._end)  # readiness is the pipe's to tell
            self._signal = _ReadySignal(self._ref, self._end, watch=self._readable)
        return self._signal.fd

    def close(self) -> None:
        if self._signal is not None:
            self._signal.close()
        if not self._closed:
            self._closed = True
            try:
                links.unlink_own(self._ref, self._end)  # what is unread stays in the pipe
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
        self._send(Payload.pack(obj))

    def _send(self, payload: Payload) -> None:
        if self._closed or not self._writable:
            self._check_writable()
        if self._lanes is not None:
            self._lanes[1].send(payload)
            return
        if self._places is not None:  # (in order after this process's earlier sends)
            batches(self._ref, "lane_send_many", self._end).add(payload)
            return
        servant = self._servant
        route.send(self._ref, self._end, servant if servant or self._elsewhere else self._owner_servant(),
                   payload)

    def send_bytes(self, buf: Any, offset: int = 0, size: int | None = None) -> None:
        """Send bytes from a bytes-like object (a slice of it with ``offset``/``size``)."""
        self._check_closed()
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
        self._send(Payload.raw(bytes(view[offset:offset + size])))

    # -- receiving -----------------------------------------------------------------------
    def _owner_servant(self) -> "PipeServant | None":
        """The pipe's servant when it lives in this process, else None (asked once)."""
        servant = self._servant
        if servant is None and not self._elsewhere:
            if self._ref.is_local:
                servant = get_hub().servant(self._ref.oid)
                if servant is None:
                    raise ReferenceError(f"pipe {self._ref.oid} no longer exists in this process")
                self._servant = servant
            else:  # (a pipe of another process never becomes this one's)
                self._elsewhere = True
        return servant  # type: ignore[return-value]

    def _receive(self) -> Payload:
        if self._closed or not self._readable:
            self._check_readable()
        if self._lanes is not None:
            payload = self._lanes[0].receive()
            if payload is EOF:
                raise EOFError
            return payload
        if self._through_hub is not None:
            return self._through_hub.receive()
        servant = self._servant
        signal = self._signal
        payload = route.receive(self._ref, self._end,
                                servant if servant or self._elsewhere else self._owner_servant(),
                                may_link=signal is None)  # (readiness is the pipe's to tell)
        if signal is not None:
            signal.rearm()
        return payload

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
        if timeout is not None and type(timeout) is not float:  # (0.0 by default)
            check_timeout(timeout)
        if self._lanes is not None:
            return self._lanes[0].poll(timeout)
        if self._through_hub is not None:
            return self._through_hub.poll(timeout)
        return route.poll(self._ref, self._end, self._owner_servant(), timeout)

    def __repr__(self) -> str:
        return f"<Connection end={self._end} of {self._ref}{' closed' if self._closed else ''}>"


def _attach(ref: ObjectRef, end: int, readable: bool, writable: bool, token: bytes,
            places: tuple | None = None) -> Connection:
    ref.call("attach", end, token)
    return Connection(ref, end, readable, writable, places)


def Pipe(duplex: bool = True) -> tuple[Connection, Connection]:
    """Two connected ends; with ``duplex=False`` the first only receives, the second only sends."""
    servant = PipeServant(duplex)
    ref = get_hub().register(servant)
    servant.oid = ref.oid
    places = servant.places
    if duplex:
        return Connection(ref, 0, True, True, places), Connection(ref, 1, True, True, places)
    return Connection(ref, 0, True, False, places), Connection(ref, 1, False, True, places)


_closes = CastQueue("fiberlite-close")  # Connections collected without close()
