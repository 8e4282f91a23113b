"""The hub side of the primitives: the servants that live in the hub of the process
that created a Semaphore, Event or Barrier, with the requests waiting on them, and what
every servant shares (a waiting request, :class:`_Waiter`). The lock's servant, with its
owners and conditions, is in :mod:`.lock_servant`.

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

__all__ = ["NotOwnedError", "SemaphoreServant", "EventServant", "BarrierServant"]


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
