"""Locks, semaphores, conditions, events and barriers shared by every job of a run
(``multiprocessing.synchronize``).

Each primitive is a servant in the hub of the process that created it (like a
Queue) and pickles to any job: pass it as a Process argument, through a queue or a
pipe. The semantics are those of ``multiprocessing.synchronize``; every wait is kept
by the hub as a pending request (a timeout is a scheduler timer), so no thread ever
blocks in the hub. Calls from the creating process are direct calls, without a socket.

Ownership: a lock's owner is the calling thread of the calling process, identified by
its connection to the hub plus the pid and thread id it sends.

Differences from ``multiprocessing``, on purpose:

- a job that dies (or exits) while holding a ``Lock``/``RLock`` (or the lock of a
  ``Condition``) releases it, and whatever it was waiting for is forgotten;
  ``multiprocessing`` would leave the lock held and the other processes deadlocked.
  A ``Lock`` acquired by one job and meant to be released by another is therefore
  released when the first one ends.
- semaphores have no owner: a dead job's acquisitions are *not* given back.
- a party that dies while waiting at a ``Barrier`` breaks it (the others get
  ``BrokenBarrierError``), like a party whose wait timed out.
- ``Condition`` needs a fiberlite ``Lock`` or ``RLock``; errors for a lock that is not
  held (:class:`NotOwnedError`) are both ``AssertionError`` (as ``multiprocessing``)
  and ``RuntimeError`` (as ``threading``).

The primitives users hold are in :mod:`.primitives`, the servants that keep their state
in the hub in :mod:`.servants` (the lock's in :mod:`.lock_servant`).
"""
from threading import BrokenBarrierError

from .primitives import Barrier, BoundedSemaphore, Condition, Event, Lock, RLock, Semaphore
from .servants import NotOwnedError

__all__ = ["Lock", "RLock", "Condition", "Semaphore", "BoundedSemaphore", "Event", "Barrier",
           "BrokenBarrierError", "NotOwnedError"]
