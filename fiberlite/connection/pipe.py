"""``Pipe()`` and ``Connection``: two ends that may live in any two jobs.

Both ends are served by the hub of the process that created the pipe: each end reads
from its own channel and writes into the other's. The pipe knows which processes hold
each end (a Connection closes when it is collected, as in ``multiprocessing``); once
every holder of one end has closed it (or exited), the other end reads what is left
and then gets ``EOFError``, and writing to it raises ``BrokenPipeError``. When neither
end is held any more, the pipe leaves its hub. An end read by one other job alone is
linked to it (:mod:`fiberlite.runtime.pipelink`): what is sent to it goes straight to that job.
"""
from __future__ import annotations

import collections
import itertools
import os
import threading
import time
from typing import Any, Callable, Iterable

from ..runtime import pipelink
from ..runtime.channel import Channel
from ..runtime.handles import job_exports
from ..errors import BufferTooShort
from ..runtime.finalizing import CastQueue
from ..runtime.hub import LOCAL_PEER, ObjectRef, Servant, get_hub
from ..runtime.linkhost import LinkingServant
from .listener import Client, Listener, SocketConnection
from ..wire.codec import Payload

__all__ = ["Pipe", "Connection", "wait", "Listener", "Client", "SocketConnection"]


class PipeServant(LinkingServant):
    """Two channels and the holders of each end."""

    def __init__(self, duplex: bool) -> None:
        super().__init__()
        # inbox[e] holds what end e will read
        self.inbox = (Channel(), Channel())
        # how many Connection objects each process holds, per end
        self.holders = (collections.Counter({LOCAL_PEER: 1}), collections.Counter({LOCAL_PEER: 1}))
        self.oid: int | None = None  # set by Pipe(): dropped from the hub once both ends are
        # ends pickled for another job and not attached there yet: end -> export tokens
        self.pending: tuple[set[bytes], set[bytes]] = (set(), set())
        # wait() calls to tell when an end becomes readable: end -> {token: readiness ref}
        self.watchers: tuple[dict, dict] = ({}, {})
        if not duplex:
            self.never_link.add(1)  # end 1 only writes: nobody reads it
            self.inbox[1].close_writers()

    def op_send(self, request, end: int, payload: Payload) -> None:
        target = 1 - end
        with self._lock:
            # another writer than the job linked to `end` (it sends over its link): unlink
            actions = self._unlink(end) if end in self.links else []
            sent = None if self.inbox[target].readers_gone else self._forward(target, payload)
            if sent:
                actions.append(request.reply)
            else:
                if sent is False:  # the reader leaves it unread until the link is full
                    actions += self._unlink(target)
                actions += self.inbox[target].put(request, payload, True, None, self.schedule_expiry)
                if self.watchers[target]:
                    actions += self._wake(target)
        self.run_actions(actions)

    def send_local(self, end: int, payload: Payload) -> bool:
        """A send of this process into the end linked to a job, straight over the link;
        False: send as usual."""
        if end in self.links or self.inbox[1 - end].readers_gone:
            return False
        return self.forward_local(1 - end, payload)

    def receive_linked(self, end: int, timeout: float | None = None, peek: bool = False) -> Any:
        """Read ``end`` in this process from the link of the job that writes into it
        (see :meth:`~fiberlite.runtime.linkhost.LinkingServant.receive_returned`)."""
        return self.receive_returned(1 - end, timeout, peek)

    # -- links (fiberlite.runtime.linkhost): a slot is the end the job reads ---------------------------
    def _forward_channel(self, end: int) -> Channel:
        return self.inbox[end]

    def _return_channel(self, end: int) -> Channel:
        return self.inbox[1 - end]

    def _readable(self, channel: Channel) -> list:
        end = self.inbox.index(channel)
        return self._wake(end) if self.watchers[end] else []

    def _may_link(self, end: int, peer: int) -> bool:
        inbox = self.inbox[end]
        allowed = {peer, LOCAL_PEER}
        return (not inbox.readers_gone and not inbox.held
                and set(self.holders[end]) <= allowed and set(self.holders[1 - end]) <= allowed
                and not self.pending[end] and not self.watchers[end]
                and not any(not w.done for w in inbox.getters)
                and not any(not w.done and w.request.peer != LOCAL_PEER
                            for w in self.inbox[1 - end].getters))

    def op_watch(self, request, end: int, token: tuple, readiness: ObjectRef) -> None:
        """Tell ``readiness`` once ``end`` has something to read (or EOF); the reply says
        whether it has already."""
        with self._lock:
            actions = self._unlink(end) + self._unlink(1 - end)  # readiness comes from the pipe
            inbox = self.inbox[end]
            ready = (bool(inbox.items) or inbox.writers_gone) and not inbox.held
            if not ready:
                self.watchers[end][token] = readiness
        request.reply(ready)
        self.run_actions(actions)

    def op_unwatch(self, request, end: int, token: tuple) -> None:
        with self._lock:
            self.watchers[end].pop(token, None)
        request.reply()

    def _wake(self, end: int) -> list:
        inbox = self.inbox[end]
        if inbox.held or not (inbox.items or inbox.writers_gone):
            return []
        watchers = list(self.watchers[end].items())
        self.watchers[end].clear()
        return [lambda t=token, r=ref: _tell_ready(r, t) for token, ref in watchers]

    def _other_reader(self, request, end: int) -> list:
        """``request`` reads ``end`` through the pipe: a job linked to ``end`` hands back
        what it has not read; a link carrying what is sent to ``end`` is read here no more
        unless this process reads. The lock is held."""
        actions = self._unlink(end)
        if request.peer != LOCAL_PEER:
            actions += self._unlink(1 - end)
        return actions

    def op_recv(self, request, end: int) -> None:
        with self._lock:
            actions = self._other_reader(request, end)
            actions += self.inbox[end].get(request, True, None, self.schedule_expiry)
        self.run_actions(actions)

    def op_poll(self, request, end: int, timeout: float | None) -> None:
        with self._lock:
            actions = self._other_reader(request, end)
            actions += self.inbox[end].get(request, timeout is None or timeout > 0, timeout,
                                           self.schedule_expiry, peek=True)
        self.run_actions(actions)

    def op_export(self, request, end: int, token: bytes) -> None:
        with self._lock:
            self.pending[end].add(token)
            actions = self._unlink(0) + self._unlink(1)  # on its way to another job
        request.reply()
        self.run_actions(actions)

    def op_attach(self, request, end: int, token: bytes) -> None:
        with self._lock:
            self.pending[end].discard(token)
            self.holders[end][request.peer] += 1
        request.reply()

    def op_expire(self, request, end: int, token: bytes) -> None:
        """The job an end was pickled for ended without attaching it: forget the export."""
        with self._lock:
            if token not in self.pending[end]:
                actions: list = []
            else:
                self.pending[end].discard(token)
                actions = self._check_end(end)
        request.reply()
        self.run_actions(actions)

    def op_close(self, request, end: int) -> None:
        with self._lock:
            holders = self.holders[end]
            holders[request.peer] -= 1
            actions = []
            if holders[request.peer] <= 0:
                del holders[request.peer]
                link = self.links.get(end)
                if link is not None and link.reader_peer == request.peer:
                    actions = self._unlink(end)  # what it leaves unread stays for the end's other holders
            actions += self._check_end(end)
        request.reply()
        self.run_actions(actions)

    def _check_end(self, end: int) -> list:
        if self.holders[end] or self.pending[end]:
            return []
        other = 1 - end
        if self.oid is not None and not (self.holders[other] or self.pending[other]):
            get_hub().unregister(self.oid)  # nobody holds either end: the pipe is gone
            self.oid = None
        # nobody holds `end` any more: its peer reads EOF, writes to it break
        return (self.inbox[other].close_writers() + self._forward_eof(other)
                + self.inbox[end].close_readers() + self._wake(other))

    def peer_lost(self, peer: int) -> None:
        for end, link in self.links_of(peer):  # what it sent before it went is read before EOF
            self._link_lost(end, link)
        actions: list = []
        with self._lock:
            for end in (0, 1):
                self.inbox[end].drop_peer(peer)
                if self.holders[end].pop(peer, 0):
                    actions += self._check_end(end)
        self.run_actions(actions)


