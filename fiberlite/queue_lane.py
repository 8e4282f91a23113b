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
import pickle
import queue
import time
from typing import Any, Callable

from .runtime.lanes.feeder import Feeder
from .runtime.lanes.lane import Lane
from .runtime.lanes.watch import Watch
from .runtime.shm import sync
from .runtime.lanes.shared import LanePlace, create, lane_at
from .runtime.links.frames import EOF
from .sharedctypes import RawArray
from .synchronize import Condition, Lock

ITEMS, UNFINISHED, TOTAL, WAITING, FRONT, SLEEPERS, SIGNAL, READERS, HELD = range(9)  # the state's words
# (TOTAL: items ever put; WAITING: readers waiting on the lane, see Lane.waiting; FRONT:
# items given back by readers of other machines, ahead of the lane, see
# runtime.lanes.lending.Front; SLEEPERS and SIGNAL: readers asleep while another watches
# the lane, and the word they sleep on, see runtime.lanes.watch; READERS: the processes
# that got from the queue, HELD: batches lent to a reader of another machine of which it
# may still hold items, see QueueState.begin_batch)


# an atomic add on a word at an address (the C extension's): without it, the counts
# change under the state's condition (and every reader waits on the lane)
_atomic_add = None if sync.PORTABLE else sync.add
_WORDS = None if sync.PORTABLE else (sync.load, sync.add, sync.wait, sync.wake)
# how long a get that does not block waits for a batch held by a reader of another machine
# (given back within runtime.lanes.lending.HOLD_SECONDS once that reader stops taking from it)
UNHELD_PATIENCE = 1.0
_loads = pickle.loads  # (what Payload.unpack does for a pickle without out-of-band buffers)


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

    def __init__(self, maxsize: int, joinable: bool, counts: Any = None, cond: Any = None,
                 watcher: Any = None) -> None:
        self.maxsize = maxsize
        self.joinable = joinable
        self.counts = RawArray("i", 9) if counts is None else counts
        self.cond = Condition() if cond is None else cond
        if watcher is None:  # held by the lane's watcher (False: no watch without the words)
            watcher = Lock() if _WORDS is not None else False
        self.watcher = watcher
        self._items = _address(self.counts, ITEMS) if not maxsize else None
        self._total = _address(self.counts, TOTAL)
        self.waiting = _address(self.counts, WAITING)
        self._front = _address(self.counts, FRONT)
        # an unbounded JoinableQueue's count of unfinished tasks changes by atomic additions
        # too; its condition is taken only to wake join() when the count reaches 0
        self._unfinished = _address(self.counts, UNFINISHED) if joinable and not maxsize else None

    def __reduce__(self):
        return (QueueState, (self.maxsize, self.joinable, self.counts, self.cond, self.watcher))

    def watch(self) -> Watch | None:
        """Which of this machine's readers waits on the lane (None: each of them)."""
        mutex = getattr(self.watcher, "_mutex", None)  # (None: the lock is its creator's)
        sleepers, signal = _address(self.counts, SLEEPERS), _address(self.counts, SIGNAL)
        if mutex is None or sleepers is None or signal is None or _WORDS is None:
            return None
        return Watch(mutex, sleepers, signal, _WORDS)

    def reserve(self, block: bool, timeout: float | None) -> None:
        """Count one more item (waiting for room in a bounded queue: ``queue.Full``)."""
        if self._items is not None:
            if self._unfinished is not None:  # (first: unfinished before it can be taken)
                _atomic_add(self._unfinished, 1)
            _atomic_add(self._total, 1)
            _atomic_add(self._items, 1)
            return None
        return self._reserve_locked(block, timeout)

    def _reserve_locked(self, block: bool, timeout: float | None) -> None:
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

    def add_front(self, delta: int) -> None:
        """``delta`` more items given back ahead of the lane."""
        if self._front is not None:
            _atomic_add(self._front, delta)
            return
        with self.cond:
            self.counts[FRONT] += delta

    # -- the order of gets: batches lent only to a sole reader --------------------------
    # A reader of another machine may be lent several items in one call (it holds those
    # its get did not return, runtime.lanes.lending). A get returns the oldest item, as
    # multiprocessing's does: so no other reader may get an item from behind a batch that
    # is held. A batch is lent only while its reader is the queue's one reader, and a
    # reader that comes waits until no batch is held; after that every call lends one.
    def reader_joins(self) -> None:
        """One more process gets from the queue (counted once, for good)."""
        with self.cond:
            self.counts[READERS] += 1

    def reader_leaves(self) -> None:
        """A reader of another machine has gone."""
        with self.cond:
            self.counts[READERS] -= 1

    def begin_batch(self, most: int) -> int:
        """How many items a reader of another machine (counted in READERS) may be lent:
        ``most`` while it is the queue's one reader (its batch then counts as held until
        :meth:`end_batch`), else one."""
        if most <= 1 or self.counts[READERS] > 1:  # (a count that never grows back to 1
            return 1                                 # but when a reader of another machine goes)
        with self.cond:
            if self.counts[READERS] > 1:
                return 1
            self.counts[HELD] += 1
        return most

    def end_batch(self) -> None:
        """A batch of :meth:`begin_batch` is no longer held (consumed, or given back)."""
        with self.cond:
            self.counts[HELD] -= 1
            self.cond.notify_all()

    def wait_unheld(self, timeout: float | None, own: Callable[[], int] = lambda: 0) -> bool:
        """Wait until no batch is held but the caller's ``own()``: False after ``timeout``."""
        if not self.counts[HELD]:  # (nearly always: a batch is lent to a sole reader only)
            return True
        deadline = None if timeout is None else time.monotonic() + timeout
        with self.cond:
            while self.counts[HELD] > own():
                left = None if deadline is None else deadline - time.monotonic()
                if left is not None and left <= 0:
                    return False
                self.cond.wait(left)
        return True

    def qsize(self) -> int:
        return max(0, self.counts[ITEMS])

    def total(self) -> int:
        """Items ever put (modulo 2**32)."""
        return self.counts[TOTAL] & 0xFFFFFFFF

    def task_done(self) -> None:
        if self._unfinished is not None:
            old = _atomic_add(self._unfinished, -1)  # (the word's old value, unsigned)
            if old == 0 or old & 0x80000000:
                _atomic_add(self._unfinished, 1)
                self._notify_joiners()  # (a join() that saw the count below 0 meanwhile)
                raise ValueError("task_done() called too many times")
            if old == 1:
                self._notify_joiners()
            return
        with self.cond:
            if self.counts[UNFINISHED] <= 0:
                raise ValueError("task_done() called too many times")
            self.counts[UNFINISHED] -= 1
            if self.counts[UNFINISHED] == 0:
                self.cond.notify_all()

    def _notify_joiners(self) -> None:
        """Wake the join() calls (which look at the count under the condition: one that
        found it above 0 waits, and hears this, since it is sent under the condition)."""
        with self.cond:
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
        if lane is not None and state.waiting is not None:
            lane.waiting = (_atomic_add, state.waiting)
        if lane is not None:
            lane.watch = state.watch()
        self.watcher: Any = None  # called after each put and get of this process (the page)
        # takes up to n of the items given back ahead of the lane (runtime.lanes.lending.Front):
        # the creator's own, or a call to it
        self.take_front: Callable[[int], list] | None = None
        self._reader = False  # counted in the state's READERS
        self._reading = False  # and no batch lent before it is held (see QueueState.begin_batch)

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
        self.feeder.send(payload)
        if self.watcher is not None:
            self.watcher()

    def send(self, payload: Any) -> None:
        """Send ``payload`` without waiting for a reader (see :class:`Feeder`)."""
        self.feeder.send(payload)

    def flush(self, timeout: float | None = None) -> bool:
        return self.feeder.flush(timeout)

    # -- getting -----------------------------------------------------------------------
    def get(self, block: bool = True, timeout: float | None = None) -> Any:
        """The next item's payload (``queue.Empty`` after ``timeout``, or at once): one
        given back ahead of the lane first."""
        if not self._reading:
            timeout = self._start_reading(block, timeout)
        counts = self.state.counts
        if counts[FRONT]:
            payload = self._from_front(block, timeout)
        else:
            payload = self.lane.receive((None if timeout is None else max(0.0, timeout)) if block else 0.0,
                                        self._front_waits)
            if payload is None:
                if not (block and counts[FRONT]):
                    raise queue.Empty
                payload = self._from_front(block, timeout)  # (given back while this waited)
        if payload is None or payload is EOF:
            raise queue.Empty
        self.state.taken()
        if self.watcher is not None:
            self.watcher()
        return payload

    def get_object(self, block: bool = True, timeout: float | None = None) -> Any:
        """The next item itself, unpickled (:meth:`get`): taken at once when one is in
        the lane now and none was given back ahead of it, as nearly always while items come."""
        if self._reading and not self.state.counts[FRONT]:
            got = self.lane.receive_now()
            if got is not None and got is not EOF:
                self.state.taken()
                if self.watcher is not None:
                    self.watcher()
                return _loads(got) if type(got) is bytes else got.unpack()
        return self.get(block, timeout).unpack()

    def _start_reading(self, block: bool, timeout: float | None) -> float | None:
        """This process's first get: counted as a reader, it waits until no reader of
        another machine holds a batch (``queue.Empty`` after ``timeout``); what is left
        of ``timeout``."""
        if not self._reader:
            self.state.reader_joins()
            self._reader = True
        start = time.monotonic()
        if not self.state.wait_unheld(timeout if block else UNHELD_PATIENCE):
            raise queue.Empty
        self._reading = True
        return None if timeout is None else max(0.0, timeout - (time.monotonic() - start))

    def _front_waits(self) -> bool:
        return bool(self.state.counts[FRONT]) and self.take_front is not None

    def _from_front(self, block: bool, timeout: float | None) -> Any:
        """The first item given back ahead of the lane, or (another reader was first) the
        lane's next."""
        got = self.take_front(1) if self.take_front is not None else []
        if got:
            return got[0]
        return self.lane.receive((None if timeout is None else max(0.0, timeout)) if block else 0.0)

    def lend(self, most: int, wait: float = 0.0) -> list:
        """Up to ``most`` payloads from the lane, for a reader of another machine: the
        first within ``wait`` seconds, then those there now. They are still counted in
        the queue until :meth:`consumed` (or go back ahead of the lane: ``take_front``)."""
        lent: list = self.take_front(most) if self.state.counts[FRONT] and self.take_front else []
        receive = self.lane.receive
        while len(lent) < most:
            payload = receive(0.0 if lent else wait)
            if payload is None or payload is EOF:
                break
            lent.append(payload)
        return lent

    def consumed(self) -> None:
        """An item lent was consumed: it leaves the queue."""
        self.state.taken()
        if self.watcher is not None:
            self.watcher()

    def empty(self) -> bool:
        return not (self.state.counts[FRONT] or self.lane.poll(0))
