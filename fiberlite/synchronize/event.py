"""``Event``: a flag in shared memory, and a count of those who sleep on it.

``is_set`` reads the flag; ``set`` writes it and wakes the sleepers (one system call,
and only when someone sleeps); ``wait`` sleeps on the flag's own word (a futex).
Processes that cannot map it go through its creator's hub.
"""
from __future__ import annotations

import threading
from ctypes import addressof, c_uint32
from typing import Any

from ..runtime.hub import current_hub
from ..runtime.shm import sync
from ..units import check_timeout
from ..runtime.shm.arena import Block, arena
from ..runtime.shm.remote import NOT_YET, Waits
from .shared import BlockServant, SharedPrimitive, blocking_call, remote_call, remote_post

__all__ = ["Event"]

WORDS_BYTES = 8  # the flag, the sleepers
EVENT_BYTES = WORDS_BYTES + sync.WORD_SPARE  # and what the implementation keeps beside a waited word


def _cells(buffer: Any, offset: int) -> tuple[memoryview, Any, int]:
    """The event's words, its flag as a waited word, and the address of its sleepers."""
    words = memoryview(buffer)[offset:offset + WORDS_BYTES].cast("I")
    return (words, sync.word(buffer, offset, offset + WORDS_BYTES),
            addressof(c_uint32.from_buffer(buffer, offset + 4)))


class _Once:
    """A request answered by whichever comes first (the rest are ignored); ``done()``
    is called at the first answer."""

    __slots__ = ("_request", "peer", "_done", "_lock")

    def __init__(self, request: Any, done: Any) -> None:
        self._request, self.peer, self._done = request, request.peer, done
        self._lock = threading.Lock()

    def _first(self) -> Any:
        """The request, to the first answer only (None after)."""
        with self._lock:
            request, self._request = self._request, None
        if request is not None:
            self._done()
        return request

    def reply(self, value: Any = None) -> None:
        request = self._first()
        if request is not None:
            request.reply(value)

    def fail(self, exc: BaseException) -> None:
        request = self._first()
        if request is not None:
            request.fail(exc)


class EventServant(BlockServant):
    """An event in its creator's hub: acts for the jobs that cannot map it. A ``set()``
    of the creator itself answers a job's wait at once, on the setter's thread
    (:meth:`answer_waits`), which spares the round trip a thread's wake-up, and so does
    a job's ``set()`` that comes through the hub. A job's wait needs no thread while
    those are the only ones that can set the event (no other process of this machine
    was handed its memory): it is parked (looked at again every slice, as a lock's
    parked call); else it waits on a thread of the hub."""

    def __init__(self, block: Block) -> None:
        super().__init__(block)
        self.words, self.flag, self.sleepers = _cells(block.buffer, block.offset)
        self.waiting: dict[tuple, _Once] = {}  # the jobs' waits under way

    def make_waits(self) -> Waits:
        segment, own = self.block.segment, arena()
        return Waits(parkable=lambda: not own.handed_out(segment))

    def answer_waits(self) -> None:
        """(the creator, having set the event) Answer every job's wait under way: True."""
        for once in list(self.waiting.values()):
            once.reply(True)

    def op_cancel(self, request, pid: int, tid: int, ticket: int, undo_grant: bool = False) -> None:
        self.waiting.pop((request.peer, pid, tid, ticket), None)
        super().op_cancel(request, pid, tid, ticket, undo_grant)

    def peer_lost(self, peer: int) -> None:
        for key in [key for key in self.waiting if key[0] == peer]:
            self.waiting.pop(key, None)
        super().peer_lost(peer)

    def op_set(self, request) -> None:
        sync.set_and_wake(self.flag, 1, self.sleepers)
        if self.waiting:
            self.answer_waits()
        request.reply()

    def op_clear(self, request) -> None:
        self.words[0] = 0
        request.reply()

    def op_is_set(self, request) -> None:
        request.reply(bool(self.words[0]))

    def op_wait(self, request, timeout: float | None, pid: int, tid: int, ticket: int) -> None:
        if self.words[0] or (timeout is not None and timeout <= 0):
            request.reply(bool(self.words[0]))
            return
        flag, sleepers, words = self.flag, self.sleepers, self.words
        key = (request.peer, pid, tid, ticket)

        def attempt(seconds: float | None) -> Any:  # (None: a look, for a parked wait)
            if seconds is None:
                return True if words[0] else NOT_YET
            return True if sync.wait_while(flag, 0, sleepers, seconds) else NOT_YET

        def answered() -> None:
            self.waiting.pop(key, None)
            self.waits.cancel(key)
        once = self.waiting[key] = _Once(request, answered)
        if self.words[0]:  # set meanwhile, perhaps by the creator, which did not see this wait
            once.reply(True)
            return
        self.waits.start(once, key, attempt, timeout, False, parks=True)


class Event(SharedPrimitive):
    """An event flag (``multiprocessing.Event``)."""

    _waiting: dict = {}  # (in the creator) its servant's waits of jobs, answered by set()

    def __init__(self, *, ctx: Any = None) -> None:
        block = self._create(EVENT_BYTES, EventServant)
        sync.setup_word(block.buffer, block.offset)
        self._publish()
        self._servant = current_hub().servant(self._ref.oid)
        self._waiting = self._servant.waiting

    def _bind(self, buffer: Any, offset: int, slot: int) -> None:
        self._words, self._flag, self._sleepers = _cells(buffer, offset)

    def is_set(self) -> bool:
        if self._local:
            return self._words[0] != 0
        return remote_call(self._ref, "is_set")

    def set(self) -> None:
        """Set the flag and wake every waiter."""
        if self._local:
            sync.set_and_wake(self._flag, 1, self._sleepers)
            if self._waiting:
                self._servant.answer_waits()
        else:
            remote_post(self._ref, "set")

    def clear(self) -> None:
        if self._local:
            self._words[0] = 0
        else:
            remote_post(self._ref, "clear")

    def wait(self, timeout: float | None = None) -> bool:
        """Wait until the flag is set (or ``timeout``); return the flag."""
        if self._local:
            if self._words[0]:
                return True
            check_timeout(timeout)
            return sync.wait_while(self._flag, 0, self._sleepers, timeout) != 0
        check_timeout(timeout)
        return blocking_call(self._ref, "wait", timeout)

    def __repr__(self) -> str:
        try:
            state = "set" if self.is_set() else "unset"
        except Exception:
            state = "unknown"
        return f"<{type(self).__name__} at {id(self):#x} {state}>"
