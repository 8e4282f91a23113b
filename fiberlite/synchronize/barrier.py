"""``Barrier``: ``threading.Barrier``'s algorithm on a lock, a condition and a few words in shared memory.

    the barrier's own lock (a Mutex), then its condition (:mod:`.condvar`), then the
    words: state, count, parties, generation, the slot running the action, and the slot
    of the party at each arrival index (0: none)

The action runs in the last party to arrive, in whichever process that is, outside the
lock: the others wait meanwhile (state ``ACTING``) and are released, or get
``BrokenBarrierError``, once it reports (:func:`action_done`). Each party records its
process's slot at its arrival index, so that when a process dies
(:meth:`BarrierServant.recover`) the barrier knows it lost a party: it breaks, and
forgets the dead party's arrival, so that a ``reset()`` can bring it back to use.

A round that passes is done by the party that completes it, for all: it forgets every
arrival, bumps the generation and wakes the others. They sleep on the condition's
sequence word without being counted as its waiters, and leave as soon as they see the
generation moved, without taking the lock again: a round's parties go back to work side
by side, not one after another behind the lock (each a wake-up and a scheduling turn).
The next round may fill at once. A party takes the lock again only to leave a round
that did not pass (broken, reset, timed out, interrupted), as it did before.
"""
from __future__ import annotations

import time
from threading import BrokenBarrierError
from typing import Any, Callable

from ..runtime.shm import sync
from ..units import check_timeout
from ..runtime.shm.arena import CREATOR_SLOT, Block
from ..runtime.shm.remote import SLICE
from . import condvar
from .shared import BlockServant, SharedPrimitive, blocking_call, remote_call

__all__ = ["Barrier"]

FILLING, RESETTING, BROKEN, ACTING = 0, 2, 3, 4  # (1 was a passed round's parties leaving)
COND_OFFSET = sync.MUTEX_BYTES  # bytes
_BASE = (COND_OFFSET + condvar.CONDITION_BYTES) // 4  # words
STATE, COUNT, PARTIES, GENERATION, ACTOR, ARRIVALS = range(_BASE, _BASE + 6)


def barrier_bytes(parties: int) -> int:
    return 4 * (ARRIVALS + parties)