class Connection:
    """One end of a :func:`Pipe` (``multiprocessing.connection.Connection``)."""

    _signal: "_ReadySignal | None" = None  # made by fileno()
    _servant: "PipeServant | None" = None  # the pipe, when it lives in this process

    def __init__(self, ref: ObjectRef, end: int, readable: bool, writable: bool) -> None:
        self._ref = ref
        self._end = end
        self._readable = readable
        self._writable = writable
        self._closed = False
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
        return (_attach, (self._ref, self._end, self._readable, self._writable, token))

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
        if self._signal is None:
            pipelink.unlink_own(self._ref, self._end)  # readiness is the pipe's to tell
            self._signal = _ReadySignal(self._ref, self._end, watch=self._readable)
        return self._signal.fd

    def close(self) -> None:
        if self._signal is not None:
            self._signal.close()
        if not self._closed:
            self._closed = True
            try:
                pipelink.unlink_own(self._ref, self._end)  # what is unread stays in the pipe
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
        self._check_writable()
        reader = pipelink.reader_of(self._ref, self._end)
        if reader is not None:  # linked: over the link, after what was sent over it before
            try:
                return reader.send(payload)
            except pipelink.Unlinked:
                reader.wait_done()
        elif (self._servant is not None or self._ref.is_local) and \
                self._local_servant().send_local(self._end, payload):
            return
        self._ref.cast("send", self._end, payload)

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
    def _local_servant(self) -> PipeServant:
        servant = self._servant
        if servant is None:
            servant = get_hub().servant(self._ref.oid)
            if servant is None:
                raise ReferenceError(f"pipe {self._ref.oid} no longer exists in this process")
            self._servant = servant
        return servant  # type: ignore[return-value]

    def _receive(self) -> Payload:
        self._check_readable()
        while True:
            reader = pipelink.reader_of(self._ref, self._end)
            if reader is not None:
                try:
                    return reader.receive()
                except pipelink.Unlinked:
                    reader.wait_done()  # what it had not read is back with the pipe
            elif self._servant is not None or self._ref.is_local:
                payload = self._local_servant().receive_linked(self._end)
                if payload is not None:
                    return payload
            payload = self._ref.call("recv", self._end)
            if payload is not pipelink.RETRY:  # (RETRY: a link was made meanwhile)
                break
        if self._signal is not None:
            self._signal.rearm()
        elif not self._ref.is_local:
            pipelink.used_through_hub(self._ref, self._end)
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
        deadline = None if timeout is None else time.monotonic() + timeout
        while True:
            reader = pipelink.reader_of(self._ref, self._end)
            if reader is not None:
                try:
                    return reader.poll(timeout)
                except pipelink.Unlinked:
                    reader.wait_done()
            elif self._ref.is_local:
                ready = self._local_servant().receive_linked(self._end, timeout, peek=True)
                if ready is not None:
                    return ready
            ready = self._ref.call("poll", self._end, timeout)
            if ready is not pipelink.RETRY:
                return ready
            if deadline is not None:
                timeout = max(0.0, deadline - time.monotonic())

    def __repr__(self) -> str:
        return f"<Connection end={self._end} of {self._ref}{' closed' if self._closed else ''}>"


