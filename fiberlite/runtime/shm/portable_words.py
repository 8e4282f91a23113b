"""Words of shared memory that threads of any process wait on, without the C extension.

The portable path's stand-in for the C extension's futex waits (:mod:`.portable` says
how names are made and by whom): an event's flag, a condition's sequence number.
"""
from __future__ import annotations

import time
from typing import Any

from .portable import VALUE_MAX, _create, _enter_guard, _open

# a waited word's bookkeeping (WORD_SPARE bytes elsewhere): per parity of the wakes, its
# sleepers and the wake-ups posted to them and not yet taken; the number of wakes
SLEEPERS, POSTED, WAKES = 0, 2, 4
WORD_SPARE = 20
BACKOFF = 0.05  # seconds between looks at a wake-up that nobody else takes


def setup_word(buffer: Any, offset: int) -> None:
    """Lay out the waits of the word at ``offset``: its guard and its wake-ups."""
    _create(buffer, offset, b"w", 1, 1)
    _create(buffer, offset, b"p0", 0, VALUE_MAX)
    _create(buffer, offset, b"p1", 0, VALUE_MAX)


class Word:
    """A word of shared memory that threads of any process wait on (what a futex is to the
    C extension): a guard, and two semaphores of wake-ups.

    A futex wakes only the threads asleep on it at the time. A semaphore hands a wake-up
    to whichever thread takes it first, possibly one that came after the wake (it saw
    the word changed already, and waits for the next change), and the one it was for
    would sleep through it (a condition's waiter through its notification). So a
    sleeper waits on the semaphore of the parity of the wakes so far; a wake posts to
    the sleepers of the other parity first (those left from before the last wake), then
    to those of this one, and counts one wake more: who comes after it waits on the
    other semaphore. A sleeper that still takes a wake-up posted before it came (two
    wakes later) gives it back for the one it was for.
    """

    __slots__ = ("_words", "_spare", "_guard", "_posts")

    def __init__(self, buffer: Any, offset: int, spare: int) -> None:
        self._words = memoryview(buffer)[offset:offset + 4].cast("I")
        self._spare = memoryview(buffer)[spare:spare + WORD_SPARE].cast("I")
        self._guard = _open(buffer, offset, b"w", 1)
        self._posts = (_open(buffer, offset, b"p0", VALUE_MAX), _open(buffer, offset, b"p1", VALUE_MAX))

    def _post(self, count: int) -> None:
        """(guard held) Wake up to ``count`` sleepers not woken yet, the earlier ones first."""
        spare = self._spare
        now = spare[WAKES] & 1
        posts = []
        for parity in (now ^ 1, now):
            n = min(count - len(posts), spare[SLEEPERS + parity] - spare[POSTED + parity])
            if n > 0:
                spare[POSTED + parity] += n
                posts += [self._posts[parity]] * n
        if posts:  # counted before a sleeper can wake and look
            spare[WAKES] = (spare[WAKES] + 1) & 0xFFFFFFFF
            for semaphore in posts:
                semaphore.release()

    def wait(self, expected: int, timeout: float | None) -> bool:
        """Sleep while the word is ``expected``: False once ``timeout`` passed."""
        guard, spare = self._guard, self._spare
        _enter_guard(guard)
        if self._words[0] != expected:
            guard.release()
            return True
        wakes = spare[WAKES]
        parity = wakes & 1
        spare[SLEEPERS + parity] += 1
        guard.release()
        posts = self._posts[parity]
        deadline = None if timeout is None else time.monotonic() + max(0.0, timeout)
        woken = False
        given_back = 0
        try:
            while True:
                remaining = None if deadline is None else max(0.0, deadline - time.monotonic())
                woken = posts.acquire(True, remaining)
                if not woken or spare[WAKES] != wakes:
                    break
                posts.release()  # posted before this sleeper came: for an earlier one
                woken = False
                # let the earlier one take it; if none does (it died waiting), look again
                # ever more rarely, up to every BACKOFF seconds
                time.sleep(0 if given_back < 8 else min(BACKOFF, 0.001 * 2 ** (given_back - 8)))
                given_back += 1
        finally:
            _enter_guard(guard)
            spare[SLEEPERS + parity] -= 1
            if woken:
                spare[POSTED + parity] -= 1
            elif spare[POSTED + parity] > spare[SLEEPERS + parity] and posts.acquire(False):
                spare[POSTED + parity] -= 1  # a wake-up meant for this sleeper, which has gone
            guard.release()
        return woken

    def wake(self, count: int) -> None:
        _enter_guard(self._guard)
        try:
            self._post(count)
        finally:
            self._guard.release()

    def add(self, delta: int) -> int:
        _enter_guard(self._guard)
        try:
            old = self._words[0]
            self._words[0] = (old + delta) & 0xFFFFFFFF
            return old
        finally:
            self._guard.release()

    def set_and_wake(self, value: int) -> None:
        _enter_guard(self._guard)
        try:
            self._words[0] = value
            self._post(VALUE_MAX)
        finally:
            self._guard.release()


def word(buffer: Any, offset: int, spare: int) -> Word:
    """The word at ``offset`` as the functions below take it (``spare``: where its
    :data:`WORD_SPARE` bytes of bookkeeping are)."""
    return Word(buffer, offset, spare)


def wait(word: Word, expected: int, timeout: float | None = None) -> bool:
    """Sleep while the word is ``expected``; False once the timeout passed."""
    return word.wait(expected, timeout)


def wake(word: Word, count: int) -> None:
    word.wake(count)


def add(word: Word, delta: int) -> int:
    """Add ``delta``; the old value."""
    return word.add(delta)


def set_and_wake(word: Word, value: int, sleepers: Any = None) -> None:
    """Store ``value`` and wake every sleeper."""
    word.set_and_wake(value)


def wait_while(word: Word, value: int, sleepers: Any = None, timeout: float | None = None) -> int:
    """Sleep while the word is ``value`` (or until ``timeout``); the word's value then."""
    deadline = None if timeout is None else time.monotonic() + max(0.0, timeout)
    while True:
        now = word._words[0]
        if now != value:
            return now
        remaining = None if deadline is None else deadline - time.monotonic()
        if remaining is not None and remaining <= 0:
            return now
        word.wait(value, remaining)
