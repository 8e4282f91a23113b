"""``Event``: a flag in shared memory, and a count of those who sleep on it.

``is_set`` reads the flag; ``set`` writes it and wakes the sleepers (one system call,
and only when someone sleeps); ``wait`` sleeps on the flag's own word (a futex).
Processes that cannot map it go through its creator's hub.
"""
from __future__ import annotations

from ctypes import addressof, c_uint32
from typing import Any

from ..runtime.shm import _sync
from ..runtime.shm.arena import Block
from ..runtime.shm.remote import NOT_YET
from .shared import BlockServant, SharedPrimitive, blocking_call

__all__ = ["Event"]

EVENT_BYTES = 8  # the flag, the sleepers


def _cells(buffer: Any, offset: int) -> tuple[memoryview, int]:
    words = memoryview(buffer)[offset:offset + EVENT_BYTES].cast("I")
    return words, addressof(c_uint32.from_buffer(buffer, offset))


class EventServant(BlockServant):
    """An event in its creator's hub: acts for the jobs that cannot map it."""

    def __init__(self, block: Block) -> None:
        super().__init__(block)
        self.words, self.address = _cells(block.buffer, block.offset)

    def op_set(self, request) -> None:
        _sync.set_and_wake(self.address, 1, self.address + 4)
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
        address = self.address

        def attempt(seconds: float | None) -> Any:
            return True if _sync.wait_while(address, 0, address + 4, seconds) else NOT_YET
        self.waits.start(request, (request.peer, pid, tid, ticket), attempt, timeout, False)


class Event(SharedPrimitive):
    """An event flag (``multiprocessing.Event``)."""

    def __init__(self, *, ctx: Any = None) -> None:
        self._create(EVENT_BYTES, EventServant)
        self._publish()

    def _bind(self, buffer: Any, offset: int, slot: int) -> None:
        self._words, self._address = _cells(buffer, offset)

    def is_set(self) -> bool:
        if self._local:
            return self._words[0] != 0
        return self._ref.call("is_set")

    def set(self) -> None:
        """Set the flag and wake every waiter."""
        if self._local:
            _sync.set_and_wake(self._address, 1, self._address + 4)
        else:
            self._ref.call("set")

    def clear(self) -> None:
        if self._local:
            self._words[0] = 0
        else:
            self._ref.call("clear")

    def wait(self, timeout: float | None = None) -> bool:
        """Wait until the flag is set (or ``timeout``); return the flag."""
        if self._local:
            if self._words[0]:
                return True
            return _sync.wait_while(self._address, 0, self._address + 4, timeout) != 0
        return blocking_call(self._ref, "wait", timeout)

    def __repr__(self) -> str:
        try:
            state = "set" if self.is_set() else "unset"
        except Exception:
            state = "unknown"
        return f"<{type(self).__name__} at {id(self):#x} {state}>"
