"""``Lock`` and ``RLock``: a word in shared memory that names its holder.

In every process that maps the lock's memory, ``acquire`` and ``release`` are the C
methods of a :class:`~fiberlite.runtime.shm.sync.Mutex` (a compare-and-swap when the
lock is free, a futex wait when it is not), at the cost of ``multiprocessing``'s lock.
The holder's token stays in the memory, so that when its process dies the creator
gives the lock back (:meth:`LockServant.recover`). Processes that cannot map it
acquire and release through the creator's hub (:class:`LockServant` acts for them).

The lock's servant also keeps the state of the conditions built on it
(:mod:`.condition`): a condition's words live beside its lock, in the lock's creator.
"""
from __future__ import annotations

from typing import Any

from ..runtime.shm import sync
from ..units import check_timeout
from ..runtime.shm.arena import CREATOR_SLOT, Block, arena
from ..runtime.shm.place import Place
from ..runtime.shm.remote import Waits
from ..runtime.hub import current_hub
from . import carry, condvar
from .shared import BlockServant, SharedPrimitive, blocking_call, caller, owner_name, remote_call, remote_post

MUTEX_BYTES = sync.MUTEX_BYTES


class LockServant(BlockServant):
    """A lock in its creator's hub: acts for the jobs that cannot map it."""

    def __init__(self, block: Block, recursive: bool) -> None:
        super().__init__(block)
        self.mutex = sync.Mutex(block.buffer, block.offset, CREATOR_SLOT, recursive)
        self.conditions: dict[str, Block] = {}

    def make_waits(self) -> Waits:
        # a call waiting for a job that holds the lock through this hub is handed the lock
        # at that job's release, here (Waits.released)
        return Waits(parkable=lambda: self.users.acting_for(self.mutex.owner()))

    def recover(self, slot: int) -> None:
        self.mutex.recover(slot)
        self.waits.released()

    def op_acquire(self, request, block: bool, timeout: float | None, pid: int, tid: int,
                   ticket: int) -> None:
        token, mutex = self.token(request, pid, tid), self.mutex

        def give_back() -> None:
            if mutex.owner() == token:
                mutex.release_as(token)
                self.waits.released()
        self.acquire_for(request, block, timeout, pid, tid, ticket,
                         lambda wait, seconds: mutex.acquire_as(token, wait, seconds), give_back)

    def op_acquire_carry(self, request, block: bool, timeout: float | None, oid: int, pid: int,
                         tid: int, ticket: int) -> None:
        """An acquire whose answer carries the bytes of the object ``oid`` of this hub
        (:mod:`.carry`): ``(granted, bytes or None)``."""
        raw = current_hub().servant(oid)
        self.op_acquire(carry.SnapshotReply(request, raw, self.mutex.depth), block, timeout,
                        pid, tid, ticket)

    def op_release_carry(self, request, oid: int, data: bytes | None, pid: int, tid: int) -> None:
        """Write ``data`` (what the holder wrote to its copy) into the object ``oid``, then release."""
        self._write_back(request, oid, data, pid, tid)
        self.op_release(request, pid, tid)

    def op_carry_write(self, request, oid: int, data: bytes | None, pid: int, tid: int) -> None:
        self._write_back(request, oid, data, pid, tid)
        request.reply()

    def _write_back(self, request, oid: int, data: bytes | None, pid: int, tid: int) -> None:
        if data is None:
            return
        if self.mutex.owner() != self.token(request, pid, tid):
            raise AssertionError("the lock's copy was written back by a thread that does not hold it")
        carry.write_back(current_hub().servant(oid), data)

    def op_release(self, request, pid: int, tid: int) -> None:
        released = self.mutex.release_as(self.token(request, pid, tid))
        self.waits.released()  # the next job waiting has it before this one hears
        request.reply(released)

    def op_state(self, request, pid: int, tid: int) -> None:
        """``(held by the caller, the holder's token, the caller's token, depth)``."""
        token = self.token(request, pid, tid)
        owner = self.mutex.owner()
        request.reply((owner == token, owner, token, self.mutex.depth()))

    def op_condition(self, request, size: int) -> None:
        """A new condition's memory, beside the lock: ``(cid, place)``."""
        block = arena().allocate(size)
        sync.setup_word(block.buffer, block.offset)  # the condition's sequence, waited on
        cid = f"{block.segment}:{block.offset}"
        self.conditions[cid] = block
        request.reply((cid, Place(arena().cookie, block.segment, block.offset, block.size)))

    # a remote thread's wait and notify on one of the lock's conditions (see .condvar)
    def op_cond_wait(self, request, cid: str, timeout: float | None, pid: int, tid: int,
                     ticket: int) -> None:
        condvar.remote_wait(self, request, cid, timeout, pid, tid, ticket)

    def op_cond_resume(self, request, pid: int, tid: int, ticket: int) -> None:
        condvar.remote_resume(self, request, pid, tid, ticket)

    def op_cond_notify(self, request, cid: str, n: int | None, pid: int, tid: int) -> None:
        condvar.remote_notify(self, request, cid, n, pid, tid)

    def op_cond_state(self, request, cid: str) -> None:
        block = self.conditions[cid]
        request.reply(condvar.sleepers(condvar.cells(block.buffer, block.offset)[0]))


