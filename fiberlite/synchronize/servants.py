"""The hub side of the primitives: the servants that live in the hub of the process
that created a Lock, Semaphore, Event or Barrier, with the requests waiting on them.

Every wait is a pending request (a timeout is a scheduler timer), so no thread ever
blocks in the hub. The handles users hold (:mod:`fiberlite.synchronize.primitives`)
call these servants' operations, or their direct-call methods from the creating process.
"""
from __future__ import annotations

import collections
from functools import partial
from threading import BrokenBarrierError
from typing import Any, Callable

from ..runtime.hub import LockedServant

__all__ = ["NotOwnedError", "LockServant", "SemaphoreServant", "EventServant", "BarrierServant"]


class NotOwnedError(AssertionError, RuntimeError):
    """An operation that needs the lock held by the calling thread was called without it."""


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
