"""A selector that any thread can wake: the one loop of a thread that serves many
sockets (a pool host's workers, the pool master's workers of its machine, the shared
memory door's visitors) waits in :meth:`WakingSelector.select`, and another thread that
has handed it something new (a socket to serve, a backlog to write, the word to stop)
calls :meth:`WakingSelector.wake`.
"""
from __future__ import annotations

import os
import selectors
import threading
from typing import Any

_WAKE = object()  # the data of the wake-up pipe's key


class WakingSelector:
    """A :class:`selectors.DefaultSelector` and a wake-up pipe registered in it."""

    def __init__(self) -> None:
        self._selector = selectors.DefaultSelector()
        self._wake_r, self._wake_w = os.pipe2(os.O_NONBLOCK | os.O_CLOEXEC)
        self._selector.register(self._wake_r, selectors.EVENT_READ, _WAKE)
        self._lock = threading.Lock()  # a wake-up never writes to a closed (reused) descriptor

    def register(self, fileobj: Any, events: int, data: Any) -> None:
        self._selector.register(fileobj, events, data)

    def modify(self, fileobj: Any, events: int, data: Any) -> None:
        self._selector.modify(fileobj, events, data)

    def unregister(self, fileobj: Any) -> None:
        self._selector.unregister(fileobj)

    def keys(self) -> list[selectors.SelectorKey]:
        """The keys of what is registered (not the wake-up's)."""
        return [key for key in self._selector.get_map().values() if key.data is not _WAKE]

    def select(self, timeout: float | None = None) -> tuple[list[tuple[selectors.SelectorKey, int]], bool]:
        """What is ready (``(key, events)`` pairs), and whether :meth:`wake` was called
        since the last select."""
        ready, woken = [], False
        for key, events in self._selector.select(timeout):
            if key.data is _WAKE:
                woken = True
                self._drain()
            else:
                ready.append((key, events))
        return ready, woken

    def wake(self) -> None:
        """(any thread) End a :meth:`select` under way, or the next one, at once."""
        with self._lock:
            if self._wake_w < 0:
                return
            try:
                os.write(self._wake_w, b"x")
            except OSError:  # full: a wake-up is pending anyway
                pass

    def _drain(self) -> None:
        try:
            while os.read(self._wake_r, 4096):
                pass
        except OSError:  # (BlockingIOError: drained)
            pass

    def close(self) -> None:
        """Close the selector and the wake-up pipe (a later :meth:`wake` does nothing)."""
        self._selector.close()
        with self._lock:
            fds, self._wake_r, self._wake_w = (self._wake_r, self._wake_w), -1, -1
        for fd in fds:
            if fd >= 0:
                os.close(fd)
