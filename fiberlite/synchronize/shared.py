"""What every primitive in shared memory shares: where it is, and how a process uses it.

A primitive's state is a block of its creator's shared memory
(:mod:`fiberlite.runtime.shm`). Its handle pickles to any job of the run with the
block's :class:`~fiberlite.runtime.shm.place.Place` and a reference to the primitive's
servant in the creator's hub. A process that can map the block (its creator, and the
processes of its machine) binds the handle to the memory and works on it directly; any
other binds it to the servant, which acts on the same memory for it
(:mod:`fiberlite.runtime.shm.remote`). The servant also keeps the block alive while a
handle on it is anywhere (:mod:`fiberlite.runtime.handles`), and frees it after.
"""
from __future__ import annotations

import itertools
import os
import weakref
from threading import get_ident
from typing import Any, Callable

from ..runtime import direct, handles
from ..runtime.hub import LOCAL_PEER, ObjectRef, Servant
from ..runtime.shm import sync
from ..runtime.shm.arena import CREATOR_SLOT, Block, arena
from ..runtime.shm.place import Place, allocate, view
from ..runtime.shm.remote import NOT_YET, Waits, remote_users

NotOwnedError = sync.NotOwnedError
_tickets = itertools.count(1)  # tells apart the blocking calls of one thread (to withdraw one)
_pid = os.getpid()  # (a system call each time otherwise: asked again in a forked child)


def _forked() -> None:
    global _pid
    _pid = os.getpid()


os.register_at_fork(after_in_child=_forked)


class BlockServant(Servant):
    """A primitive's servant in its creator's hub: it owns the block (freed when the
    servant goes), acts for the jobs that cannot map it, and recovers what a job that
    went held (``recover(slot)``, called for every slot whose process goes)."""

    def __init__(self, block: Block) -> None:
        self.block = block
        self.users = remote_users(arena())
        self.waits = self.make_waits()
        self.granted: dict[int, tuple[int, Callable[[], object]]] = {}  # holder -> its last grant
        key = arena().on_recover(self.recover)
        weakref.finalize(self, _release, block, key)

    def make_waits(self) -> Waits:
        """Where the calls of jobs wait (a lock's servant parks them, see :class:`Waits`)."""
        return Waits()

    def token(self, request: Any, pid: int, tid: int) -> int:
        return self.users.token(request.peer, pid, tid)

    def recover(self, slot: int) -> None:
        """The process of ``slot`` has gone: give back what it held."""

    def holder(self, request, pid: int, tid: int) -> int:
        """Who holds what the servant grants: a thread's token (a lock) or a slot."""
        return self.token(request, pid, tid)

    def acquire_for(self, request, block: bool, timeout: float | None, pid: int, tid: int,
                    ticket: int, take: Callable[[bool, float | None], bool],
                    give_back: Callable[[], object]) -> None:
        """Answer a job's acquire: ``take(block, seconds)`` now, else on a thread of its
        own until ``timeout``; what is taken for a call withdrawn meanwhile is given back."""
        holder = self.holder(request, pid, tid)

        def attempt(seconds: float | None) -> Any:
            if take(seconds is not None, seconds):
                self.granted[holder] = (ticket, give_back)
                return True
            return NOT_YET
        # a call that finds others of jobs waiting queues behind them (first come, first served)
        got = NOT_YET if self.waits and block else attempt(None)
        if got is True or not block or (timeout is not None and timeout <= 0):
            request.reply(got is True)
            return
        self.waits.start(request, (request.peer, pid, tid, ticket), attempt, timeout, False,
                         undo=lambda _: give_back(), parks=True)

    def op_cancel(self, request, pid: int, tid: int, ticket: int, undo_grant: bool = False) -> None:
        """The caller gave up a blocking call (it was interrupted): withdraw it, and with
        ``undo_grant`` give back what it was granted and never knew."""
        if not self.waits.cancel((request.peer, pid, tid, ticket)) and undo_grant:
            grant = self.granted.get(self.holder(request, pid, tid))
            if grant is not None and grant[0] == ticket:
                try:
                    grant[1]()
                except (ValueError, AssertionError):  # already given back
                    pass
        request.reply()

    def peer_lost(self, peer: int) -> None:
        self.waits.cancel_peer(peer)


