"""``Event``: a flag in shared memory, and a count of those who sleep on it.

``is_set`` reads the flag; ``set`` writes it and wakes the sleepers (one system call,
and only when someone sleeps); ``wait`` sleeps on the flag's own word (a futex).
Processes that cannot map it go through its creator's hub.
"""
from __future__ import annotations

from ctypes import addressof, c_uint32
from typing import Any

from ..runtime.shm import sync
from ..runtime.shm.arena import Block
from ..runtime.shm.remote import NOT_YET
from .shared import BlockServant, SharedPrimitive, blocking_call, remote_call

__all__ = ["Event"]

WORDS_BYTES = 8  # the flag, the sleepers
EVENT_BYTES = WORDS_BYTES + sync.WORD_SPARE  # and what the implementation keeps beside a waited word


def _cells(buffer: Any, offset: int) -> tuple[memoryview, Any, int]:
    """The event's words, its flag as a waited word, and the address of its sleepers."""
    words = memoryview(buffer)[offset:offset + WORDS_BYTES].cast("I")
    return (words, sync.word(buffer, offset, offset + WORDS_BYTES),
            addressof(c_uint32.from_buffer(buffer, offset + 4)))


class EventServant(BlockServant):
    """An event in its creator's hub: acts for the jobs that cannot map it."""

    def __init__(self, block: Block) -> None:
        super().__init__(block)
        self.words, self.flag, self.sleepers = _cells(block.buffer, block.offset)

    def op_set(self, request) -> None:
        sync.set_and_wake(self.flag, 1, self.sleepers)
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
        flag, sleepers = self.flag, self.sleepers

        def attempt(seconds: float | None) -> Any:
            return True if sync.wait_while(flag, 0, sleepers, seconds) else NOT_YET
        self.waits.start(request, (request.peer, pid, tid, ticket), attempt, timeout, False)


class Event(SharedPrimitive):
    """An event flag (``multiprocessing.Event``)."""

    def __init__(self, *, ctx: Any = None) -> None:
        block = self._create(EVENT_BYTES, EventServant)
        sync.setup_word(block.buffer, block.offset)
        self._publish()

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
        else:
            remote_call(self._ref, "set")

    def clear(self) -> None:
        if self._local:
            self._words[0] = 0
        else:
            remote_call(self._ref, "clear")

    def wait(self, timeout: float | None = None) -> bool:
        """Wait until the flag is set (or ``timeout``); return the flag."""
        if self._local:
            if self._words[0]:
                return True
            return sync.wait_while(self._flag, 0, self._sleepers, timeout) != 0
        return blocking_call(self._ref, "wait", timeout)

    def __repr__(self) -> str:
        try:
            state = "set" if self.is_set() else "unset"
        except Exception:
            state = "unknown"
        return f"<{type(self).__name__} at {id(self):#x} {state}>"