class _Barrier:
    """The words of one barrier, used by one thread (``holder``: how it holds the lock)."""

    def __init__(self, buffer: Any, offset: int, mutex: Any, token: int | None = None) -> None:
        self.words = memoryview(buffer)[offset:offset + barrier_bytes(1)].cast("I")
        parties = self.words[PARTIES]
        self.words = memoryview(buffer)[offset:offset + barrier_bytes(parties)].cast("I")
        self.cond_words, self.seq_word = condvar.cells(buffer, offset + COND_OFFSET)
        self.holder = condvar.Holder(mutex, token)
        self.mutex = mutex
        self.token = token

    def lock(self) -> None:
        if self.token is None:
            self.mutex.acquire()
        else:
            self.mutex.acquire_as(self.token)

    def unlock(self) -> None:
        if self.token is None:
            self.mutex.release()
        else:
            self.mutex.release_as(self.token)

    def wait_cond(self, timeout: float | None, cancelled: Callable[[], bool] | None) -> bool:
        return condvar.wait(self.cond_words, self.seq_word, self.holder, timeout, cancelled)

    def notify_all(self) -> None:
        condvar.notify(self.cond_words, self.seq_word, self.holder, None)

    # -- under the lock ------------------------------------------------------------------
    def arrive(self, slot: int, timeout: float | None, has_action: bool,
               cancelled: Callable[[], bool] | None = None) -> tuple:
        """One party's wait: ``("ok", index)``, or ``("action", index, generation)`` for
        the last one when there is an action to run first (then :meth:`action_done`)."""
        w = self.words
        try:  # (an interruption may come just after the lock is taken, in lock() itself)
            self.lock()
            while w[STATE] in (RESETTING, ACTING):  # the previous round is leaving, or acting
                self.wait_cond(None, cancelled)
                if cancelled is not None and cancelled():
                    raise BrokenBarrierError
            if w[STATE] == BROKEN:
                raise BrokenBarrierError
            index = w[COUNT]
            w[COUNT] += 1
            w[ARRIVALS + index] = slot
            if index + 1 == w[PARTIES]:
                if has_action:
                    w[STATE], w[ACTOR] = ACTING, slot
                    return ("action", index, w[GENERATION])  # counted until the action is done
                self._pass()
                return ("ok", index)
            generation = w[GENERATION]
            self.unlock()
            self._await_round(generation, index, timeout, cancelled)
            return ("ok", index)
        finally:
            if self.holder.is_mine():
                self.unlock()

    def _await_round(self, generation: int, index: int, timeout: float | None,
                     cancelled: Callable[[], bool] | None) -> None:
        """(lock not held) Until round ``generation`` passes; the barrier breaks if it does
        not in time (or the call is withdrawn), and a broken or reset one raises. A round
        that passed is left without the lock; any other way out leaves it under the lock."""
        w, seq_word = self.words, self.seq_word
        deadline = None if timeout is None else time.monotonic() + timeout
        try:
            while True:
                seq = self.cond_words[condvar.SEQ]  # (before the look: a release after it moves seq)
                if w[GENERATION] != generation:
                    return  # passed: the party that completed the round let everyone go
                if w[STATE] in (BROKEN, RESETTING):
                    break
                remaining = None if deadline is None else deadline - time.monotonic()
                if (remaining is not None and remaining <= 0) or (cancelled is not None and cancelled()):
                    break
                if cancelled is not None:  # looked at every slice
                    remaining = SLICE if remaining is None else min(SLICE, remaining)
                sync.wait(seq_word, seq, remaining)
        except BaseException:
            self._leave_unpassed(generation, index, False)
            raise
        if not self._leave_unpassed(generation, index, True):
            raise BrokenBarrierError

    def _leave_unpassed(self, generation: int, index: int, break_it: bool) -> bool:
        """Take the lock to leave a round: True if it passed meanwhile (nothing to leave);
        else leave it, breaking the barrier first if it is still filling (``break_it``:
        the party timed out, or its call was withdrawn)."""
        w = self.words
        self.lock()
        try:
            if w[GENERATION] != generation:
                return True
            if break_it and w[STATE] in (FILLING, ACTING):
                self._break()
            self._leave(index)
            return False
        finally:
            self.unlock()

    def _release_all(self) -> None:
        """Wake every party asleep on the round, and every caller waiting to enter."""
        self.notify_all()
        sync.add(self.seq_word, 1)
        sync.wake(self.seq_word, condvar.WAKE_ALL)

    def _pass(self) -> None:
        """The round is complete: forget its arrivals, open the next one, let all go."""
        w = self.words
        for i in range(w[PARTIES]):
            w[ARRIVALS + i] = 0
        w[COUNT] = 0
        w[STATE] = FILLING
        w[GENERATION] += 1
        self._release_all()

    def _leave(self, index: int) -> None:
        w = self.words
        if w[ARRIVALS + index]:  # (unless the party was given up for lost meanwhile)
            w[ARRIVALS + index] = 0
            w[COUNT] -= 1
        self._settle()

    def _settle(self) -> None:
        w = self.words
        if w[COUNT] == 0 and w[STATE] == RESETTING:
            w[STATE] = FILLING
            w[GENERATION] += 1
            self.notify_all()

    def _break(self) -> None:
        self.words[STATE] = BROKEN
        self._release_all()

    # -- operations ----------------------------------------------------------------------
    def action_done(self, generation: int, ok: bool, index: int) -> None:
        w = self.words
        self.lock()
        try:
            if w[STATE] == ACTING and w[GENERATION] == generation:
                if ok:
                    self._pass()
                else:
                    self._break()
            self._leave(index)
        finally:
            self.unlock()

    def reset(self) -> None:
        w = self.words
        self.lock()
        try:
            w[STATE] = RESETTING if w[COUNT] else FILLING
            self._release_all()
        finally:
            self.unlock()

    def abort(self) -> None:
        self.lock()
        try:
            self._break()
        finally:
            self.unlock()

    def state(self) -> tuple[int, bool]:
        """``(n_waiting, broken)``."""
        w = self.words
        return (w[COUNT] if w[STATE] == FILLING else 0, w[STATE] == BROKEN)

    def lose(self, slot: int) -> None:
        """The process of ``slot`` is gone: if it was a party, the barrier breaks and
        forgets it (the lock is taken from it first if it died holding it)."""
        w = self.words
        self.lock()
        try:
            lost = [i for i in range(w[PARTIES]) if w[ARRIVALS + i] == slot]
            if not lost:
                return
            for index in lost:
                w[ARRIVALS + index] = 0
                w[COUNT] -= 1
            if w[STATE] in (FILLING, ACTING):
                self._break()
            self._settle()
        finally:
            self.unlock()