def _attach(ref: ObjectRef, end: int, readable: bool, writable: bool, token: bytes) -> Connection:
    ref.call("attach", end, token)
    return Connection(ref, end, readable, writable)


def Pipe(duplex: bool = True) -> tuple[Connection, Connection]:
    """Two connected ends; with ``duplex=False`` the first only receives, the second only sends."""
    servant = PipeServant(duplex)
    ref = get_hub().register(servant)
    servant.oid = ref.oid
    if duplex:
        return Connection(ref, 0, True, True), Connection(ref, 1, True, True)
    return Connection(ref, 0, True, False), Connection(ref, 1, False, True)


_closes = CastQueue("fiberlite-close")  # Connections collected without close()


# -- wait() ----------------------------------------------------------------------------------
def _tell_ready(readiness: ObjectRef, token: tuple) -> None:
    try:
        readiness.cast("ready", token)
    except (ConnectionError, ReferenceError):
        pass  # the waiting job has gone: nobody to tell


class _Readiness(Servant):
    """This process's mailbox for "your watched connection is readable" (one per process,
    never unregistered, so a late notice finds it and is ignored)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._waits: dict[int, Callable[[int], None]] = {}

    def open(self, wait_id: int, notify: Callable[[int], None]) -> None:
        """Call ``notify(index)`` for each notice of ``(wait_id, index)`` until :meth:`close`."""
        with self._lock:
            self._waits[wait_id] = notify

    def close(self, wait_id: int) -> None:
        with self._lock:
            self._waits.pop(wait_id, None)

    def op_ready(self, request, token: tuple) -> None:
        wait_id, index = token
        with self._lock:
            notify = self._waits.get(wait_id)
            if notify is not None:
                notify(index)
        request.reply()


_readiness: tuple[_Readiness, ObjectRef] | None = None
_readiness_lock = threading.Lock()
_wait_ids = itertools.count(1)


def _readiness_mailbox() -> tuple[_Readiness, ObjectRef]:
    global _readiness
    with _readiness_lock:
        hub = get_hub()
        if _readiness is None or _readiness[1].address != hub.address:
            servant = _Readiness()
            _readiness = (servant, hub.register(servant))
        return _readiness


class _ReadySignal:
    """An OS pipe whose read end is readable while a Connection's end has something to
    read (or is at EOF): what ``Connection.fileno()`` returns.

    The pipe's servant notifies this process's mailbox once the end becomes readable
    (a one-shot watch); after each receive the pipe is emptied and the watch set
    again, which answers at once when more is left. Notices carry the watch's
    generation, so one that arrives after a newer watch was set is ignored."""

    def __init__(self, ref: ObjectRef, end: int, watch: bool = True) -> None:
        self._ref, self._end = ref, end
        self._lock = threading.Lock()
        self._closed = False
        self._watch = watch   # False: the sending end of a one-way pipe, never readable
        self._generation = 0
        self.fd, self._w = os.pipe()
        os.set_blocking(self.fd, False)
        os.set_blocking(self._w, False)
        mailbox, self._mailbox_ref = _readiness_mailbox()
        self._mailbox = mailbox
        self._id = next(_wait_ids)
        mailbox.open(self._id, self._notice)
        self.rearm()

    def _notice(self, generation: int) -> None:
        with self._lock:
            if generation == self._generation:
                self._set()

    def _set(self) -> None:  # the lock is held
        if not self._closed:
            try:
                os.write(self._w, b"!")
            except BlockingIOError:
                pass  # already readable

    def rearm(self) -> None:
        """After a receive: readable again only if something is left (or at EOF)."""
        with self._lock:
            if self._closed or not self._watch:
                return
            self._generation += 1
            generation = self._generation
            try:
                while os.read(self.fd, 4096):
                    pass
            except BlockingIOError:
                pass
        ready = self._ref.call("watch", self._end, (self._id, generation), self._mailbox_ref)
        if ready:
            self._notice(generation)

    def close(self, wait: bool = True) -> None:
        """Close the pipe; ``wait=False`` (in a finalizer) gives up rather than wait for
        the lock, leaving the descriptors to the process's exit."""
        if not self._lock.acquire(blocking=wait):
            return
        try:
            if self._closed:
                return
            self._closed = True
            os.close(self.fd)
            os.close(self._w)
        finally:
            self._lock.release()
        if wait:
            self._mailbox.close(self._id)
            try:
                self._ref.cast("unwatch", self._end, (self._id, self._generation))
            except (ConnectionError, ReferenceError):
                pass


