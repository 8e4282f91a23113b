"""How a process learns that an end of a pipe has become readable.

Each process has one mailbox, a servant in its own hub, to which a pipe's servant
(:mod:`fiberlite.connection.servant`) sends a notice once a watched end has
something to read or is at EOF. ``Connection.fileno()``
(:mod:`fiberlite.connection.pipe`) turns those notices into a readable descriptor
(``_ReadySignal``); :func:`fiberlite.connection.wait` (:mod:`fiberlite.connection.waiting`)
waits for them directly.
"""
from __future__ import annotations

import itertools
import os
import threading
from typing import Callable

from ..runtime.hub import ObjectRef, Servant, get_hub


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
