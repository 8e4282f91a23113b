"""Locks, semaphores, conditions, events and barriers shared by every job of a run.

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
"""
from __future__ import annotations

import collections
import itertools
import os
import secrets
import time
from functools import partial
from threading import BrokenBarrierError, get_ident
from typing import Any, Callable

from ..runtime import handles
from ..runtime.hub import LOCAL_PEER, LockedServant, ObjectRef, current_hub

__all__ = ["Lock", "RLock", "Semaphore", "BoundedSemaphore", "Condition", "Event", "Barrier",
           "BrokenBarrierError", "NotOwnedError"]

_tickets = itertools.count(1)  # tells apart the blocking calls of one thread (to cancel one)


class NotOwnedError(AssertionError, RuntimeError):
    """An operation that needs the lock held by the calling thread was called without it."""


# ------------------------------------------------------------------------------------------
# hub side
# ------------------------------------------------------------------------------------------
class _Waiter:
    """A pending request: an acquire, a condition wait, or an access run once the lock is free."""

    __slots__ = ("request", "key", "ticket", "count", "result", "run", "cid", "index",
                 "timer", "done")

    def __init__(self, request: Any, key: tuple = (), ticket: int | None = None, count: int = 1,
                 result: Any = True, run: Callable[[], Any] | None = None) -> None:
        self.request = request
        self.key = key              # (peer, pid, thread id)
        self.ticket = ticket
        self.count = count          # recursion level to own the lock with
        self.result = result        # reply once granted
        self.run = run              # an access to run while nobody else holds the lock
        self.cid: str | None = None  # the condition waited on, while waiting on one
        self.index = 0              # arrival index at a barrier
        self.timer = None
        self.done = False

    @property
    def peer(self) -> int:
        return self.request.peer

    def finish(self) -> None:
        self.done = True
        if self.timer is not None:
            self.timer.cancel()
            self.timer = None


def _settle(request: Any, fn: Callable[[], Any]) -> Callable[[], None]:
    """Run ``fn`` now; return the action that answers ``request`` with its outcome."""
    try:
        value = fn()
    except Exception as exc:
        return partial(request.fail, exc)
    return partial(request.reply, value)


def _relation(owner: tuple | None, key: tuple) -> str | None:
    if owner is None:
        return None
    if owner == key:
        return "self"
    return "thread" if owner[:2] == key[:2] else "process"


