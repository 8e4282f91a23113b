"""A counting semaphore in shared memory without the C extension, that gives back a dead process's units.

The portable path's ``Semaphore`` (:mod:`.portable` says how names are made and by
whom). Its value and a table of the units each process holds are words of the shared
memory, changed only under a guard (a named semaphore of one unit) whose holder writes
its slot beside it; what sleeps is a second named semaphore that counts wake-ups, not
units. Every change is written to a journal first, as in the C extension, so that one
left half done by a process killed under the guard is finished by whoever takes the
guard next, and a guard left held by a killed process is taken back
(:func:`~.portable._taken_by`): a dead process's units always go back.

    value, bound, initial value, the guard's holder, sleepers, wake-ups posted,
    the journal (valid, value, index, slot, count), then (slot, units held) x HELD
"""
from __future__ import annotations

import time
from typing import Any

from ...units import check_timeout
from .portable import THREAD_BITS, VALUE_MAX, _check_slot, _create, _enter_guard, _open, _taken_by

HELD = 24
UNBOUNDED = 0xFFFFFFFF
(S_VALUE, S_MAX, S_INITIAL, S_GUARD, S_SLEEPERS, S_POSTED,
 J_VALID, J_VALUE, J_INDEX, J_SLOT, J_COUNT) = range(11)
S_HELD = 12
SEMAPHORE_BYTES = 4 * (S_HELD + 2 * HELD)


def setup_semaphore(buffer: Any, offset: int, value: int, maxvalue: int) -> None:
    """Lay out a semaphore (``maxvalue`` -1: unbounded) and make its named semaphores."""
    words = memoryview(buffer)[offset:offset + SEMAPHORE_BYTES].cast("I")
    for i in range(len(words)):
        words[i] = 0
    words[S_VALUE] = value
    words[S_MAX] = UNBOUNDED if maxvalue < 0 else maxvalue
    words[S_INITIAL] = value
    _create(buffer, offset, b"g", 1, 1)
    _create(buffer, offset, b"s", 0, VALUE_MAX)


