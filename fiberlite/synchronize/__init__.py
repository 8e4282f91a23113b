"""Locks, semaphores, conditions, events and barriers shared by every job of a run
(``multiprocessing.synchronize``).

Each primitive is a few words of its creator's shared memory (:mod:`.shared`) and
pickles to any job: pass it as a Process argument, through a queue or a pipe. In every
process of the creator's machine it works on that memory directly, at the cost of
``multiprocessing``'s primitives (futexes; a lock or semaphore is a C call); a job on
another machine (or with ``share_machine`` off) goes through the creator's hub, which
acts on the same memory for it. The semantics are those of ``multiprocessing.synchronize``.

Holders are named in the memory itself (a process's slot and a thread's index), so that
more is promised than ``multiprocessing`` does:

- a job that dies (or exits) while holding a ``Lock``/``RLock`` (or the lock of a
  ``Condition``) releases it; ``multiprocessing`` would leave it held and the other
  processes deadlocked. A ``Lock`` acquired by one job and meant to be released by
  another is therefore released when the first one ends.
- the units a job holds of a semaphore (its net acquisitions, up to the initial value)
  go back when it ends: a pool of ``n`` resources keeps ``n``; a signal semaphore
  (``Semaphore(0)``) gives nothing back.
- a party that dies while waiting at a ``Barrier`` breaks it (the others get
  ``BrokenBarrierError``), like a party whose wait timed out.
- ``Condition`` needs a fiberlite ``Lock`` or ``RLock``; errors for a lock that is not
  held (:class:`NotOwnedError`) are both ``AssertionError`` (as ``multiprocessing``)
  and ``RuntimeError`` (as ``threading``).

Modules: :mod:`.shared` (the handle and servant every primitive shares), :mod:`.locks`,
:mod:`.condvar` (the condition variable's algorithm) and :mod:`.condition`,
:mod:`.semaphore`, :mod:`.event`, :mod:`.barrier`.
"""
from threading import BrokenBarrierError

from .barrier import Barrier
from .condition import Condition
from .event import Event
from .locks import Lock, RLock
from .semaphore import BoundedSemaphore, Semaphore
from .shared import NotOwnedError

__all__ = ["Lock", "RLock", "Condition", "Semaphore", "BoundedSemaphore", "Event", "Barrier",
           "BrokenBarrierError", "NotOwnedError"]