class LockServant(LockedServant):
    """A Lock or RLock, with the waiters of the conditions built on it."""

    def __init__(self, recursive: bool) -> None:
        super().__init__()
        self.recursive = recursive
        self.owner: tuple | None = None
        self.ticket: int | None = None
        self.count = 0
        self.queue: collections.deque[_Waiter] = collections.deque()
        self.conds: dict[str, collections.deque[_Waiter]] = {}
        # invariant: when nobody owns the lock, the queue holds no live waiter

    # -- under self._lock ---------------------------------------------------------------
    def _take(self, key: tuple, ticket: int | None = None) -> bool:
        if self.owner is None:
            self.owner, self.ticket, self.count = key, ticket, 1
            return True
        if self.recursive and self.owner == key:
            self.count += 1
            return True
        return False

    def _release(self, key: tuple) -> list:
        if self.recursive:
            if self.owner != key:
                raise NotOwnedError("attempt to release recursive lock not owned by thread")
            self.count -= 1
            if self.count:
                return []
        elif self.owner is None:
            raise ValueError("semaphore or lock released too many times")
        return self._hand_off()

    def _hand_off(self) -> list:
        """The lock is free: run waiting accesses, then give it to the next acquirer."""
        self.owner, self.ticket, self.count = None, None, 0
        actions: list = []
        while self.queue:
            waiter = self.queue.popleft()
            if waiter.done:
                continue
            waiter.finish()
            if waiter.run is not None:
                actions.append(_settle(waiter.request, waiter.run))
                continue
            self.owner, self.ticket, self.count = waiter.key, waiter.ticket, waiter.count
            actions.append(partial(waiter.request.reply, waiter.result))
            break
        return actions

    def _line_up(self, waiter: _Waiter) -> list:
        """A waiter back from a condition waits for the lock again."""
        waiter.cid = None
        if self.owner is None:
            waiter.finish()
            self.owner, self.ticket, self.count = waiter.key, waiter.ticket, waiter.count
            return [partial(waiter.request.reply, waiter.result)]
        self.queue.append(waiter)
        return []

    def _leave_condition(self, waiter: _Waiter) -> None:
        waiters = self.conds.get(waiter.cid)  # type: ignore[arg-type]
        if waiters is not None:
            waiters.remove(waiter)
            if not waiters:
                del self.conds[waiter.cid]  # type: ignore[arg-type]
        waiter.cid = None

    # -- direct calls from the owning process ----------------------------------------------
    def try_take(self, key: tuple) -> bool:
        with self._lock:
            return self._take(key)

    def release_now(self, key: tuple) -> None:
        with self._lock:
            actions = self._release(key)
        self.run_actions(actions)

    def try_run(self, key: tuple, fn: Callable[[], Any]) -> tuple[bool, Any]:
        """Run ``fn`` if the lock is free or held by ``key``: ``(True, value)``, else ``(False, None)``."""
        with self._lock:
            if self.owner is None or self.owner == key:
                return True, fn()
        return False, None

    def run_locked(self, request: Any, key: tuple, fn: Callable[[], Any]) -> None:
        """Answer ``request`` with ``fn()`` run while no other thread holds the lock."""
        with self._lock:
            if self.owner is not None and self.owner != key:
                self.queue.append(_Waiter(request, key, run=fn))
                return
            action = _settle(request, fn)
        action()

    # -- operations ---------------------------------------------------------------------
    def op_acquire(self, request, block: bool, timeout: float | None, pid: int, tid: int,
                   ticket: int | None = None) -> None:
        key = (request.peer, pid, tid)
        with self._lock:
            if self._take(key, ticket):
                got = True
            elif not block or (timeout is not None and timeout <= 0):
                got = False
            else:
                waiter = _Waiter(request, key, ticket)
                self.queue.append(waiter)
                if timeout is not None:
                    waiter.timer = self.schedule_expiry(timeout, waiter, self.queue, None)
                return
        request.reply(got)

    def op_release(self, request, pid: int, tid: int) -> None:
        with self._lock:
            actions = self._release((request.peer, pid, tid))
        request.reply()
        self.run_actions(actions)

    def op_cond_wait(self, request, cid: str, timeout: float | None, pid: int, tid: int,
                     ticket: int | None = None) -> None:
        key = (request.peer, pid, tid)
        with self._lock:
            if self.owner != key:
                raise NotOwnedError("must acquire() condition before using wait()")
            waiter = _Waiter(request, key, ticket, count=self.count)
            waiter.cid = cid
            self.conds.setdefault(cid, collections.deque()).append(waiter)
            actions = self._hand_off()
            if timeout is not None:
                waiter.timer = self._scheduler.call_later(max(0.0, timeout),
                                                          partial(self._cond_timeout, waiter))
        self.run_actions(actions)

    def op_cond_resume(self, request, pid: int, tid: int, ticket: int) -> None:
        """A condition wait was interrupted: answer ``request`` once the caller owns the
        lock again, at its former depth (threading re-acquires before raising too)."""
        key = (request.peer, pid, tid)
        with self._lock:
            waiters = list(self.queue) + [w for ws in self.conds.values() for w in ws]
            waiter = next((w for w in waiters if w.key == key and w.ticket == ticket and not w.done), None)
            if waiter is None:  # the wait had already been granted: the caller owns the lock
                actions = [request.reply]
            else:
                waiter.request = request
                if waiter.timer is not None:
                    waiter.timer.cancel()
                    waiter.timer = None
                if waiter.cid is not None:
                    self._leave_condition(waiter)
                    actions = self._line_up(waiter)
                else:
                    actions = []  # already lined up for the lock
        self.run_actions(actions)

    def _cond_timeout(self, waiter: _Waiter) -> None:
        with self._lock:
            if waiter.done or waiter.cid is None:
                return
            self._leave_condition(waiter)
            waiter.timer = None
            waiter.result = False
            actions = self._line_up(waiter)
        self.run_actions(actions)

    def op_notify(self, request, cid: str, n: int | None, pid: int, tid: int) -> None:
        with self._lock:
            if self.owner != (request.peer, pid, tid):
                raise NotOwnedError("lock is not owned")
            waiters = self.conds.get(cid)
            woken = 0
            while waiters and (n is None or woken < n):
                waiter = waiters.popleft()
                if waiter.timer is not None:
                    waiter.timer.cancel()
                    waiter.timer = None
                waiter.cid = None
                self.queue.append(waiter)  # the notifier holds the lock: wait for it
                woken += 1
            if waiters is not None and not waiters:
                del self.conds[cid]
        request.reply(woken)

    def op_cancel(self, request, pid: int, tid: int, ticket: int, undo_grant: bool) -> None:
        """The caller gave up a blocking call (interrupted): forget it, undo an unseen grant."""
        key = (request.peer, pid, tid)
        actions: list = []
        with self._lock:
            pending = [w for w in self.queue if w.key == key and w.ticket == ticket and not w.done]
            pending += [w for ws in self.conds.values() for w in ws if w.key == key and w.ticket == ticket]
            for waiter in pending:
                if waiter.cid is not None:
                    self._leave_condition(waiter)
                else:
                    self.queue.remove(waiter)
                waiter.finish()
            if not pending and undo_grant and self.owner == key and self.ticket == ticket:
                actions = self._hand_off()
        request.reply()
        self.run_actions(actions)

    def op_state(self, request, pid: int, tid: int, cid: str | None = None) -> None:
        with self._lock:
            relation = _relation(self.owner, (request.peer, pid, tid))
            sleepers = len(self.conds.get(cid, ())) if cid is not None else 0
            state = (relation, self.count, sleepers)
        request.reply(state)

    def peer_lost(self, peer: int) -> None:
        actions: list = []
        with self._lock:
            for waiter in [w for w in self.queue if w.peer == peer]:
                waiter.finish()
                self.queue.remove(waiter)
            for waiters in list(self.conds.values()):
                for waiter in [w for w in waiters if w.peer == peer]:
                    self._leave_condition(waiter)
                    waiter.finish()
            if self.owner is not None and self.owner[0] == peer:
                actions = self._hand_off()  # a dead job's lock is released
        self.run_actions(actions)


