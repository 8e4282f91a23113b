"""``Condition``: a condition variable on a fiberlite ``Lock`` or ``RLock``.

Its three words (:mod:`.condvar`) are allocated by the lock's creator, beside the lock,
and named there by an id: a process that maps the lock waits and notifies on them
directly; one that cannot asks the lock's servant to do it for its thread.
"""
from __future__ import annotations

import time
from typing import Any, Callable

from ..runtime.shm.place import Place, view
from ..units import check_timeout
from . import condvar
from .locks import RLock, _LockBase
from .shared import blocking_call, caller, remote_call

__all__ = ["Condition", "wait_until"]


def wait_until(wait: Callable[[float | None], Any], predicate: Callable[[], Any],
               timeout: float | None) -> Any:
    """``Condition.wait_for`` over any ``wait(timeout)``: wait until ``predicate()`` is true
    (evaluated after each wake-up) or ``timeout`` passes; return its last value."""
    deadline = None if timeout is None else time.monotonic() + timeout
    result = predicate()
    while not result:
        remaining = None
        if deadline is not None:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                break
        wait(remaining)
        result = predicate()
    return result


class Condition:
    """A condition variable (``multiprocessing.Condition``) on a fiberlite Lock or RLock."""

    def __init__(self, lock: _LockBase | None = None, *, ctx: Any = None) -> None:
        if lock is None:
            lock = RLock(ctx=ctx)
        elif not isinstance(lock, _LockBase):
            raise TypeError(f"Condition needs a fiberlite Lock or RLock, not {lock!r}: "
                            "create it with fiberlite.Lock() or fiberlite.RLock()")
        cid, place = remote_call(lock._ref, "condition", condvar.CONDITION_BYTES)
        self._setup(lock, cid, place)

    def _setup(self, lock: _LockBase, cid: str, place: Place) -> None:
        self._lock = lock
        self._cid = cid
        self._place = place
        self._cells = None
        if lock._local:
            here = view(place)
            if here is not None:
                buffer, _ = here
                self._cells = condvar.cells(buffer, place.offset)
                self._holder = condvar.Holder(lock._mutex)
        self.acquire = lock.acquire
        self.release = lock.release

    def __reduce__(self):
        return (_rebuild, (self._lock, self._cid, self._place))

    def __enter__(self) -> bool:
        return self._lock.__enter__()

    def __exit__(self, *exc: Any) -> None:
        self._lock.__exit__(*exc)

    def wait(self, timeout: float | None = None) -> bool:
        """Release the lock, wait for a notify (or ``timeout``), re-acquire it; False on timeout."""
        check_timeout(timeout)
        cells = self._cells
        if cells is not None:
            return condvar.wait(cells[0], cells[1], self._holder, timeout)
        self._lock._settle()  # what was written to a copy the lock carries is the object's first
        # interrupted (KeyboardInterrupt...): the error goes on once the lock is held again
        return blocking_call(self._lock._ref, "cond_wait", self._cid, timeout, interrupted="cond_resume")

    def wait_for(self, predicate: Callable[[], Any], timeout: float | None = None) -> Any:
        """Wait until ``predicate()`` is true (or ``timeout``); return its last value."""
        return wait_until(self.wait, predicate, timeout)

    def notify(self, n: int = 1) -> None:
        """Wake up to ``n`` waiters; the caller must hold the lock."""
        self._notify(n)

    def notify_all(self) -> None:
        """Wake every waiter; the caller must hold the lock."""
        self._notify(None)

    notifyAll = notify_all

    def _notify(self, n: int | None) -> None:
        cells = self._cells
        if cells is not None:
            condvar.notify(cells[0], cells[1], self._holder, n)
        else:
            remote_call(self._lock._ref, "cond_notify", self._cid, n, *caller())

    def __repr__(self) -> str:
        try:
            cells = self._cells
            sleepers: Any = (condvar.sleepers(cells[0]) if cells is not None
                             else remote_call(self._lock._ref, "cond_state", self._cid))
        except Exception:
            sleepers = "unknown"
        return f"<Condition({self._lock!r}, {sleepers})>"


def _rebuild(lock: _LockBase, cid: str, place: Place) -> Condition:
    cond = Condition.__new__(Condition)
    cond._setup(lock, cid, place)
    return cond
