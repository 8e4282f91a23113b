"""The primitives users hold: ``Lock``, ``RLock``, ``Condition``, ``Semaphore``,
``BoundedSemaphore``, ``Event`` and ``Barrier``.

Each is a handle on its servant (:mod:`fiberlite.synchronize.servants`) in the hub of
the process that created it, and pickles to any job of the run. In the creating
process, calls that need not wait go straight to the servant, without a socket.
"""
from __future__ import annotations

import itertools
import os
import secrets
import time
from threading import get_ident
from typing import Any, Callable

from ..runtime import handles
from ..runtime.hub import LOCAL_PEER, ObjectRef, current_hub
from .lock_servant import LockServant
from .servants import BarrierServant, EventServant, SemaphoreServant

__all__ = ["Lock", "RLock", "Condition", "Semaphore", "BoundedSemaphore", "Event", "Barrier"]

_tickets = itertools.count(1)  # tells apart the blocking calls of one thread (to cancel one)


def _local_servant(ref: ObjectRef) -> Any:
    hub = current_hub()
    if hub is not None and hub.address == ref.address:
        return hub.servant(ref.oid)
    return None


def _wait(ref: ObjectRef, method: str, *args: Any, undo_grant: bool = False) -> Any:
    """A blocking call whose last three arguments are (pid, tid, ticket); an interrupted
    caller withdraws it so that the hub does not grant it to nobody."""
    try:
        return ref.call(method, *args)
    except Exception:
        raise
    except BaseException:
        pid, tid, ticket = args[-3:]
        try:
            ref.call("cancel", pid, tid, ticket, undo_grant)
        except Exception:
            pass
        raise


class _Shared:
    """A handle on a servant in its creator's hub; picklable to any job of the run."""

    _ref: ObjectRef
    _servant: Any  # the servant itself when it lives in this process (direct calls)

    def _register(self, servant: Any) -> None:
        self._ref = handles.register(self, servant)
        self._servant = servant

    def _getstate(self) -> tuple:
        return ()

    def _setstate(self, state: tuple) -> None:
        pass

    def __reduce__(self):
        handles.exported(self._ref)
        return (_rebuild, (type(self), self._ref, self._getstate()))


def _rebuild(cls: type, ref: ObjectRef, state: tuple) -> Any:
    obj = cls.__new__(cls)
    obj._ref = ref
    obj._servant = _local_servant(ref)
    obj._setstate(state)
    handles.loaded(obj, ref)
    return obj


class _LockBase(_Shared):
    _recursive = False

    def __init__(self, *, ctx: Any = None) -> None:
        self._register(LockServant(self._recursive))

    def acquire(self, block: bool = True, timeout: float | None = None) -> bool:
        """Acquire the lock; wait up to ``timeout`` seconds (None: forever). True if acquired."""
        pid, tid = os.getpid(), get_ident()
        servant = self._servant
        if servant is not None:
            if servant.try_take((LOCAL_PEER, pid, tid)):
                return True
            if not block or (timeout is not None and timeout <= 0):
                return False
        return _wait(self._ref, "acquire", block, timeout, pid, tid, next(_tickets), undo_grant=True)

    def release(self) -> None:
        """Release the lock (ValueError if unlocked; an RLock must be held by the caller)."""
        servant = self._servant
        if servant is not None:
            servant.release_now((LOCAL_PEER, os.getpid(), get_ident()))
        else:
            self._ref.call("release", os.getpid(), get_ident())

    def __enter__(self) -> bool:
        return self.acquire()

    def __exit__(self, *exc: Any) -> None:
        self.release()

    def _state(self, cid: str | None = None) -> tuple:
        return self._ref.call("state", os.getpid(), get_ident(), cid)

    @staticmethod
    def _owner_name(relation: str | None) -> str:
        if relation == "self":
            from ..process import current_process
            return current_process().name
        return {"thread": "SomeOtherThread", "process": "SomeOtherProcess"}.get(relation, "None")