class _WaitQueueServant(LockedServant):
    """A servant whose waiters stand in one queue: interrupted or dead waiters leave it."""

    def __init__(self) -> None:
        super().__init__()
        self.queue: collections.deque[_Waiter] = collections.deque()

    def op_cancel(self, request, pid: int, tid: int, ticket: int, undo_grant: bool) -> None:
        key = (request.peer, pid, tid)
        with self._lock:
            for waiter in [w for w in self.queue if w.key == key and w.ticket == ticket]:
                waiter.finish()
                self.queue.remove(waiter)
        request.reply()

    def peer_lost(self, peer: int) -> None:
        with self._lock:
            for waiter in [w for w in self.queue if w.peer == peer]:
                waiter.finish()
                self.queue.remove(waiter)


class SemaphoreServant(_WaitQueueServant):
    """A counter with waiters; ``maxvalue`` bounds releases (BoundedSemaphore)."""

    def __init__(self, value: int, maxvalue: int | None) -> None:
        super().__init__()
        self.value = value
        self.maxvalue = maxvalue

    def try_take(self) -> bool:
        with self._lock:
            if self.value > 0:
                self.value -= 1
                return True
            return False

    def _release(self) -> list:
        if self.maxvalue is not None and self.value >= self.maxvalue:
            raise ValueError("semaphore or lock released too many times")
        while self.queue:
            waiter = self.queue.popleft()
            if not waiter.done:
                waiter.finish()
                return [partial(waiter.request.reply, True)]
        self.value += 1
        return []

    def release_now(self) -> None:
        with self._lock:
            actions = self._release()
        self.run_actions(actions)

    def op_acquire(self, request, block: bool, timeout: float | None, pid: int, tid: int,
                   ticket: int | None = None) -> None:
        with self._lock:
            if self.value > 0:
                self.value -= 1
                got = True
            elif not block or (timeout is not None and timeout <= 0):
                got = False
            else:
                waiter = _Waiter(request, (request.peer, pid, tid), ticket)
                self.queue.append(waiter)
                if timeout is not None:
                    waiter.timer = self.schedule_expiry(timeout, waiter, self.queue, None)
                return
        request.reply(got)

    def op_release(self, request) -> None:
        with self._lock:
            actions = self._release()
        request.reply()
        self.run_actions(actions)

    def op_get_value(self, request) -> None:
        request.reply(self.value)



class EventServant(_WaitQueueServant):
    """A flag with the requests waiting for it to be set."""

    def __init__(self) -> None:
        super().__init__()
        self.flag = False

    def set_now(self) -> None:
        with self._lock:
            self.flag = True
            woken = [w for w in self.queue if not w.done]
            self.queue.clear()
            for waiter in woken:
                waiter.finish()
        for waiter in woken:
            waiter.request.reply(True)

    def clear_now(self) -> None:
        with self._lock:
            self.flag = False

    def op_set(self, request) -> None:
        self.set_now()
        request.reply()

    def op_clear(self, request) -> None:
        self.clear_now()
        request.reply()

    def op_is_set(self, request) -> None:
        request.reply(self.flag)

    def op_wait(self, request, timeout: float | None, pid: int = 0, tid: int = 0,
                ticket: int | None = None) -> None:
        with self._lock:
            if not self.flag and (timeout is None or timeout > 0):
                waiter = _Waiter(request, (request.peer, pid, tid), ticket)
                self.queue.append(waiter)
                if timeout is not None:
                    waiter.timer = self.schedule_expiry(timeout, waiter, self.queue, None)
                return
            flag = self.flag
        request.reply(flag)



