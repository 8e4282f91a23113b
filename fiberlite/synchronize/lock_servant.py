"""The hub side of a Lock or RLock (and of the Conditions built on one): who owns it,
who waits for it, and who waits on its conditions. See :mod:`.servants` for the others.
"""
from __future__ import annotations

import collections
from functools import partial
from typing import Any, Callable

from ..runtime.hub import LockedServant
from .servants import NotOwnedError, _settle, _Waiter

__all__ = ["LockServant"]


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
