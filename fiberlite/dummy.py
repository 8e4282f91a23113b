"""The ``multiprocessing`` API backed by threads of this process
(``multiprocessing.dummy``): no jobs, no backend, nothing pickled.

The objects are the standard library's own, so that a script written for
``multiprocessing.dummy`` behaves the same with ``import fiberlite.dummy``: ``Process``
is a thread, ``Value`` and ``Array`` are plain objects shared by the threads (``lock`` is
accepted and ignored), ``Pool`` is a ``ThreadPool``, and ``Manager()`` returns this module,
whose ``Value``, ``Array``, ``Namespace``, ``list``, ``dict`` and synchronization
primitives are then shared by every thread. ``__all__`` is the standard library's.
"""
from __future__ import annotations

import sys
import types
from multiprocessing import dummy as _threads
from multiprocessing.dummy import (  # noqa: F401
    Array, Barrier, BoundedSemaphore, Condition, DummyProcess, Event, JoinableQueue, Lock,
    Namespace, Pipe, Pool, Process, Queue, RLock, Semaphore, Value, active_children, connection,
    current_process, dict, freeze_support, list, shutdown)

__all__ = [*_threads.__all__]


def Manager() -> types.ModuleType:
    """This module: its objects are shared by the threads that use them, as a manager's
    are by processes (``with Manager() as m`` is not supported, as in the stdlib)."""
    return sys.modules[__name__]

