"""``Semaphore`` and ``BoundedSemaphore``: a counter in shared memory that remembers its holders.

``acquire`` and ``release`` are the C methods of a
:class:`~fiberlite.runtime.shm.sync.Semaphore` in every process that maps it. Each
process's net acquisitions (up to the initial value) are recorded beside the counter,
so that when a process dies its units go back (:meth:`SemaphoreServant.recover`): a
semaphore used as a pool of ``n`` resources keeps ``n`` however its users end, while one
used as a signal (``Semaphore(0)``, released by one process and acquired by another)
gives nothing back.
"""
from __future__ import annotations

from typing import Any

from ..runtime.shm import sync
from ..units import check_timeout
from ..runtime.shm.arena import CREATOR_SLOT, Block
from .shared import BlockServant, SharedPrimitive, blocking_call, remote_call

__all__ = ["Semaphore", "BoundedSemaphore"]


class SemaphoreServant(BlockServant):
    """A semaphore in its creator's hub: acts for the jobs that cannot map it."""

    def __init__(self, block: Block) -> None:
        super().__init__(block)
        self.semaphore = sync.Semaphore(block.buffer, block.offset, CREATOR_SLOT)

    def recover(self, slot: int) -> None:
        self.semaphore.recover(slot)

    def holder(self, request, pid: int, tid: int) -> int:
        return self.users.slot(request.peer)  # a semaphore's units are held by processes

    def op_acquire(self, request, block: bool, timeout: float | None, pid: int, tid: int,
                   ticket: int) -> None:
        slot, semaphore = self.users.slot(request.peer), self.semaphore
        self.acquire_for(request, block, timeout, pid, tid, ticket,
                         lambda wait, seconds: semaphore.acquire_as(slot, wait, seconds),
                         lambda: semaphore.release_as(slot))

    def op_release(self, request) -> None:
        request.reply(self.semaphore.release_as(self.users.slot(request.peer)))

    def op_get_value(self, request) -> None:
        request.reply(self.semaphore.get_value())


class Semaphore(SharedPrimitive):
    """A counting semaphore (``multiprocessing.Semaphore``)."""

    _bounded = False

    def __init__(self, value: int = 1, *, ctx: Any = None) -> None:
        if value < 0:
            raise ValueError("semaphore initial value must be >= 0")
        block = self._create(sync.SEMAPHORE_BYTES, SemaphoreServant)
        sync.setup_semaphore(block.buffer, block.offset, value, value if self._bounded else -1)
        self._maxvalue = value
        self._publish()

    def _getstate(self) -> tuple:
        return (self._maxvalue,)

    def _setstate(self, state: tuple) -> None:
        (self._maxvalue,) = state

    def acquire(self, block: bool = True, timeout: float | None = None) -> bool:
        """Decrement the counter, waiting up to ``timeout`` while it is zero; True if done."""
        return self.acquire(block, timeout)  # (the instance's own, bound by _bind)

    def release(self) -> None:
        """Increment the counter (waking one waiter); ValueError past a bounded one's value."""
        self.release()

    def get_value(self) -> int:
        """The counter's value."""
        return self.get_value()

    def _bind(self, buffer: Any, offset: int, slot: int) -> None:
        self._semaphore = semaphore = sync.Semaphore(buffer, offset, slot)
        self.acquire = semaphore.acquire
        self.release = semaphore.release
        self.get_value = semaphore.get_value

    def _bind_remote(self) -> None:
        super()._bind_remote()
        self.acquire = self._acquire_remote
        self.release = self._release_remote
        self.get_value = self._get_value_remote

    def _acquire_remote(self, block: bool = True, timeout: float | None = None) -> bool:
        """Decrement the counter, waiting up to ``timeout`` while it is zero; True if done."""
        check_timeout(timeout)
        return blocking_call(self._ref, "acquire", block, timeout, undo_grant=True)

    def _release_remote(self) -> None:
        """Increment the counter (waking one waiter)."""
        remote_call(self._ref, "release")

    def _get_value_remote(self) -> int:
        return remote_call(self._ref, "get_value")

    def __enter__(self) -> bool:
        return self.acquire()

    def __exit__(self, *exc: Any) -> None:
        self.release()

    def _value_text(self) -> str:
        try:
            return str(self.get_value())
        except Exception:
            return "unknown"

    def __repr__(self) -> str:
        return f"<{type(self).__name__}(value={self._value_text()})>"


class BoundedSemaphore(Semaphore):
    """A semaphore whose release beyond the initial value raises ValueError."""

    _bounded = True

    def __repr__(self) -> str:
        return f"<BoundedSemaphore(value={self._value_text()}, maxvalue={self._maxvalue})>"
