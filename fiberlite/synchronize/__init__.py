"""Locks, semaphores, conditions, events and barriers shared by every job of a run
(``multiprocessing.synchronize``). See :mod:`.synchronize` for the semantics."""
from .synchronize import (Barrier, BoundedSemaphore, BrokenBarrierError, Condition, Event, Lock,
                          NotOwnedError, RLock, Semaphore)

__all__ = ["Lock", "RLock", "Condition", "Semaphore", "BoundedSemaphore", "Event", "Barrier",
           "BrokenBarrierError", "NotOwnedError"]
