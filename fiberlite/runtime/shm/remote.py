"""Acting in this process's shared memory for the jobs that cannot map it.

A job on another machine (or with ``share_machine`` off) reaches a lock, a semaphore,
a ``Value`` through its creator's hub. The object's servant acts for it on the same
memory, naming the job by a slot of its own (:class:`RemoteUsers`): what the job holds
is recorded in the memory as if it had mapped it, and recovered when its connection
to this hub ends.

A call that has to wait waits on a thread of its own (:class:`Waits`), in slices of
:data:`SLICE` seconds, so that a call withdrawn (its caller was interrupted, or went)
stops within a slice; if it got what it waited for meanwhile, that is given back. The
threads are kept for a while once idle (:class:`_Workers`): starting one costs more
than most waits. A call that waits for a lock held by another job acting through this
hub needs no thread: the release comes through here too, and hands the lock on to the
first call parked behind it (:meth:`Waits.released`). Waking a thread for each
hand-over cost two jobs incrementing one ``Value`` under its lock 40% more of the hub's
CPU, and 15% more time.
"""
from __future__ import annotations

import queue
import threading
import time
from typing import Any, Callable, Hashable

from ..hub import LOCAL_PEER, Servant, get_hub
from . import sync
from .arena import CREATOR_SLOT, Arena

SLICE = 0.2
NOT_YET = object()  # what an attempt returns while the call has to wait on
IDLE_SECONDS = 30.0  # how long a waiting thread with nothing to do is kept


class _Workers:
    """Threads that run calls, each thread kept for :data:`IDLE_SECONDS` once idle."""

    def __init__(self) -> None:
        self._tasks: queue.SimpleQueue = queue.SimpleQueue()
        self._idle = 0  # threads waiting for a task, not yet promised one
        self._lock = threading.Lock()

    def submit(self, task: Callable[[], None]) -> None:
        self._tasks.put(task)
        with self._lock:
            if self._idle:
                self._idle -= 1  # an idle thread takes it
                return
        threading.Thread(target=self._work, daemon=True, name="fiberlite-remote-wait").start()

    def _work(self) -> None:
        while True:
            try:
                task = self._tasks.get(timeout=IDLE_SECONDS)
            except queue.Empty:
                with self._lock:
                    if self._idle and self._tasks.empty():
                        self._idle -= 1
                        return
                continue  # a task was promised to this thread: it comes
            try:
                task()
            finally:
                with self._lock:
                    self._idle += 1


_workers = _Workers()


class RemoteUsers(Servant):
    """The slots of the jobs that use this process's memory through its hub, and the
    tokens of their threads; it hears of each job whose connection ends, after every
    primitive's servant has withdrawn the job's waiting calls (a call granted after the
    recovery would hold for ever what a dead job never gives back)."""

    hears_loss_last = True

    def __init__(self, arena: Arena) -> None:
        self._arena = arena
        self._slots: dict[int, int] = {}
        self._acting: set[int] = set()  # the slots of self._slots
        self._threads: dict[int, dict[tuple[int, int], int]] = {}
        self._lock = threading.Lock()

    def slot(self, peer: int) -> int:
        if peer == LOCAL_PEER:
            return CREATOR_SLOT
        with self._lock:
            slot = self._slots.get(peer)
            if slot is None:
                slot = self._slots[peer] = self._arena.slots.take()
                self._acting.add(slot)
            return slot

    def acting_for(self, token: int) -> bool:
        """Whether ``token`` names a thread of a job this hub acts for (what it holds is
        given back through here, or by its recovery)."""
        return (token >> sync.THREAD_BITS) in self._acting

    def token(self, peer: int, pid: int, tid: int) -> int:
        """The token that names thread ``tid`` of process ``pid`` of the job ``peer``."""
        slot = self.slot(peer)
        with self._lock:
            threads = self._threads.setdefault(peer, {})
            index = threads.get((pid, tid))
            if index is None:
                index = threads[(pid, tid)] = len(threads) % ((1 << sync.THREAD_BITS) - 1) + 1
        return (slot << sync.THREAD_BITS) | index

    def peer_lost(self, peer: int) -> None:
        with self._lock:
            slot = self._slots.pop(peer, None)
            self._threads.pop(peer, None)
            self._acting.discard(slot)
        if slot is not None:
            threading.Thread(target=self._arena.recover, args=(slot,), daemon=True,
                             name="fiberlite-shm-recover").start()