class _LockBase(SharedPrimitive):
    _recursive = False

    def __init__(self, *, ctx: Any = None) -> None:
        block = self._create(MUTEX_BYTES, LockServant, self._recursive)
        sync.setup_mutex(block.buffer, block.offset)
        self._publish()

    def acquire(self, block: bool = True, timeout: float | None = None) -> bool:
        """Acquire the lock; wait up to ``timeout`` seconds (None: forever). True if acquired."""
        return self.acquire(block, timeout)  # (the instance's own, bound by _bind)

    def release(self) -> None:
        """Release the lock (ValueError if unlocked; an RLock must be held by the caller)."""
        self.release()

    def _bind(self, buffer: Any, offset: int, slot: int) -> None:
        self._mutex = mutex = sync.Mutex(buffer, offset, slot, self._recursive)
        self.acquire = mutex.acquire  # C methods, as multiprocessing binds its SemLock's
        self.release = mutex.release
        self._leave = getattr(mutex, "leave", mutex.release)  # (the portable path's: see __exit__)

    def _bind_remote(self) -> None:
        super()._bind_remote()
        self._mutex = None
        self._carry: tuple[tuple[str, int], type] | None = None
        self.acquire = self._acquire_remote
        self.release = self._release_remote
        self._leave = self._release_remote

    def _carry_with(self, oid: int, ctype: type) -> None:
        """(an RLock of another machine, bound to a small object of its creator) Its
        acquire brings a copy of the object, its release what was written (:mod:`.carry`)."""
        if self._recursive and not self._local and self._carry is None:
            self._carry = ((self._ref.address, oid), ctype)

    def _acquire_remote(self, block: bool = True, timeout: float | None = None) -> bool:
        """Acquire the lock; wait up to ``timeout`` seconds (None: forever). True if acquired."""
        check_timeout(timeout)
        bound = self._carry
        if bound is None or carry.live(bound[0]) is not None:  # (held already: a copy is in use)
            self._settle()
            return blocking_call(self._ref, "acquire", block, timeout, undo_grant=True)
        key, ctype = bound
        got, data = blocking_call(self._ref, "acquire_carry", block, timeout, key[1], undo_grant=True)
        if got and data is not None:
            carry.begin(key, ctype, data, self._settle)
        return got

    def _release_remote(self) -> None:
        """Release the lock (ValueError if unlocked; an RLock must be held by the caller)."""
        bound = self._carry
        carried = carry.end(bound[0]) if bound is not None else None
        if carried is None:
            remote_call(self._ref, "release", *caller())
        else:  # (held by this thread: the release cannot fail, its answer is not waited for)
            remote_post(self._ref, "release_carry", bound[0][1], carried.written(), *caller())

    def _settle(self) -> None:
        """Write this thread's copy of the carried object back, and read and write the
        object by calls from now on (until the lock is acquired afresh)."""
        bound = self._carry if not self._local else None
        carried = carry.end(bound[0]) if bound is not None else None
        if carried is not None and carried.dirty:
            remote_call(self._ref, "carry_write", bound[0][1], carried.written(), *caller())

    def __enter__(self) -> bool:
        return self.acquire()

    def __exit__(self, *exc: Any) -> None:
        # the hold __enter__ took: on the portable path, an RLock's release without the
        # conversion of its error (a plain AssertionError, as multiprocessing raises)
        self._leave()

    def _state(self) -> tuple[bool, int, int, int]:
        """``(mine, owner, my token, depth)``."""
        mutex = self._mutex
        if mutex is not None:
            return mutex.is_mine(), mutex.owner(), mutex.token(), mutex.depth()
        return remote_call(self._ref, "state", *caller())

    def _is_mine(self) -> bool:
        return self._state()[0]


class Lock(_LockBase):
    """A non-recursive lock (``multiprocessing.Lock``): any thread or job may release it."""

    def __repr__(self) -> str:
        try:
            mine, owner, token, _ = self._state()
            name = owner_name(mine, owner, token)
        except Exception:
            name = "unknown"
        return f"<Lock(owner={name})>"


class RLock(_LockBase):
    """A recursive lock (``multiprocessing.RLock``): only its owner thread may release it."""

    _recursive = True

    def __repr__(self) -> str:
        try:
            mine, owner, token, depth = self._state()
            name = owner_name(mine, owner, token)
            count: Any = depth if mine else (0 if not owner else "nonzero")
        except Exception:
            name, count = "unknown", "unknown"
        return f"<RLock({name}, {count})>"
