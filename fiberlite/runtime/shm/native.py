"""The C extension's side of the seam that :mod:`.sync` chooses from.

``_sync`` (built from ``csrc/`` on Linux) holds the locks, semaphores and word waits on
futexes; what the portable path needs beyond them is a no-op here: zeroed memory is a
free mutex and a word anyone may wait on, and there are no names to remove. A waited
word is its address.
"""
from __future__ import annotations

from ctypes import addressof, c_uint32
from typing import Any

from ._sync import (HELD, MAX_SLOT, MUTEX_BYTES, SEMAPHORE_BYTES, THREAD_BITS, Mutex,
                    NotOwnedError, Semaphore, add, after_fork, load, set_and_wake, wait,
                    wait_while, wake)
from ._sync import setup_semaphore as setup_semaphore

WORD_SPARE = 0  # futexes need no bookkeeping beside the word


def word(buffer: Any, offset: int, spare: int) -> int:
    """The address of the word at ``offset`` of ``buffer``, as the word functions take it."""
    return addressof(c_uint32.from_buffer(buffer, offset))


def setup_mutex(buffer: Any, offset: int) -> None:
    """Nothing to do: zeroed memory is a free mutex."""


def setup_word(buffer: Any, offset: int) -> None:
    """Nothing to do: any word can be waited on."""


def mark_segment(buffer: Any) -> None:
    """Nothing to mark: a futex lives in the memory itself."""


def reachable(buffer: Any) -> bool:
    """A process that maps the memory can use its locks."""
    return True


def teardown(buffer: Any, offset: int, size: int) -> None:
    """Nothing to do: the memory is all there is."""


__all__ = ["HELD", "MAX_SLOT", "MUTEX_BYTES", "SEMAPHORE_BYTES", "THREAD_BITS", "WORD_SPARE",
           "Mutex", "NotOwnedError", "Semaphore", "add", "after_fork", "mark_segment", "reachable",
           "set_and_wake", "setup_mutex", "setup_semaphore", "setup_word", "teardown", "wait",
           "wait_while", "wake", "word"]