class Semaphore:
    """Semaphore(buffer, offset, slot): a counting semaphore in shared memory that records
    the units each process holds."""

    __slots__ = ("_words", "_guard", "_wakes", "_slot")

    def __init__(self, buffer: Any, offset: int, slot: int) -> None:
        _check_slot(slot)
        self._words = memoryview(buffer)[offset:offset + SEMAPHORE_BYTES].cast("I")
        self._guard = _open(buffer, offset, b"g", 1)
        self._wakes = _open(buffer, offset, b"s", VALUE_MAX)
        self._slot = slot

    # -- under the guard ------------------------------------------------------------------
    def _enter(self) -> None:
        """Take the guard, and finish a change its last holder died in."""
        _enter_guard(self._guard)
        words = self._words
        words[S_GUARD] = self._slot << THREAD_BITS
        if words[J_VALID]:
            self._apply()

    def _leave(self) -> None:
        self._words[S_GUARD] = 0
        self._guard.release()

    def _apply(self) -> None:
        """Apply the journal's change (again: it may have been half applied)."""
        words = self._words
        words[S_VALUE] = words[J_VALUE]
        index = words[J_INDEX]
        if index < HELD:
            words[S_HELD + 2 * index] = words[J_SLOT] if words[J_COUNT] else 0
            words[S_HELD + 2 * index + 1] = words[J_COUNT]
        words[J_VALID] = 0

    def _commit(self, value: int, index: int, slot: int, count: int) -> None:
        words = self._words
        words[J_VALUE], words[J_INDEX], words[J_SLOT], words[J_COUNT] = value, index, slot, count
        words[J_VALID] = 1
        self._apply()

    def _index(self, slot: int, claim: bool) -> int:
        """The table entry of ``slot`` (or a free one when ``claim``); HELD: none."""
        words, free = self._words, HELD
        for i in range(HELD):
            who, count = words[S_HELD + 2 * i], words[S_HELD + 2 * i + 1]
            if count and who == slot:
                return i
            if not count and free == HELD:
                free = i
        return free if claim else HELD

    def _take(self, slot: int) -> bool:
        """(guard held) Take a unit for ``slot`` if there is one."""
        words = self._words
        value = words[S_VALUE]
        if not value:
            return False
        index = self._index(slot, True)
        count = 0
        if index < HELD:
            count = min(words[S_HELD + 2 * index + 1] + 1, words[S_INITIAL])
            if not count:
                index = HELD  # nothing to give back: not recorded
        self._commit(value - 1, index, slot, count)
        return True

    def _wake(self, count: int) -> None:
        """(guard held) Wake up to ``count`` sleepers not woken yet."""
        words = self._words
        n = min(count, words[S_SLEEPERS] - words[S_POSTED])
        if n > 0:
            words[S_POSTED] += n
            for _ in range(n):
                self._wakes.release()

    # -- operations -------------------------------------------------------------------------
    def acquire_as(self, slot: int, block: bool = True, timeout: float | None = None) -> bool:
        """Take a unit for the process of ``slot``, waiting up to ``timeout`` for one."""
        check_timeout(timeout)
        words = self._words
        deadline = None if timeout is None else time.monotonic() + max(0.0, timeout)
        while True:
            self._enter()
            try:
                if self._take(slot):
                    return True
                if not block:
                    return False
                words[S_SLEEPERS] += 1
            finally:
                self._leave()
            remaining = None if deadline is None else max(0.0, deadline - time.monotonic())
            try:
                woken = self._wakes.acquire(True, remaining)
            except BaseException:  # interrupted: no longer a sleeper, and takes nothing
                self._wake_up(False)
                raise
            if self._wake_up(woken, slot):
                return True
            if not woken:
                return False

    def _wake_up(self, woken: bool, slot: int = 0) -> bool:
        """A sleeper is awake (``woken``: by a wake-up): count it out, and with ``slot``
        take a unit for it if there is one."""
        words = self._words
        self._enter()
        try:
            words[S_SLEEPERS] -= 1
            if woken:
                words[S_POSTED] -= 1
            elif words[S_POSTED] > words[S_SLEEPERS] and self._wakes.acquire(False):
                words[S_POSTED] -= 1  # a wake-up meant for this sleeper, which has gone
            return bool(slot) and self._take(slot)
        finally:
            self._leave()

    def release_as(self, slot: int) -> None:
        """Give a unit back, as the process of ``slot`` (ValueError past a bounded one's value)."""
        words = self._words
        self._enter()
        try:
            value = words[S_VALUE]
            if words[S_MAX] != UNBOUNDED and value >= words[S_MAX]:
                raise ValueError("semaphore or lock released too many times")
            index = self._index(slot, False)
            count = words[S_HELD + 2 * index + 1] - 1 if index < HELD else 0
            self._commit(value + 1, index, slot, count)
            self._wake(1)
        finally:
            self._leave()

    def acquire(self, block: bool = True, timeout: float | None = None) -> bool:
        return self.acquire_as(self._slot, block, timeout)

    def release(self) -> None:
        self.release_as(self._slot)

    def __enter__(self) -> bool:
        return self.acquire()

    def __exit__(self, *exc: Any) -> None:
        self.release()

    def get_value(self) -> int:
        return self._words[S_VALUE]

    def recover(self, slot: int) -> int:
        """Give back the units the (dead) process of ``slot`` held; how many."""
        words = self._words
        if _taken_by(words, S_GUARD, slot, self._guard):  # it died holding the guard
            words[S_GUARD] = 0
            self._guard.release()
        self._enter()
        try:
            index = self._index(slot, False)
            if index == HELD:
                return 0
            back = words[S_HELD + 2 * index + 1]
            value = words[S_VALUE]
            if words[S_MAX] != UNBOUNDED and value + back > words[S_MAX]:
                back = max(0, words[S_MAX] - value)
            self._commit(value + back, index, 0, 0)
            self._wake(back)
            return back
        finally:
            self._leave()
