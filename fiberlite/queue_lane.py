"""A queue's items in a lane of its machine, as ``multiprocessing`` keeps them in a pipe.

The processes of the creator's machine put into and get from the queue's lane
(:mod:`fiberlite.runtime.lanes`) themselves: any number of producers and consumers,
one FIFO kept by the kernel, nothing in between. Beside the lane, a :class:`QueueState`
keeps what the lane cannot tell, in the creator's shared memory under one condition
variable: how many items are in the queue (``qsize``, a bounded queue's room) and, for a
``JoinableQueue``, how many were put and not yet marked done.

A put never waits for a consumer (but for a bounded queue's room): what the lane has no
room for waits in this process, in order, and a feeder thread sends it as readers make
room, as ``multiprocessing``'s feeder thread does. Processes of other machines use the
same lane and state through the creator's hub (:class:`~fiberlite.queues.QueueServant`).
"""
from __future__ import annotations

import ctypes
import queue
import time
from typing import Any

from .runtime.lanes.feeder import Feeder
from .runtime.lanes.lane import Lane
from .runtime.shm import sync
from .runtime.lanes.shared import LanePlace, create, lane_at
from .runtime.links.frames import EOF
from .sharedctypes import RawArray
from .synchronize import Condition

ITEMS, UNFINISHED, TOTAL = 0, 1, 2  # the state's counts (TOTAL: items ever put)


# an atomic add on a word at an address (the C extension's): without it, the counts
# change under the state's condition
_atomic_add = None if sync.PORTABLE else sync.add


def _address(counts: Any, index: int) -> int | None:
    """The address of ``counts[index]`` here, when it is memory of this machine and
    words there can be added to atomically."""
    if _atomic_add is None:
        return None
    try:
        return ctypes.addressof(counts) + index * ctypes.sizeof(ctypes.c_int)
    except TypeError:  # a proxy to another machine's memory (not used for the lane)
        return None


class QueueState:
    """A queue's counts in shared memory, and the condition that guards them.

    The count of items of an unbounded queue changes by atomic additions, without the
    lock; a bounded queue's changes under the condition, whose waiters wait for room."""

    def __init__(self, maxsize: int, joinable: bool, counts: Any = None, cond: Any = None) -> None:
        self.maxsize = maxsize
        self.joinable = joinable
        self.counts = RawArray("i", 3) if counts is None else counts
        self.cond = Condition() if cond is None else cond
        self._items = _address(self.counts, ITEMS) if not maxsize else None
        self._total = _address(self.counts, TOTAL)

    def __reduce__(self):
        return (QueueState, (self.maxsize, self.joinable, self.counts, self.cond))

    def reserve(self, block: bool, timeout: float | None) -> None:
        """Count one more item (waiting for room in a bounded queue: ``queue.Full``)."""
        if self._items is not None and not self.joinable:
            _atomic_add(self._total, 1)
            _atomic_add(self._items, 1)
            return
        counts, cond = self.counts, self.cond
        with cond:
            if self.maxsize and counts[ITEMS] >= self.maxsize:
                if not block:
                    raise queue.Full
                deadline = None if timeout is None else time.monotonic() + timeout
                while counts[ITEMS] >= self.maxsize:
                    left = None if deadline is None else deadline - time.monotonic()
                    if left is not None and left <= 0:
                        raise queue.Full
                    cond.wait(left)
            if self._items is not None:
                _atomic_add(self._items, 1)
            else:
                counts[ITEMS] += 1
            if self._total is not None:
                _atomic_add(self._total, 1)
            else:
                counts[TOTAL] += 1
            if self.joinable:
                counts[UNFINISHED] += 1

    def taken(self) -> None:
        """One item left the queue."""
        if self._items is not None:
            _atomic_add(self._items, -1)
            return
        with self.cond:
            self.counts[ITEMS] -= 1
            self.cond.notify()

    def qsize(self) -> int:
        return max(0, self.counts[ITEMS])

    def total(self) -> int:
        """Items ever put (modulo 2**32)."""
        return self.counts[TOTAL] & 0xFFFFFFFF

    def task_done(self) -> None:
        with self.cond:
            if self.counts[UNFINISHED] <= 0:
                raise ValueError("task_done() called too many times")
            self.counts[UNFINISHED] -= 1
            if self.counts[UNFINISHED] == 0:
                self.cond.notify_all()

    def join(self, timeout: float | None = None) -> bool:
        """Wait until every item put was marked done; False after ``timeout``."""
        deadline = None if timeout is None else time.monotonic() + timeout
        with self.cond:
            while self.counts[UNFINISHED]:
                left = None if deadline is None else deadline - time.monotonic()
                if left is not None and left <= 0:
                    return False
                self.cond.wait(left)
        return True


class QueueLane:
    """A queue's lane and state as this process uses them (``lane`` None: the lane is
    not reachable from here, and the queue goes through its creator's hub)."""

    def __init__(self, place: LanePlace, state: QueueState, lane: Lane | None) -> None:
        self.place = place
        self.state = state
        self.lane = lane
        self.feeder = Feeder(lane) if lane is not None else None
        self.watcher: Any = None  # called after each put and get of this process (the page)

    @classmethod
    def new(cls, maxsize: int, joinable: bool) -> tuple["QueueLane", Any]:
        """A new queue's lane and state, and what forgets the lane once the queue is gone."""
        lane, place, forget = create()
        return cls(place, QueueState(maxsize, joinable), lane), forget

    @classmethod
    def at(cls, place: LanePlace, state: QueueState) -> "QueueLane":
        return cls(place, state, lane_at(place))

    # -- putting -----------------------------------------------------------------------
    def put(self, payload: Any, block: bool = True, timeout: float | None = None) -> None:
        self.state.reserve(block, timeout)
        self.send(payload)
        if self.watcher is not None:
            self.watcher()

    def send(self, payload: Any) -> None:
        """Send ``payload`` without waiting for a reader (see :class:`Feeder`)."""
        self.feeder.send(payload)

    def flush(self, timeout: float | None = None) -> bool:
        return self.feeder.flush(timeout)

    # -- getting -----------------------------------------------------------------------
    def get(self, block: bool = True, timeout: float | None = None) -> Any:
        """The next item's payload (``queue.Empty`` after ``timeout``, or at once)."""
        payload = self.lane.receive((None if timeout is None else max(0.0, timeout)) if block else 0.0)
        if payload is None or payload is EOF:
            raise queue.Empty
        self.state.taken()
        if self.watcher is not None:
            self.watcher()
        return payload

    def empty(self) -> bool:
        return not self.lane.poll(0)
