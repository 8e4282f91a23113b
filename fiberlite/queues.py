"""``Queue``, ``SimpleQueue`` and ``JoinableQueue`` shared by every job of a run.

The queue's state lives in the hub of the process that created it; other jobs reach
it over their authenticated connection to that hub. Items are pickled by the putter
and unpickled only by the getter. A put to an unbounded queue does not wait for the
hub's answer (like ``multiprocessing``'s feeder thread); a job waits for all its puts
to land before it exits, and ``join_thread()`` waits for them too.
"""
from __future__ import annotations

import queue
from typing import Any

from . import handles
from .channel import Channel
from .hub import LockedServant, ObjectRef
from .wire.codec import Payload

Empty = queue.Empty
Full = queue.Full


class QueueServant(LockedServant):
    """The state of one queue, in its creator's hub."""

    def __init__(self, maxsize: int) -> None:
        super().__init__()
        self.channel = Channel(maxsize)
        self.done = 0
        self.joiners: list = []

    @property
    def unfinished(self) -> int:
        return self.channel.enqueued - self.done

    def op_put(self, request, payload: Payload, block: bool = True, timeout: float | None = None) -> None:
        with self._lock:
            actions = self.channel.put(request, payload, block, timeout, self.schedule_expiry)
        self.run_actions(actions)

    def op_get(self, request, block: bool = True, timeout: float | None = None) -> None:
        with self._lock:
            actions = self.channel.get(request, block, timeout, self.schedule_expiry)
        self.run_actions(actions)

    def op_qsize(self, request) -> None:
        request.reply(len(self.channel.items))

    def op_task_done(self, request) -> None:
        with self._lock:
            if self.unfinished <= 0:
                request.fail(ValueError("task_done() called too many times"))
                return
            self.done += 1
            joiners = self.joiners if self.unfinished == 0 else []
            if joiners:
                self.joiners = []
        request.reply()
        for joiner in joiners:
            joiner.reply()

    def op_join(self, request) -> None:
        with self._lock:
            if self.unfinished:
                self.joiners.append(request)
                return
        request.reply()

    def peer_lost(self, peer: int) -> None:
        with self._lock:
            self.channel.drop_peer(peer)
            self.joiners = [r for r in self.joiners if r.peer != peer]


class Queue:
    """A process-shared FIFO queue (``multiprocessing.Queue``)."""

    def __init__(self, maxsize: int = 0, *, ctx: Any = None) -> None:
        if maxsize < 0:
            maxsize = 0
        self._maxsize = maxsize
        self._ref = handles.register(self, QueueServant(maxsize))
        self._closed = False

    def __reduce__(self):
        handles.exported(self._ref)
        return (_rebuild, (type(self), self._ref, self._maxsize))

    def _check_open(self) -> None:
        if self._closed:
            raise ValueError(f"Queue {self!r} is closed")

    def put(self, obj: Any, block: bool = True, timeout: float | None = None) -> None:
        """Put ``obj``; when the queue is full wait up to ``timeout`` (``queue.Full`` after)."""
        self._check_open()
        if self._maxsize:
            self._ref.call("put", Payload.pack(obj), block, timeout)
        else:  # an unbounded queue never makes a put wait
            self._ref.cast("put", Payload.pack(obj), block, timeout)

    def get(self, block: bool = True, timeout: float | None = None) -> Any:
        """Remove and return an item; wait up to ``timeout`` (``queue.Empty`` after)."""
        self._check_open()
        return self._ref.call("get", block, timeout).unpack()

    def put_nowait(self, obj: Any) -> None:
        self.put(obj, False)

    def get_nowait(self) -> Any:
        return self.get(False)

    def qsize(self) -> int:
        return self._ref.call("qsize")

    def empty(self) -> bool:
        return self.qsize() == 0

    def full(self) -> bool:
        return 0 < self._maxsize <= self.qsize()

    def close(self) -> None:
        """No more data will be put on or taken from this queue by this process."""
        self._closed = True

    def join_thread(self) -> None:
        """Wait until everything put by this process is in the queue."""
        assert self._closed, f"Queue {self!r} not closed"
        from .hub import flush
        flush()

    def cancel_join_thread(self) -> None:
        """Accepted for compatibility: puts are never left behind, so there is nothing to cancel."""

    def __repr__(self) -> str:
        return f"<{type(self).__name__} {self._ref.oid}@{self._ref.address}>"


class JoinableQueue(Queue):
    """A Queue with ``task_done()`` and ``join()``."""

    def task_done(self) -> None:
        """Mark one item taken with get() as processed."""
        self._ref.call("task_done")

    def join(self) -> None:
        """Wait until every item put has been marked done."""
        self._ref.call("join")


class SimpleQueue:
    """An unbounded queue with ``get``, ``put``, ``empty`` and ``close``."""

    def __init__(self, *, ctx: Any = None) -> None:
        self._ref = handles.register(self, QueueServant(0))
        self._closed = False

    def __reduce__(self):
        handles.exported(self._ref)
        return (_rebuild, (type(self), self._ref, 0))

    def _check_open(self) -> None:
        if self._closed:
            raise ValueError(f"SimpleQueue {self!r} is closed")

    def put(self, obj: Any) -> None:
        self._check_open()
        self._ref.cast("put", Payload.pack(obj), True, None)

    def get(self) -> Any:
        self._check_open()
        return self._ref.call("get", True, None).unpack()

    def empty(self) -> bool:
        return self._ref.call("qsize") == 0

    def close(self) -> None:
        self._closed = True

    def __repr__(self) -> str:
        return f"<SimpleQueue {self._ref.oid}@{self._ref.address}>"


def _rebuild(cls: type, ref: ObjectRef, maxsize: int) -> Any:
    obj = cls.__new__(cls)
    obj._ref = ref
    obj._maxsize = maxsize
    obj._closed = False
    handles.loaded(obj, ref)
    return obj