class BarrierServant(BlockServant):
    """A barrier in its creator's hub: acts for the jobs that cannot map it, and breaks it
    when a party's process goes."""

    def __init__(self, block: Block) -> None:
        super().__init__(block)
        self.mutex = sync.Mutex(block.buffer, block.offset, CREATOR_SLOT)
        self.barrier = _Barrier(block.buffer, block.offset, self.mutex)

    def recover(self, slot: int) -> None:
        self.mutex.recover(slot)
        self.barrier.lose(slot)

    def _acting_for(self, request, pid: int, tid: int) -> _Barrier:
        return _Barrier(self.block.buffer, self.block.offset, self.mutex, self.token(request, pid, tid))

    def op_wait(self, request, timeout: float | None, has_action: bool, pid: int, tid: int,
                ticket: int) -> None:
        barrier = self._acting_for(request, pid, tid)
        key = (request.peer, pid, tid, ticket)
        slot = self.users.slot(request.peer)
        waits = self.waits

        def attempt(_: float | None) -> Any:  # one whole wait (sliced inside), withdrawn with the call
            return barrier.arrive(slot, timeout, has_action, lambda: not waits.waiting(key))
        waits.start(request, key, attempt, None, None)

    def op_action_done(self, request, generation: int, ok: bool, index: int) -> None:
        self.barrier.action_done(generation, ok, index)
        request.reply()

    def op_reset(self, request) -> None:
        self.barrier.reset()
        request.reply()

    def op_abort(self, request) -> None:
        self.barrier.abort()
        request.reply()

    def op_state(self, request) -> None:
        request.reply(self.barrier.state())


class Barrier(SharedPrimitive):
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
        block = self._create(barrier_bytes(parties), BarrierServant)
        memoryview(block.buffer)[block.offset:block.offset + barrier_bytes(parties)].cast("I")[PARTIES] = parties
        sync.setup_mutex(block.buffer, block.offset)
        sync.setup_word(block.buffer, block.offset + COND_OFFSET)
        self._publish()

    def _getstate(self) -> tuple:
        return (self._parties, self._action, self._timeout)

    def _setstate(self, state: tuple) -> None:
        self._parties, self._action, self._timeout = state

    def _bind(self, buffer: Any, offset: int, slot: int) -> None:
        self._mutex = sync.Mutex(buffer, offset, slot)
        self._barrier = _Barrier(buffer, offset, self._mutex)
        self._slot = slot

    def wait(self, timeout: float | None = None) -> int:
        """Wait for all parties; return this party's arrival index (0 .. parties-1)."""
        if timeout is None:
            timeout = self._timeout
        check_timeout(timeout)
        has_action = self._action is not None
        if self._local:
            reply = self._barrier.arrive(self._slot, timeout, has_action)
        else:
            reply = blocking_call(self._ref, "wait", timeout, has_action)
        if reply[0] == "ok":
            return reply[1]
        _, index, generation = reply
        try:
            self._action()  # type: ignore[misc]
        except BaseException:
            self._action_done(generation, False, index)
            raise
        self._action_done(generation, True, index)
        return index

    def _action_done(self, generation: int, ok: bool, index: int) -> None:
        if self._local:
            self._barrier.action_done(generation, ok, index)
        else:
            remote_call(self._ref, "action_done", generation, ok, index)

    def reset(self) -> None:
        """Return to the empty state; parties waiting get BrokenBarrierError."""
        self._barrier.reset() if self._local else remote_call(self._ref, "reset")

    def abort(self) -> None:
        """Break the barrier: current and future waits raise BrokenBarrierError."""
        self._barrier.abort() if self._local else remote_call(self._ref, "abort")

    def _state(self) -> tuple[int, bool]:
        return self._barrier.state() if self._local else remote_call(self._ref, "state")

    @property
    def parties(self) -> int:
        return self._parties

    @property
    def n_waiting(self) -> int:
        return self._state()[0]

    @property
    def broken(self) -> bool:
        return self._state()[1]

    def __repr__(self) -> str:
        try:
            n_waiting, broken = self._state()
        except Exception:
            return f"<{type(self).__name__} at {id(self):#x}: unknown>"
        if broken:
            return f"<{type(self).__name__} at {id(self):#x}: broken>"
        return f"<{type(self).__name__} at {id(self):#x}: waiters={n_waiting}/{self._parties}>"