def wait(object_list: Iterable[Any], timeout: float | None = None) -> list[Any]:
    """Wait until one of ``object_list`` is ready, like ``multiprocessing.connection.wait``.

    Accepts fiberlite :class:`Connection` objects (ready: something to read, or EOF)
    together with anything the standard ``wait`` accepts (``Process.sentinel``, sockets,
    objects with ``fileno()``). Returns the ready ones; an empty list after ``timeout``.
    """
    from multiprocessing.connection import wait as os_wait
    objects = list(object_list)
    conns = [o for o in objects if isinstance(o, Connection)]
    others = [o for o in objects if not isinstance(o, Connection)]
    if not conns:
        return os_wait(others, timeout)
    for conn in conns:
        conn._check_readable()
        pipelink.unlink_own(conn._ref, conn._end)
    deadline = None if timeout is None else time.monotonic() + max(0.0, timeout)
    mailbox, mailbox_ref = _readiness_mailbox()
    wait_id = next(_wait_ids)
    woken, ready_indexes = threading.Event(), set()

    def notify(index: int) -> None:
        ready_indexes.add(index)
        woken.set()
    mailbox.open(wait_id, notify)
    watched: list[int] = []
    stop_r = stop_w = None
    try:
        for index, conn in enumerate(conns):
            if conn._ref.call("watch", conn._end, (wait_id, index), mailbox_ref):
                ready_indexes.add(index)
            else:
                watched.append(index)
        ready_others = os_wait(others, 0) if others else []
        if not ready_indexes and not ready_others:
            if others:  # the descriptors are watched by a thread that rings the same bell
                stop_r, stop_w = os.pipe()
                watcher = threading.Thread(target=_watch_descriptors, daemon=True,
                                           args=(others + [stop_r], stop_r, woken),
                                           name="fiberlite-wait")
                watcher.start()
            remaining = None if deadline is None else max(0.0, deadline - time.monotonic())
            woken.wait(remaining)
            if others:
                ready_others = os_wait(others, 0)
        ready = {id(conns[i]) for i in ready_indexes} | {id(o) for o in ready_others}
        return [o for o in objects if id(o) in ready]
    finally:
        mailbox.close(wait_id)
        if stop_w is not None:
            try:
                os.write(stop_w, b"x")  # the watcher thread returns and closes its end
            except BrokenPipeError:
                pass  # it has already returned
            os.close(stop_w)
        for index in watched:
            if index not in ready_indexes:
                try:
                    conns[index]._ref.cast("unwatch", conns[index]._end, (wait_id, index))
                except (ConnectionError, ReferenceError):
                    pass


def _watch_descriptors(objects: list, stop_r: int, woken: threading.Event) -> None:
    from multiprocessing.connection import wait as os_wait
    try:
        if stop_r not in os_wait(objects):
            woken.set()
    finally:
        os.close(stop_r)
