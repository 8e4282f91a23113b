"""The receiving half of a link (:class:`Reading`), on either side: the reading job
takes what the owner forwards, the owner takes what the job sends back.

It is read by the receiving threads themselves, one at a time, with no thread in
between; a reader that has to give way (the link ends) is woken by cancelling its
receive.
"""
from __future__ import annotations

import collections
import threading
import time
from typing import Any, Callable

from ...wire.codec import Payload
from ...wire.link import Link, LinkCanceled, LinkClosed, LinkError, LinkTimeout
from .frames import Unlinked, is_marker, read_frame

DRAIN_TIMEOUT_MS = 30_000  # frames the owner sent before unlinking are on their way: wait for them
CANCEL_RETRY_SECONDS = 0.02
CANCEL_RETRY_MS = int(CANCEL_RETRY_SECONDS * 1000)
LOST_POLL_MS = 100  # waiting for what a peer sent, how often to look whether it has gone
LOST_WAIT_MS = 5_000  # how long a peer whose hub connection ended may keep its link


class Reading:
    """The receiving half of a link, read by the receiving threads themselves, one at a
    time (:attr:`lock`); what is taken and not yet consumed waits in :attr:`pending`."""

    def __init__(self, link: Link, keep_arrived: Callable[[], bool] | None = None) -> None:
        self.link = link
        self.lock = threading.Lock()
        self.pending: collections.deque = collections.deque()
        self.received = 0  # frames taken from the link
        self.stopped = False  # set (then the lock taken) to end the reading
        # once the link is lost: whether what had arrived is still read (asked once)
        self._keep_arrived = keep_arrived
        self._arrived_kept: bool | None = None

    def next(self, timeout: float | None) -> Any:
        """The next item, left in :attr:`pending`; None after ``timeout`` (None: no limit).
        :class:`Unlinked` once stopped, or once the link is lost and drained. The lock is held."""
        if self.pending:
            return self.pending[0]
        item = self._receive(timeout)
        if item is not None:
            self.pending.append(item)
        return item

    def take(self, timeout: float | None) -> Any:
        """As :meth:`next`, but a :class:`Payload` is consumed (taken out of
        :attr:`pending`); a marker (:data:`EOF`, :data:`END`) stays for the next reader."""
        pending = self.pending
        if pending:
            item = pending[0]
            if type(item) is Payload:
                pending.popleft()
            return item
        link = self.link
        if timeout is None and not self.stopped and not link.lost:  # as nearly always
            try:
                frame = link.recv(-1)
            except LinkError:
                pass  # (woken, or the peer went: look at the state the careful way)
            else:
                self.received += 1
                item = read_frame(frame)
                if type(item) is not Payload:
                    pending.append(item)
                return item
        item = self._receive(timeout)
        if item is not None and type(item) is not Payload:
            pending.append(item)
        return item

    def _receive(self, timeout: float | None) -> Any:
        """The next item from the link (None after ``timeout``)."""
        deadline = None if timeout is None else time.monotonic() + max(0.0, timeout)
        while True:
            if self.stopped:
                raise Unlinked
            lost = self.link.lost  # the peer has gone: what has arrived may still be read
            if lost and not self._read_arrived():
                raise Unlinked
            wait_ms = -1 if deadline is None else max(0, int((deadline - time.monotonic()) * 1000))
            try:
                frame = self.link.recv(0 if lost else wait_ms)
            except LinkTimeout:
                if lost:
                    raise Unlinked from None
                return None
            except (LinkCanceled, LinkClosed):
                continue  # woken to look at the state again
            self.received += 1
            return read_frame(frame)

    def _read_arrived(self) -> bool:
        if self._arrived_kept is None:
            self._arrived_kept = self._keep_arrived is None or self._keep_arrived()
        return self._arrived_kept

    def take_in(self) -> None:
        """Read what has arrived, if no other thread is reading (then it does), up to the
        first frame, left for the next read: the link counts the acknowledgements it
        carries in line on the way."""
        if self.pending or not self.lock.acquire(blocking=False):
            return
        try:
            if not self.stopped:
                frame = self.link.recv_nowait()
                if frame is not None:
                    self.received += 1
                    self.pending.append(read_frame(frame))
        finally:
            self.lock.release()

    def stop(self) -> None:
        """Make readers give up, and take the lock (woken if blocked on the link)."""
        self.stopped = True
        self.take_lock()

    def take_lock(self) -> None:
        while not self.lock.acquire(timeout=CANCEL_RETRY_SECONDS):
            self.link.cancel()

    def drain(self, until: Any = None, count: int | None = None) -> list:
        """Take the rest (lock held): up to ``count`` frames in all, or up to the item
        ``until``, or (neither) all that arrives until the peer's connection ends; the
        items, in order, without markers."""
        items = list(self.pending)
        self.pending.clear()
        finite = count is not None or until is not None
        deadline = time.monotonic() + (DRAIN_TIMEOUT_MS if finite else LOST_WAIT_MS) / 1000
        while (count is None or self.received < count) and (until is None or until not in items):
            lost = self.link.lost
            remaining = int((deadline - time.monotonic()) * 1000)
            if remaining <= 0 and not lost:
                break  # the peer neither sends nor goes: give up on it
            try:  # once lost, only what has arrived is left
                frame = self.link.recv(0 if lost else min(remaining, LOST_POLL_MS))
            except LinkTimeout:
                if lost:
                    break
                continue
            except LinkError:
                break
            self.received += 1
            items.append(read_frame(frame))
        return [item for item in items if not is_marker(item)]