def _release(block: Block, key: int) -> None:
    own = arena()
    own.forget(key)
    sync.teardown(block.buffer, block.offset, block.size)
    own.free(block)


class SharedPrimitive:
    """A handle on a primitive in shared memory; subclasses bind it (:meth:`_bind` here,
    :meth:`_bind_remote` through the hub) and say what else travels (``_getstate``)."""

    _ref: ObjectRef
    _place: Place
    _local = True  # bound to the memory (else: through the creator's hub)

    def _create(self, size: int, servant_class: type, *servant_args: Any) -> Block:
        """Allocate the primitive's memory here; the caller lays it out, then :meth:`_publish`."""
        block, self._place = allocate(size)
        self._pending = (servant_class, servant_args, block)
        return block

    def _publish(self) -> None:
        """Register the servant of the block just laid out and bind this handle to it."""
        servant_class, servant_args, block = self._pending
        del self._pending
        self._ref = handles.register(self, servant_class(block, *servant_args))
        self._bind(block.buffer, block.offset, CREATOR_SLOT)

    def _getstate(self) -> tuple:
        return ()

    def _setstate(self, state: tuple) -> None:
        pass

    def _bind(self, buffer: Any, offset: int, slot: int) -> None:
        raise NotImplementedError

    def _bind_remote(self) -> None:
        self._local = False

    def __reduce__(self):
        handles.exported(self._ref)
        return (_rebuild, (type(self), self._ref, self._place, self._getstate()))


def _rebuild(cls: type, ref: ObjectRef, place: Place, state: tuple) -> Any:
    handle = cls.__new__(cls)
    handle._ref = ref
    handle._place = place
    handle._setstate(state)
    here = view(place)
    if here is None:
        handle._bind_remote()
    else:
        buffer, slot = here
        handle._bind(buffer, place.offset, slot)
    handles.loaded(handle, ref)
    return handle


def blocking_call(ref: ObjectRef, method: str, *args: Any, undo_grant: bool = False,
                  interrupted: str = "cancel") -> Any:
    """A blocking call of a remote primitive, with the caller's ``(pid, tid, ticket)``
    appended. An interrupted caller (KeyboardInterrupt...) withdraws it with the
    servant's ``interrupted`` operation (``cancel``, with ``undo_grant``: what was granted
    and not seen yet is given back), so that nothing is granted to nobody."""
    pid, tid, ticket = _pid, get_ident(), next(_tickets)
    extra = (undo_grant,) if interrupted == "cancel" else ()
    return direct.call(ref, method, *args, pid, tid, ticket, interruptible=True,
                       interrupted=(interrupted, pid, tid, ticket, *extra))


def remote_call(ref: ObjectRef, method: str, *args: Any) -> Any:
    """A call of a remote primitive's servant that answers at once (direct where offered)."""
    return direct.call(ref, method, *args)


def remote_post(ref: ObjectRef, method: str, *args: Any) -> None:
    """A call of a remote primitive's servant whose answer says nothing: one-way where
    direct calls are offered (:func:`fiberlite.runtime.direct.post`: whatever this process
    does next with that hub, or sends anywhere, comes after it)."""
    direct.post(ref, method, *args)


def caller() -> tuple[int, int]:
    """``(pid, tid)`` of the calling thread, as a remote primitive's servant names it."""
    return _pid, get_ident()


def owner_name(mine: bool, owner: int, my_token: int) -> str:
    """Who holds a lock, as ``multiprocessing`` says it: this process (and thread),
    ``None``, ``SomeOtherThread`` (of this process) or ``SomeOtherProcess``."""
    if mine:
        from ..process import current_process
        import threading
        name = current_process().name
        if threading.current_thread().name != "MainThread":
            name += "|" + threading.current_thread().name
        return name
    if not owner:
        return "None"
    if owner >> sync.THREAD_BITS == my_token >> sync.THREAD_BITS:
        return "SomeOtherThread"
    return "SomeOtherProcess"


__all__ = ["BlockServant", "SharedPrimitive", "NotOwnedError", "blocking_call", "remote_call", "remote_post", "caller",
           "owner_name", "LOCAL_PEER"]