class Lock(_LockBase):
    """A non-recursive lock (``multiprocessing.Lock``): any thread or job may release it."""

    def __repr__(self) -> str:
        try:
            relation, _, _ = self._state()
        except Exception:
            return "<Lock(owner=unknown)>"
        return f"<Lock(owner={self._owner_name(relation)})>"


class RLock(_LockBase):
    """A recursive lock (``multiprocessing.RLock``): only its owner thread may release it."""

    _recursive = True

    def __repr__(self) -> str:
        try:
            relation, count, _ = self._state()
        except Exception:
            return "<RLock(unknown)>"
        return f"<RLock({self._owner_name(relation)}, {count})>"


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
        self._setup(lock, secrets.token_hex(8))

    def _setup(self, lock: _LockBase, cid: str) -> None:
        self._lock = lock
        self._cid = cid
        self.acquire = lock.acquire
        self.release = lock.release

    def __reduce__(self):
        return (_rebuild_condition, (self._lock, self._cid))

    def __enter__(self) -> bool:
        return self._lock.__enter__()

    def __exit__(self, *exc: Any) -> None:
        self._lock.__exit__(*exc)

    def wait(self, timeout: float | None = None) -> bool:
        """Release the lock, wait for a notify (or ``timeout``), re-acquire it; False on timeout."""
        pid, tid, ticket = os.getpid(), get_ident(), next(_tickets)
        try:
            return self._lock._ref.call("cond_wait", self._cid, timeout, pid, tid, ticket)
        except Exception:
            raise
        except BaseException:  # interrupted (KeyboardInterrupt...): own the lock again first
            self._lock._ref.call("cond_resume", pid, tid, ticket)
            raise

    def wait_for(self, predicate: Callable[[], Any], timeout: float | None = None) -> Any:
        """Wait until ``predicate()`` is true (or ``timeout``); return its last value."""
        return wait_until(self.wait, predicate, timeout)

    def notify(self, n: int = 1) -> None:
        """Wake up to ``n`` waiters; the caller must hold the lock."""
        self._lock._ref.call("notify", self._cid, n, os.getpid(), get_ident())

    def notify_all(self) -> None:
        """Wake every waiter; the caller must hold the lock."""
        self._lock._ref.call("notify", self._cid, None, os.getpid(), get_ident())

    notifyAll = notify_all

    def __repr__(self) -> str:
        try:
            sleepers = self._lock._state(self._cid)[2]
        except Exception:
            sleepers = "unknown"
        return f"<Condition({self._lock!r}, {sleepers})>"


def _rebuild_condition(lock: _LockBase, cid: str) -> Condition:
    cond = Condition.__new__(Condition)
    cond._setup(lock, cid)
    return cond


class Semaphore(_Shared):
    """A counting semaphore (``multiprocessing.Semaphore``)."""

    _bounded = False

    def __init__(self, value: int = 1, *, ctx: Any = None) -> None:
        if value < 0:
            raise ValueError("semaphore initial value must be >= 0")
        self._register(SemaphoreServant(value, value if self._bounded else None))

    def acquire(self, block: bool = True, timeout: float | None = None) -> bool:
        """Decrement the counter, waiting up to ``timeout`` while it is zero; True if done."""
        servant = self._servant
        if servant is not None:
            if servant.try_take():
                return True
            if not block or (timeout is not None and timeout <= 0):
                return False
        return _wait(self._ref, "acquire", block, timeout, os.getpid(), get_ident(), next(_tickets))

    def release(self) -> None:
        """Increment the counter (waking one waiter)."""
        servant = self._servant
        if servant is not None:
            servant.release_now()
        else:
            self._ref.call("release")

    def get_value(self) -> int:
        servant = self._servant
        return servant.value if servant is not None else self._ref.call("get_value")

    def __enter__(self) -> bool:
        return self.acquire()

    def __exit__(self, *exc: Any) -> None:
        self.release()

    def __repr__(self) -> str:
        try:
            value: Any = self.get_value()
        except Exception:
            value = "unknown"
        return f"<{type(self).__name__}(value={value})>"


