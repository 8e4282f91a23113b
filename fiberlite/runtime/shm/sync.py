"""The locks, semaphores and waits of shared memory: which implementation, chosen once, here.

- :mod:`.native`: the C extension ``_sync`` on Linux futexes, when it was built (Linux
  with a C compiler) and the ``portable_sync`` setting is off;
- :mod:`.portable` (with :mod:`.portable_semaphore` and :mod:`.portable_words`): POSIX
  named semaphores through the standard library, everywhere else.

Both offer the same objects and functions; everything in fiberlite that acts on shared
memory imports them from here. The choice is made when this module is first imported,
from the settings then (``FIBERLITE_PORTABLE_SYNC=1`` in the environment, or
``portable_sync = true`` in the config file; children inherit it). Processes that chose
differently do not map each other's memory: the segment's header says which one laid
it out (:data:`KIND`), and a process of the other kind goes through the creator's hub.
"""
from __future__ import annotations

import logging
import sys

from ... import config

log = logging.getLogger(__name__)


def _reason() -> str:
    """Why the portable path is used before looking for the C extension (empty: look)."""
    if config.get("portable_sync"):
        return "the portable_sync setting asks for it"
    if not sys.platform.startswith("linux"):
        return f"the C extension needs Linux (this is {sys.platform})"
    return ""


REASON = _reason()
if not REASON:
    try:
        from .native import (HELD, MAX_SLOT, MUTEX_BYTES, SEMAPHORE_BYTES, THREAD_BITS,
                             WORD_SPARE, Mutex, NotOwnedError, Semaphore, add, after_fork,
                             load, mark_segment, reachable, set_and_wake, setup_mutex, setup_semaphore,
                             setup_word, teardown, wait, wait_while, wake, word)
    except ImportError as exc:
        REASON = f"the C extension is not built ({exc})"
if REASON:
    from .portable import (MAX_SLOT, MUTEX_BYTES, THREAD_BITS, Mutex, NotOwnedError,  # noqa: F811
                           after_fork, mark_segment, reachable, setup_mutex, teardown)
    from .portable_semaphore import HELD, SEMAPHORE_BYTES, Semaphore, setup_semaphore  # noqa: F811
    from .portable_words import (WORD_SPARE, add, set_and_wake, setup_word, wait,  # noqa: F811
                                 wait_while, wake, word)
    log.info("shared-memory locks use the portable path: %s", REASON)
PORTABLE = bool(REASON)
KIND = b"p" if PORTABLE else b"f"  # in each segment's header: who laid it out

__all__ = ["HELD", "KIND", "MAX_SLOT", "MUTEX_BYTES", "PORTABLE", "REASON", "SEMAPHORE_BYTES",
           "THREAD_BITS", "WORD_SPARE", "Mutex", "NotOwnedError", "Semaphore", "add",
           "after_fork", "mark_segment", "reachable", "set_and_wake", "setup_mutex", "setup_semaphore", "setup_word",
           "teardown", "wait", "wait_while", "wake", "word"]
