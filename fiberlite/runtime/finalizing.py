"""Casts asked for by finalizers, which must neither block nor take locks.

A finalizer (``__del__``, ``weakref.finalize``) may run in any thread at any moment,
even while that thread holds a lock a cast would need. It only queues the cast
(``SimpleQueue.put`` is safe there); one daemon thread per :class:`CastQueue` sends
them, in order.
"""
from __future__ import annotations

import queue
import threading
from typing import Any, Callable, ContextManager

from .hub import ObjectRef


class CastQueue:
    """Queued ``ref.cast(method, *args)`` calls, sent by a thread of their own."""

    def __init__(self, name: str, skip: Callable[[ObjectRef], bool] | None = None,
                 guard: ContextManager | None = None) -> None:
        self._name = name
        self._skip = skip      # casts to refs it approves are dropped
        self._guard = guard    # held while one is sent
        self._queue: queue.SimpleQueue = queue.SimpleQueue()
        self._thread: threading.Thread | None = None
        self._start_lock = threading.Lock()

    def start(self) -> None:
        """Start the sending thread (not from a finalizer: call it when the objects
        whose finalizers will queue casts are made)."""
        if self._thread is None:
            with self._start_lock:
                if self._thread is None:
                    self._thread = threading.Thread(target=self._send, name=self._name,
                                                     daemon=True)
                    self._thread.start()

    def put(self, ref: ObjectRef, method: str, *args: Any) -> None:
        """Queue a cast; safe in a finalizer."""
        self._queue.put((ref, method, args))

    def sync(self, timeout: float | None = None) -> bool:
        """Wait until the casts queued before this call have been sent (their handling:
        flush the connections then); whether that happened within ``timeout`` s."""
        sent = threading.Event()
        self._queue.put((None, sent, ()))
        self.start()
        return sent.wait(timeout)

    def _send(self) -> None:
        while True:
            ref, method, args = self._queue.get()
            if ref is None:  # sync() waits for the casts before it
                method.set()
                continue
            with self._guard if self._guard is not None else _NO_GUARD:
                if self._skip is not None and self._skip(ref):
                    continue
                try:
                    ref.cast(method, *args)
                except Exception:
                    pass  # its server has gone, or this process is exiting


class _NoGuard:
    def __enter__(self) -> None:
        return None

    def __exit__(self, *exc: Any) -> None:
        return None


_NO_GUARD = _NoGuard()