class BarrierServant(LockedServant):
    """The parties waiting at a barrier, by generation.

    When the last party arrives and the barrier has an action, that party's reply
    asks it to run the action and report back (``action_done``); the others are
    released (or the barrier broken) then. Arrivals meanwhile wait for that.
    """

    def __init__(self, parties: int) -> None:
        super().__init__()
        self.parties = parties
        self.waiters: list[_Waiter] = []
        self.generation = 0
        self.broken = False
        self.acting: tuple[int, int] | None = None  # (peer, generation) running the action
        self.deferred: list[tuple] = []

    # -- under self._lock ---------------------------------------------------------------
    def _arrive(self, request, timeout: float | None, has_action: bool, key: tuple,
                ticket: int | None) -> list:
        if self.acting is not None:
            self.deferred.append((request, timeout, has_action, key, ticket))
            return []
        if self.broken:
            return [partial(request.fail, BrokenBarrierError())]
        index = len(self.waiters)
        if index + 1 == self.parties:
            if has_action:
                self.acting = (request.peer, self.generation)
                for waiter in self.waiters:  # released once the action is done
                    if waiter.timer is not None:
                        waiter.timer.cancel()
                        waiter.timer = None
                return [partial(request.reply, ("action", index, self.generation))]
            return self._pass() + [partial(request.reply, ("ok", index))]
        waiter = _Waiter(request, key, ticket)
        waiter.index = index
        self.waiters.append(waiter)
        if timeout is not None:
            waiter.timer = self._scheduler.call_later(max(0.0, timeout),
                                                      partial(self._timed_out, waiter))
        return []

    def _pass(self) -> list:
        """Release every waiting party with its index; start the next generation."""
        waiters, self.waiters = self.waiters, []
        self.generation += 1
        actions = []
        for waiter in waiters:
            waiter.finish()
            actions.append(partial(waiter.request.reply, ("ok", waiter.index)))
        return actions

    def _break(self) -> list:
        """Break the barrier: every waiting party gets BrokenBarrierError."""
        self.broken = True
        return self._fail_waiters()

    def _fail_waiters(self) -> list:
        waiters, self.waiters = self.waiters, []
        actions = []
        for waiter in waiters:
            waiter.finish()
            actions.append(partial(waiter.request.fail, BrokenBarrierError()))
        return actions

    def _resume(self) -> list:
        """Admit the parties that arrived while the action ran."""
        deferred, self.deferred = self.deferred, []
        actions: list = []
        for args in deferred:
            actions += self._arrive(*args)
        return actions

    def _timed_out(self, waiter: _Waiter) -> None:
        with self._lock:
            if waiter.done:
                return
            actions = self._break()
        self.run_actions(actions)

    # -- operations ---------------------------------------------------------------------
    def op_wait(self, request, timeout: float | None, has_action: bool, pid: int = 0,
                tid: int = 0, ticket: int | None = None) -> None:
        with self._lock:
            actions = self._arrive(request, timeout, has_action, (request.peer, pid, tid), ticket)
        self.run_actions(actions)

    def op_action_done(self, request, generation: int, ok: bool) -> None:
        with self._lock:
            actions: list = []
            if self.acting is not None and self.acting[1] == generation:
                self.acting = None
                actions = self._pass() if ok else self._break()
                actions += self._resume()
        request.reply()
        self.run_actions(actions)

    def op_reset(self, request) -> None:
        with self._lock:
            actions = self._fail_waiters()
            self.broken = False
            self.generation += 1
            if self.acting is not None:
                self.acting = None
                actions += self._resume()
        request.reply()
        self.run_actions(actions)

    def op_abort(self, request) -> None:
        with self._lock:
            actions = self._break()
            if self.acting is not None:
                self.acting = None
                actions += self._resume()
        request.reply()
        self.run_actions(actions)

    def op_state(self, request) -> None:
        with self._lock:
            state = (0 if self.broken else len(self.waiters), self.broken)
        request.reply(state)

    def op_cancel(self, request, pid: int, tid: int, ticket: int, undo_grant: bool) -> None:
        """A party interrupted while waiting breaks the barrier (as in threading)."""
        key = (request.peer, pid, tid)
        with self._lock:
            actions = []
            if any(w.key == key and w.ticket == ticket for w in self.waiters):
                actions = self._break()
        request.reply()
        self.run_actions(actions)

    def peer_lost(self, peer: int) -> None:
        with self._lock:
            self.deferred = [d for d in self.deferred if d[0].peer != peer]
            actions: list = []
            if self.acting is not None and self.acting[0] == peer:
                self.acting = None
                actions = self._break() + self._resume()
            elif any(w.peer == peer for w in self.waiters):
                self.waiters = [w for w in self.waiters if w.peer != peer]
                actions = self._break()
        self.run_actions(actions)


# ------------------------------------------------------------------------------------------
# the handles users hold
# ------------------------------------------------------------------------------------------
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
        deadline = None if timeout is None else time.monotonic() + timeout
        result = predicate()
        while not result:
            if deadline is None:
                self.wait()
            else:
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    break
                self.wait(remaining)
            result = predicate()
        return result

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
