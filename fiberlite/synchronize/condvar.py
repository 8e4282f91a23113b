"""A condition variable in shared memory: three words beside a lock.

    seq       bumped by each notify that wakes someone: waiters sleep until it changes
    waiters   threads inside wait()
    to_wake   notifications given and not yet taken

``waiters`` and ``to_wake`` change only under the lock. A notify of ``n`` gives at most
``n`` notifications (no more than there are waiters without one) and wakes as many
sleepers; a woken waiter takes one under the lock and returns True, or, finding none
left, sleeps again. So exactly the notified number of waits return True, whichever
process each waiter is in, and a notify never blocks. A waiter whose process dies
while it waits is still counted: a later notify may give it a notification nobody
takes, which the next waiter to wake up takes (a wake-up that stands for one that was
lost, as the stdlib's condition can give).

The lock's operations are passed in (:class:`Holder`), so that the same code waits for
a thread of this process (the lock's C methods) and, in the lock's creator, for a thread
of a job that cannot map the memory (the methods with that job's token).
"""
from __future__ import annotations

import time
from typing import Any, Callable

from ..runtime.shm import sync
from ..runtime.shm.remote import SLICE
from .shared import NotOwnedError

SEQ, WAITERS, TO_WAKE = 0, 1, 2
WAKE_ALL = 1 << 30
WORDS_BYTES = 12
CONDITION_BYTES = WORDS_BYTES + sync.WORD_SPARE  # and what the implementation keeps beside a waited word


class Holder:
    """A lock as one thread holds it: ``is_mine()``, ``depth()``, ``release_save()``,
    ``acquire_restore(depth)``."""

    def __init__(self, mutex: Any, token: int | None = None,
                 released: Callable[[], None] | None = None) -> None:
        """``token``: the thread of a job the creator acts for; ``released()`` is called
        after each release (the calls parked behind the lock are handed it)."""
        self.depth = mutex.depth
        if token is None:
            self.is_mine = mutex.is_mine
            self.release_save = mutex.release_save
            self.acquire_restore = mutex.acquire_restore
            return
        self.is_mine = lambda: mutex.owner() == token
        self.acquire_restore = lambda depth: mutex.acquire_restore(depth, token)

        def release_save() -> int:
            depth = mutex.release_save(token)
            if released is not None:
                released()
            return depth
        self.release_save = release_save


def enter(words: memoryview, holder: Holder) -> tuple[int, int]:
    """Count the caller among the waiters and release the lock: ``(seq, depth)`` for
    :func:`wait`."""
    if not holder.is_mine():
        raise NotOwnedError("must acquire() _lock before using wait()")
    words[WAITERS] += 1
    seq = words[SEQ]
    return seq, holder.release_save()


def wait(words: memoryview, seq_word: Any, holder: Holder, timeout: float | None,
         cancelled: Callable[[], bool] | None = None, entered: tuple[int, int] | None = None) -> bool:
    """Release the lock, wait for a notification (or ``timeout``), hold the lock again;
    whether notified. With ``cancelled``, it is looked at every :data:`SLICE` seconds
    (the creator acting for a job whose call may be withdrawn): once true, the wait
    ends as if timed out. ``entered``: what :func:`enter` returned, called already."""
    deadline = None if timeout is None else time.monotonic() + max(0.0, timeout)
    if entered is None:  # as enter(), in steps an interruption (Ctrl-C) cannot come between:
        if not holder.is_mine():  # it comes only after a call returns, or in a loop
            raise NotOwnedError("must acquire() _lock before using wait()")
        depth = holder.depth()
        words[WAITERS] += 1  # (undone by the handler below from here on)
        seq = words[SEQ]
    else:
        seq, depth = entered
    try:
        if entered is None:
            holder.release_save()
        while True:
            remaining = None if deadline is None else deadline - time.monotonic()
            if cancelled is not None:  # (withdrawn already: no sleep, hold the lock again)
                remaining = 0.0 if cancelled() else SLICE if remaining is None else min(SLICE, remaining)
            if remaining is None or remaining > 0:
                sync.wait(seq_word, seq, remaining)
            holder.acquire_restore(depth)
            if words[TO_WAKE]:
                words[TO_WAKE] -= 1
                words[WAITERS] -= 1
                return True
            if (deadline is not None and time.monotonic() >= deadline) or (cancelled is not None and cancelled()):
                words[WAITERS] -= 1
                return False
            seq = words[SEQ]
            holder.release_save()
    except BaseException:  # interrupted: the lock is held again before the error goes on
        if not holder.is_mine():
            holder.acquire_restore(depth)
        words[WAITERS] -= 1
        if words[TO_WAKE] > words[WAITERS]:
            words[TO_WAKE] = words[WAITERS]
        raise


def notify(words: memoryview, seq_word: Any, holder: Holder, n: int | None) -> int:
    """Notify up to ``n`` waiters (None: all); how many."""
    if not holder.is_mine():
        raise NotOwnedError("lock is not owned")
    waiting = words[WAITERS] - words[TO_WAKE]
    count = waiting if n is None else min(n, waiting)
    if count > 0:
        words[TO_WAKE] += count
        sync.add(seq_word, 1)
        sync.wake(seq_word, count)
    return max(count, 0)


def sleepers(words: memoryview) -> int:
    """The waiters without a notification yet."""
    return words[WAITERS] - words[TO_WAKE]


def cells(buffer: Any, offset: int) -> tuple[memoryview, Any]:
    """The condition's words at ``offset`` of ``buffer``, and ``seq`` as a waited word."""
    words = memoryview(buffer)[offset:offset + WORDS_BYTES].cast("I")
    return words, sync.word(buffer, offset, offset + WORDS_BYTES)


# -- in the lock's creator, for a job that cannot map the memory ---------------------------
def remote_wait(servant: Any, request: Any, cid: str, timeout: float | None, pid: int, tid: int,
                ticket: int) -> None:
    """Wait on the condition ``cid`` of the lock of ``servant`` for a thread of a job; the
    answer (notified or not) comes once that thread holds the lock again."""
    block = servant.conditions[cid]
    words, seq_word = cells(block.buffer, block.offset)
    holder = Holder(servant.mutex, servant.token(request, pid, tid), servant.waits.released)
    key = (request.peer, pid, tid, ticket)
    waits = servant.waits
    # the lock is given back here, at once: whoever waits for it need not wait for a thread
    entered = enter(words, holder)

    def attempt(_: float | None) -> Any:  # one whole wait (sliced inside), withdrawn with the call
        return wait(words, seq_word, holder, timeout, lambda: not waits.waiting(key), entered)
    waits.start(request, key, attempt, None, False)


def remote_resume(servant: Any, request: Any, pid: int, tid: int, ticket: int) -> None:
    """The job's thread was interrupted in a wait: answered once it holds the lock again.
    The threads waiting here are woken, so that the withdrawn wait ends at once, not at
    the end of its slice (the others find no notification and sleep again)."""
    servant.waits.cancel((request.peer, pid, tid, ticket), then=request.reply)
    for block in list(servant.conditions.values()):  # (which one it waits on is not said)
        seq_word = cells(block.buffer, block.offset)[1]
        sync.add(seq_word, 1)  # (a thread about to sleep on the old value does not)
        sync.wake(seq_word, WAKE_ALL)


def remote_notify(servant: Any, request: Any, cid: str, n: int | None, pid: int, tid: int) -> None:
    block = servant.conditions[cid]
    words, seq_word = cells(block.buffer, block.offset)
    request.reply(notify(words, seq_word, Holder(servant.mutex, servant.token(request, pid, tid)), n))