_users: RemoteUsers | None = None
_users_lock = threading.Lock()


def remote_users(arena: Arena) -> RemoteUsers:
    """This process's :class:`RemoteUsers` of ``arena`` (registered in its hub)."""
    global _users
    if _users is None or _users._arena is not arena:
        with _users_lock:
            if _users is None or _users._arena is not arena:
                _users = RemoteUsers(arena)
                get_hub().register(_users)
    return _users


class _Wait:
    __slots__ = ("peer", "cancelled", "answering", "done", "after")

    def __init__(self, peer: int) -> None:
        self.peer = peer
        self.cancelled = False
        self.answering = False  # its answer is on its way (a withdrawal's waits for it)
        self.done = False
        self.after: list[Callable[[], None]] = []


class _Parked:
    """A call kept until a release made here (:meth:`Waits.released`) answers it."""

    __slots__ = ("request", "attempt", "deadline", "timed_out", "undo", "timer")

    def __init__(self, request, attempt, deadline, timed_out, undo) -> None:
        self.request = request
        self.attempt = attempt
        self.deadline = deadline
        self.timed_out = timed_out
        self.undo = undo
        self.timer: Any = None


class Waits:
    """The calls of jobs waiting on one object: each on a thread of its own, or parked
    while ``parkable()`` says that what they wait for is given back through this hub
    (and no call waits on a thread: those come first)."""

    def __init__(self, parkable: Callable[[], bool] | None = None) -> None:
        self._waits: dict[Hashable, _Wait] = {}
        self._parked: dict[Hashable, _Parked] = {}  # in the order they came
        self._parkable = parkable
        self._polling = False
        self._lock = threading.Lock()

    def start(self, request: Any, key: Hashable, attempt: Callable[[float | None], Any],
              timeout: float | None, timed_out: Any, undo: Callable[[Any], None] | None = None,
              parks: bool = False) -> None:
        """Answer ``request`` with what ``attempt(seconds)`` returns once it is not
        :data:`NOT_YET`, or with ``timed_out`` after ``timeout``; a call withdrawn
        (:meth:`cancel`) is not answered, and what it got is given back with ``undo``.
        ``parks``: the call is an acquire of what ``parkable`` is about (``attempt(None)``
        takes it without waiting), which may be parked."""
        deadline = None if timeout is None else time.monotonic() + max(0.0, timeout)
        if parks and self._parkable is not None and not self._waits and self._parkable():
            self._park(key, _Parked(request, attempt, deadline, timed_out, undo))
        else:
            self._start_thread(request, key, attempt, deadline, timed_out, undo)

    def _start_thread(self, request, key, attempt, deadline, timed_out, undo) -> None:
        wait = _Wait(request.peer)
        with self._lock:
            self._waits[key] = wait
        _workers.submit(lambda: self._run(request, key, wait, attempt, deadline, timed_out, undo))

    # -- calls parked until a release made here ---------------------------------------------
    def _park(self, key: Hashable, parked: _Parked) -> None:
        scheduler = get_hub().scheduler
        with self._lock:
            self._parked[key] = parked
            if parked.deadline is not None:
                parked.timer = scheduler.call_later(parked.deadline - time.monotonic(),
                                                    lambda: self._expire(key, parked))
            poll, self._polling = not self._polling, True
        if poll:  # what a release elsewhere gave back (a Lock released by another job) is seen
            scheduler.call_later(SLICE, self._poll)
        self.released()  # released between the caller's attempt and now

    def released(self) -> None:
        """Something was given back: answer the parked calls that get what they wait for
        now, first come first served; those that no longer can be parked get a thread."""
        if not self._parked:
            return
        answers: list[tuple[_Parked, Any, Exception | None]] = []
        with self._lock:
            while self._parked:
                key, parked = next(iter(self._parked.items()))
                try:
                    result, error = parked.attempt(None), None
                except Exception as exc:
                    result, error = None, exc
                if result is NOT_YET:
                    break
                del self._parked[key]
                answers.append((parked, result, error))
            unparked = []
            if self._parked and (self._waits or not self._parkable()):
                unparked, self._parked = list(self._parked.items()), {}
        for parked, result, error in answers:
            self._answer(parked, result, error)
        for key, parked in unparked:
            self._cancel_timer(parked)
            self._start_thread(parked.request, key, parked.attempt, parked.deadline,
                               parked.timed_out, parked.undo)

    def _answer(self, parked: _Parked, result: Any, error: Exception | None) -> None:
        self._cancel_timer(parked)
        if error is not None:
            parked.request.fail(error)
        else:
            parked.request.reply(result)

    @staticmethod
    def _cancel_timer(parked: _Parked) -> None:
        if parked.timer is not None:
            parked.timer.cancel()

    def _expire(self, key: Hashable, parked: _Parked) -> None:
        with self._lock:
            if self._parked.get(key) is not parked:
                return
            del self._parked[key]
        parked.request.reply(parked.timed_out)

    def _poll(self) -> None:
        self.released()
        with self._lock:
            again = self._polling = bool(self._parked)
        if again:
            get_hub().scheduler.call_later(SLICE, self._poll)

    # -- calls on threads of their own -------------------------------------------------------
    def _run(self, request, key, wait: _Wait, attempt, deadline, timed_out, undo) -> None:
        result: Any = NOT_YET
        error: Exception | None = None
        try:
            while True:  # one attempt at least, even if withdrawn before it began: an
                # attempt may have to restore what the call gave up first (a condition's lock)
                remaining = None if deadline is None else deadline - time.monotonic()
                if remaining is not None and remaining <= 0:
                    result = timed_out
                    break
                result = attempt(0.0 if wait.cancelled else
                                 SLICE if remaining is None else min(SLICE, remaining))
                if result is not NOT_YET or wait.cancelled:
                    break
        except Exception as exc:
            error = exc
        with self._lock:
            wait.answering = not wait.cancelled
        if wait.answering:
            if error is not None:
                request.fail(error)
            else:
                request.reply(result)
        elif result is not NOT_YET and undo is not None:
            try:
                undo(result)
            except Exception:  # the job's recovery gave it back first
                pass
        with self._lock:
            if self._waits.get(key) is wait:
                del self._waits[key]
            wait.done = True
            after, wait.after = wait.after, []
        for call in after:
            call()
        self.released()  # what this call's attempt gave back

    def __bool__(self) -> bool:
        """Whether any call waits."""
        return bool(self._waits) or bool(self._parked)

    def waiting(self, key: Hashable) -> bool:
        """Whether the call ``key`` is still waiting (not withdrawn, not answered)."""
        return key in self._waits or key in self._parked

    def cancel(self, key: Hashable, then: Callable[[], None] | None = None, prompt: bool = False) -> bool:
        """Withdraw the call ``key``: whether it was still waiting. ``then`` is called once
        its thread is done (at once if it is not waiting); with ``prompt``, as soon as the
        call will not be answered (its answer, if it was already on its way, first): what
        its thread gets after that is given back with its ``undo``."""
        with self._lock:
            parked = self._parked.pop(key, None)
            wait = self._waits.pop(key, None)
            if wait is not None:
                wait.cancelled = True
                if then is not None and not wait.done and (wait.answering or not prompt):
                    wait.after.append(then)
                    then = None
        if parked is not None:
            self._cancel_timer(parked)
        if then is not None:
            then()
        return (wait is not None and not wait.answering) or parked is not None

    def cancel_peer(self, peer: int) -> None:
        """Withdraw every call of the job ``peer`` (its connection ended)."""
        with self._lock:
            keys = [key for key, wait in self._waits.items() if wait.peer == peer]
            keys += [key for key, parked in self._parked.items() if parked.request.peer == peer]
        for key in keys:
            self.cancel(key)
