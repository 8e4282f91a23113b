"""What a process sent to a lane that had no room yet: kept here, in order, and fed to
the lane by a thread as readers make room (``multiprocessing``'s feeder thread); and
what a process of another machine sends to a lane, or puts into a queue through its
creator's hub, gathered into calls to that hub (:class:`Batches`).

A send never waits for a reader. Once one message waits, the next ones wait behind it,
so each sender's order holds. At exit (the ``links`` stage), a process waits while readers
keep taking what waits (as the stdlib joins its feeder thread), and not once none has
taken any for :data:`DRAIN_PATIENCE`; then what is left is handed to the lane's creator
when this process is not the creator (:attr:`Feeder.ref`: the object's reference, whose
``lane_feed`` takes the messages), so that a job can leave before its last messages are
read.
"""
from __future__ import annotations

import collections
import itertools
import threading
import weakref
from typing import Any

from .. import exit_order
from ...wire import oneway
from .lane import Lane

FEED_BATCH = 256  # messages a feeder sends between two looks at its backlog
FEED_SLICE = 0.005  # a feeder waiting for room looks again this often (the kernel wakes it only once
# three quarters of the lane are free) and sees whether its process is leaving
DRAIN_PATIENCE = 0.5  # at exit, how long a process waits for readers to take more
BATCH_FLUSH = 30.0  # at exit, how long another machine's process waits for its sends to land


class Feeder:
    """The messages this process sent to ``lane`` that wait for room."""

    def __init__(self, lane: Lane) -> None:
        self.lane = lane
        self.ref: Any = None  # where what is left is handed over at exit (None: the creator)
        self._backlog: collections.deque = collections.deque()
        self._feeding = False
        self._lock = threading.Lock()
        self._fed = threading.Condition(self._lock)
        self._thread: threading.Thread | None = None
        self._stop = False

    def send(self, payload: Any) -> None:
        """Send ``payload`` now, or after what waits already."""
        if not self._backlog and self.lane.send(payload, block=False):
            return
        with self._lock:
            self._backlog.append(payload.owned())
            if not self._feeding:
                self._feeding = True
                _feeders.add(self)
                self._thread = threading.Thread(target=self._feed, name="fiberlite-lane-feeder", daemon=True)
                self._thread.start()

    def _feed(self) -> None:
        while True:
            with self._lock:
                if not self._backlog or self._stop:
                    self._feeding = False
                    self._fed.notify_all()
                    return
                batch = list(itertools.islice(self._backlog, FEED_BATCH))
            sent = 0
            try:
                for payload in batch:  # (taken from the backlog only once sent)
                    if not self.lane.send(payload, block=False):
                        break
                    sent += 1
            except BaseException:  # no reader is left: what waits is dropped
                with self._lock:
                    self._backlog.clear()
                continue
            with self._lock:
                for _ in range(sent):
                    self._backlog.popleft()
            if sent < len(batch):
                self.lane.wait_writable(FEED_SLICE)

    def flush(self, timeout: float | None = None) -> bool:
        """Wait until what this process sent is in the lane; False after ``timeout``."""
        with self._lock:
            return self._fed.wait_for(lambda: not self._feeding, timeout)

    def drain(self) -> None:
        """Wait while readers keep taking what waits (see the module's docstring)."""
        while True:
            with self._lock:
                left = len(self._backlog)
            if not left or self.flush(DRAIN_PATIENCE):
                return
            with self._lock:
                if len(self._backlog) >= left:
                    return

    def hand_over(self) -> None:
        """What still waits goes to the lane's creator, which feeds it after this process
        has gone, in the same order."""
        with self._lock:
            self._stop = True
            thread = self._thread
        if thread is not None:
            thread.join()
        with self._lock:
            left, self._backlog = list(self._backlog), collections.deque()
        if left:
            self.ref.call("lane_feed", left)


_feeders: "weakref.WeakSet[Feeder]" = weakref.WeakSet()


def _at_exit() -> None:
    for feeder in list(_feeders):
        try:
            feeder.drain()
            if feeder.ref is not None and not feeder.ref.is_local:
                feeder.hand_over()
        except Exception:  # the creator has gone: nobody could read them
            pass


exit_order.at_exit("links", _at_exit)


class Batches:
    """The sends of this process to a lane it cannot reach (another machine): each is
    taken at once and they go to the creator's hub in batches, one call at a time, by a
    thread of their own, so that many cost one round trip and each sender's order holds
    (``method`` of ``ref`` takes the list, after ``args``)."""

    def __init__(self, ref: Any, method: str, *args: Any) -> None:
        self.ref, self.method, self.args = ref, method, args
        self._waiting: list = []
        self._busy = False
        self._lock = threading.Lock()
        self._done = threading.Condition(self._lock)
        self.error: BaseException | None = None

    def add(self, payload: Any) -> None:
        if self.error is not None:
            error, self.error = self.error, None
            raise error
        if oneway.unsettled:  # (what this process's one-way calls did is seen first; the
            oneway.settle(skip=Batches)  # gathered sends to other objects need no order)
        with self._lock:
            self._waiting.append(payload)
            if self._busy:
                return
            self._busy = True
            _batches.add(self)
            oneway.owe(self, self.flush)  # (whatever this process sends elsewhere waits for them)
        threading.Thread(target=self._send, name="fiberlite-lane-batches", daemon=True).start()

    def _send(self) -> None:
        oneway.exempt()  # (its calls carry what others wait for)
        while True:
            with self._lock:
                batch, self._waiting = self._waiting, []
                if not batch:
                    self._busy = False
                    oneway.paid(self)
                    self._done.notify_all()
                    return
            try:
                self.ref.call(self.method, *self.args, batch)
            except BaseException as exc:  # (raised by the sender's next send)
                self.error = exc

    def flush(self, timeout: float | None = None) -> bool:
        """Wait until what was added has reached the creator; False after ``timeout``."""
        with self._lock:
            return self._done.wait_for(lambda: not self._busy, timeout)


_batches: "weakref.WeakSet[Batches]" = weakref.WeakSet()
_senders: "weakref.WeakValueDictionary[tuple, Batches]" = weakref.WeakValueDictionary()
_senders_lock = threading.Lock()


def batches(ref: Any, method: str, *args: Any) -> Batches:
    """This process's one :class:`Batches` for ``method`` of the object ``ref`` (and ``args``)."""
    key = (ref.address, ref.oid, method, args)
    with _senders_lock:
        sender = _senders.get(key)
        if sender is None:
            sender = _senders[key] = Batches(ref, method, *args)
        return sender


def _flush_batches() -> None:
    for sender in list(_batches):
        sender.flush(BATCH_FLUSH)


exit_order.at_exit("links", _flush_batches)