class BoundedSemaphore(Semaphore):
    """A semaphore whose release beyond the initial value raises ValueError."""

    _bounded = True

    def __init__(self, value: int = 1, *, ctx: Any = None) -> None:
        super().__init__(value, ctx=ctx)
        self._maxvalue = value

    def _getstate(self) -> tuple:
        return (self._maxvalue,)

    def _setstate(self, state: tuple) -> None:
        (self._maxvalue,) = state

    def __repr__(self) -> str:
        try:
            value: Any = self.get_value()
        except Exception:
            value = "unknown"
        return f"<BoundedSemaphore(value={value}, maxvalue={self._maxvalue})>"


class Event(_Shared):
    """An event flag (``multiprocessing.Event``)."""

    def __init__(self, *, ctx: Any = None) -> None:
        self._register(EventServant())

    def is_set(self) -> bool:
        servant = self._servant
        return servant.flag if servant is not None else self._ref.call("is_set")

    def set(self) -> None:
        """Set the flag and wake every waiter."""
        servant = self._servant
        if servant is not None:
            servant.set_now()
        else:
            self._ref.call("set")

    def clear(self) -> None:
        servant = self._servant
        if servant is not None:
            servant.clear_now()
        else:
            self._ref.call("clear")

    def wait(self, timeout: float | None = None) -> bool:
        """Wait until the flag is set (or ``timeout``); return the flag."""
        servant = self._servant
        if servant is not None and servant.flag:
            return True
        return _wait(self._ref, "wait", timeout, os.getpid(), get_ident(), next(_tickets))

    def __repr__(self) -> str:
        try:
            state = "set" if self.is_set() else "unset"
        except Exception:
            state = "unknown"
        return f"<{type(self).__name__} at {id(self):#x} {state}>"


class Barrier(_Shared):
    """A barrier for ``parties`` jobs (``multiprocessing.Barrier``).

    ``action`` runs in the last party to arrive (in whichever job that is), before the
    others are released; if it raises, the barrier breaks.
    """

    def __init__(self, parties: int, action: Callable[[], Any] | None = None,
                 timeout: float | None = None, *, ctx: Any = None) -> None:
        if parties < 1:
            raise ValueError("parties must be >= 1")
        self._parties = parties
        self._action = action
        self._timeout = timeout
        self._register(BarrierServant(parties))

    def _getstate(self) -> tuple:
        return (self._parties, self._action, self._timeout)

    def _setstate(self, state: tuple) -> None:
        self._parties, self._action, self._timeout = state

    def wait(self, timeout: float | None = None) -> int:
        """Wait for all parties; return this party's arrival index (0 .. parties-1)."""
        if timeout is None:
            timeout = self._timeout
        reply = _wait(self._ref, "wait", timeout, self._action is not None,
                      os.getpid(), get_ident(), next(_tickets))
        if reply[0] == "ok":
            return reply[1]
        _, index, generation = reply
        try:
            self._action()  # type: ignore[misc]
        except BaseException:
            self._ref.call("action_done", generation, False)
            raise
        self._ref.call("action_done", generation, True)
        return index

    def reset(self) -> None:
        """Return to the empty state; parties waiting get BrokenBarrierError."""
        self._ref.call("reset")

    def abort(self) -> None:
        """Break the barrier: current and future waits raise BrokenBarrierError."""
        self._ref.call("abort")

    @property
    def parties(self) -> int:
        return self._parties

    @property
    def n_waiting(self) -> int:
        return self._ref.call("state")[0]

    @property
    def broken(self) -> bool:
        return self._ref.call("state")[1]

    def __repr__(self) -> str:
        try:
            n_waiting, broken = self._ref.call("state")
        except Exception:
            return f"<{type(self).__name__} at {id(self):#x}: unknown>"
        if broken:
            return f"<{type(self).__name__} at {id(self):#x}: broken>"
        return f"<{type(self).__name__} at {id(self):#x}: waiters={n_waiting}/{self._parties}>"
