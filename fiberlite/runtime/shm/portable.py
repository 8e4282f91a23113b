"""Process-shared locks, semaphores and waits without the C extension: POSIX named semaphores.

The same objects and functions as the C extension ``_sync`` (:mod:`.sync` chooses one),
for platforms where it is not built (macOS, no C compiler) or when the
``portable_sync`` setting asks for it. The state a process may need to recover (who
holds a lock, the units each process holds of a semaphore) lives in the shared memory
as with ``_sync``; what sleeps is a named semaphore of the standard library
(``_multiprocessing.SemLock``, what ``multiprocessing`` itself uses on Linux and
macOS), whose waits raise ``KeyboardInterrupt`` on Ctrl-C as the standard library's do.

Each named semaphore belongs to a word of the memory: its name is a digest of the
segment's header (the arena's cookie and the segment's id) and the word's offset, so
that every process mapping the memory opens the same one, and nothing more travels
when a primitive is pickled. The process that lays a primitive out creates its
semaphores (``setup_*``) and removes their names when its memory is freed
(:func:`teardown`) or when it exits; if it is killed, the standard library's resource
tracker removes them.

    Mutex      word 0: the holder's token (slot << 12 | thread index); word 1: its depth;
               a semaphore of one unit is the lock itself
    Semaphore  see :mod:`.portable_semaphore`
    a word     that is waited on (an event's flag, a condition's sequence): see
               :mod:`.portable_words`

What the C extension does and this cannot: a lock's semaphore does not say who took
it, and taking it and writing the token are two steps. A lock left taken with no token
(its holder was killed between the two) is recognised by staying so for
:data:`UNCLAIMED` seconds (:func:`_taken_by`); a word's bookkeeping left half done by a
killed process is not repaired (docs/multiprocessing.md says what that means).
"""
from __future__ import annotations

import _multiprocessing
import base64
import hashlib
import itertools
import os
import threading
import time
from _multiprocessing import SemLock
from ctypes import addressof, c_uint32
from threading import get_ident
from typing import Any

from .. import exit_order

SEMAPHORE_KIND = 1  # multiprocessing.synchronize.SEMAPHORE
VALUE_MAX = SemLock.SEM_VALUE_MAX
THREAD_BITS = 12
TOKEN_MASK = 0x7FFFFFFF
MAX_SLOT = TOKEN_MASK >> THREAD_BITS
UNCLAIMED = 1.0  # seconds a lock stays taken with no holder before a dead process is taken for it
MUTEX_BYTES = 8
HEADER_BYTES = 24  # the segment header the names are made from (arena.HEADER)


class NotOwnedError(AssertionError, RuntimeError):
    """An operation that needs the lock held by the calling thread was called without it."""


NotOwnedError.__module__ = "fiberlite.synchronize"


# -- names and semaphores ------------------------------------------------------------------
_created: dict[tuple[bytes, int], list[str]] = {}  # (segment header, offset) -> names made here
_created_lock = threading.Lock()


def _name(buffer: Any, offset: int, role: bytes) -> str:
    """The name of the semaphore ``role`` of the word at ``offset`` (at most 30 characters,
    as macOS allows 31)."""
    digest = hashlib.blake2b(bytes(buffer[:HEADER_BYTES]) + offset.to_bytes(8, "little") + role,
                             digest_size=10).digest()
    return "/fl" + base64.b32encode(digest).decode().lower()


def _create(buffer: Any, offset: int, role: bytes, value: int, maxvalue: int) -> None:
    name = _name(buffer, offset, role)
    try:
        semaphore = SemLock(SEMAPHORE_KIND, value, maxvalue, name, False)
    except FileExistsError:  # left by an earlier use of this memory that was not told apart
        _multiprocessing.sem_unlink(name)
        semaphore = SemLock(SEMAPHORE_KIND, value, maxvalue, name, False)
    del semaphore  # opened again by whoever uses it
    _track(name)
    with _created_lock:
        _created.setdefault((bytes(buffer[:HEADER_BYTES]), offset), []).append(name)


def _open(buffer: Any, offset: int, role: bytes, maxvalue: int) -> SemLock:
    name = _name(buffer, offset, role)
    try:
        return SemLock._rebuild(0, SEMAPHORE_KIND, maxvalue, name)
    except FileNotFoundError:
        raise RuntimeError(f"the semaphore of the shared word at offset {offset} is gone "
                           "(its creator freed it or exited)") from None


def _track(name: str) -> None:
    """Have the standard library's resource tracker remove ``name`` if this process is killed."""
    try:
        from multiprocessing import resource_tracker
        resource_tracker.register(name, "semaphore")
    except Exception:  # no tracker: the name outlives a killed process
        pass


def _remove(names: list[str]) -> None:
    for name in names:
        try:
            _multiprocessing.sem_unlink(name)
        except OSError:
            pass
        try:
            from multiprocessing import resource_tracker
            resource_tracker.unregister(name, "semaphore")
        except Exception:
            pass


def teardown(buffer: Any, offset: int, size: int) -> None:
    """The block at ``offset`` is freed: remove the names of the semaphores made in it."""
    header = bytes(buffer[:HEADER_BYTES])
    names: list[str] = []
    with _created_lock:
        for at in range(offset, offset + size, 4):
            names += _created.pop((header, at), ())
    _remove(names)


def _remove_all() -> None:
    with _created_lock:
        names = [name for group in _created.values() for name in group]
        _created.clear()
    _remove(names)


exit_order.at_exit("backends", _remove_all)  # as this process leaves (a job too, by os._exit)


# -- threads ----------------------------------------------------------------------------------
_indexes: dict[int, int] = {}
_numbers = itertools.count()  # (next() on it is atomic: no two threads get one number)


def _thread() -> int:
    """This thread's index (1 .. 4095) in the tokens of this process."""
    index = _indexes.get(get_ident())
    if index is None:
        index = _indexes[get_ident()] = next(_numbers) % ((1 << THREAD_BITS) - 1) + 1
    return index


def after_fork() -> None:
    """In a forked child: its threads are numbered anew, and the names its parent made
    are the parent's to remove, not this process's at its exit."""
    _indexes.clear()
    with _created_lock:
        _created.clear()


def _check_slot(slot: int) -> None:
    if not 0 < slot <= MAX_SLOT:
        raise ValueError(f"slot {slot} out of range")


def _enter_guard(guard: SemLock) -> None:
    """Take a guard for a moment's bookkeeping, however long it takes; an exception raised
    by a signal handler meanwhile is raised with the guard given back."""
    try:
        _acquire_whatever(guard)
    except BaseException:
        guard.release()
        raise


SPINS = 200 if (os.cpu_count() or 1) > 1 else 0  # looks at a taken lock before sleeping


def _contended(semaphore: SemLock, timeout: float | None) -> bool:
    """Take a lock that was taken a moment ago: look at it a while awake (its holder,
    on another CPU, is likely to release it within microseconds; sleeping and being
    woken costs more), then wait for it up to ``timeout``."""
    for _ in range(SPINS):
        if semaphore.acquire(False):
            return True
    return semaphore.acquire(True, timeout)


def _acquire_whatever(semaphore: SemLock) -> None:
    """Take ``semaphore`` however long it takes; an exception raised by a signal handler
    meanwhile is raised once it is held."""
    pending: BaseException | None = None
    while True:
        try:
            semaphore.acquire()
            break
        except BaseException as exc:
            pending = pending or exc
    if pending is not None:
        raise pending


# -- Mutex ----------------------------------------------------------------------------------
def setup_mutex(buffer: Any, offset: int) -> None:
    """Lay out a new (free) mutex at ``offset``: its semaphore."""
    _create(buffer, offset, b"m", 1, 1)


class Mutex:
    """Mutex(buffer, offset, slot, recursive=False): a lock in shared memory."""

    __slots__ = ("_words", "_semaphore", "_base", "_recursive", "_address", "acquire", "release")

    def __init__(self, buffer: Any, offset: int, slot: int, recursive: bool = False) -> None:
        _check_slot(slot)
        self._words = memoryview(buffer)[offset:offset + MUTEX_BYTES].cast("I")
        self._address = addressof(c_uint32.from_buffer(buffer, offset))
        self._semaphore = _open(buffer, offset, b"m", 1)
        self._base = slot << THREAD_BITS
        self._recursive = recursive
        self.acquire = self._acquire_recursive if recursive else self._acquire_lock
        self.release = self._release_recursive if recursive else self._release_lock

    # the four methods a handle binds: the calling thread's token looked up in place (a
    # call less), and a plain Lock's depth left alone (it is 1 while held)
    def _acquire_lock(self, block: bool = True, timeout: float | None = None) -> bool:
        semaphore = self._semaphore
        if semaphore.acquire(False) or (block and _contended(semaphore, timeout)):
            self._words[0] = self._base | (_indexes.get(get_ident()) or _thread())
            return True
        return False

    def _release_lock(self) -> None:
        words = self._words
        if not words[0]:
            raise ValueError("semaphore or lock released too many times")
        words[0] = 0
        self._semaphore.release()

    def _acquire_recursive(self, block: bool = True, timeout: float | None = None) -> bool:
        token = self._base | (_indexes.get(get_ident()) or _thread())
        words = self._words
        if words[0] == token:
            words[1] += 1
            return True
        semaphore = self._semaphore
        if semaphore.acquire(False) or (block and _contended(semaphore, timeout)):
            words[0] = token
            words[1] = 1
            return True
        return False

    def _release_recursive(self) -> None:
        words = self._words
        if words[0] != self._base | (_indexes.get(get_ident()) or _thread()):
            raise NotOwnedError("attempt to release recursive lock not owned by thread")
        if words[1] > 1:
            words[1] -= 1
            return
        words[1] = 0
        words[0] = 0
        self._semaphore.release()

    def _acquire_token(self, token: int, block: bool = True, timeout: float | None = None) -> bool:
        words = self._words
        if self._recursive and words[0] == token:
            words[1] += 1
            return True
        if self._semaphore.acquire(block, timeout):
            words[0] = token
            words[1] = 1
            return True
        return False

    def _release_token(self, token: int) -> None:
        words = self._words
        if self._recursive:
            if words[0] != token:
                raise NotOwnedError("attempt to release recursive lock not owned by thread")
            if words[1] > 1:
                words[1] -= 1
                return
        elif not words[0]:
            raise ValueError("semaphore or lock released too many times")
        words[1] = 0
        words[0] = 0
        self._semaphore.release()

    def __enter__(self) -> bool:
        return self.acquire()

    def __exit__(self, *exc: Any) -> None:
        self.release()

    def acquire_as(self, token: int, block: bool = True, timeout: float | None = None) -> bool:
        """Acquire for the holder named by ``token``."""
        return self._acquire_token(token & TOKEN_MASK, block, timeout)

    def release_as(self, token: int) -> None:
        self._release_token(token & TOKEN_MASK)

    def release_save(self, token: int = 0) -> int:
        """Release that hold at any depth (a condition's wait); the depth."""
        token = token & TOKEN_MASK if token else self.token()
        words = self._words
        if words[0] != token:
            raise NotOwnedError("cannot wait on un-acquired lock")
        depth = words[1] if self._recursive else 1
        words[1] = 0
        words[0] = 0
        self._semaphore.release()
        return depth

    def acquire_restore(self, depth: int, token: int = 0) -> None:
        """Hold it again at ``depth``, however long it takes."""
        token = token & TOKEN_MASK if token else self.token()
        try:
            _acquire_whatever(self._semaphore)
        finally:
            self._words[0] = token
            self._words[1] = depth

    def address(self) -> int:
        """The address of word 0 (which memory this is)."""
        return self._address

    def owner(self) -> int:
        """The holder's token (0: free)."""
        return self._words[0]

    def depth(self) -> int:
        """How many times the holder holds it."""
        return self._words[1] if self._recursive else int(self._words[0] != 0)

    def is_mine(self) -> bool:
        return self._words[0] == self._base | _thread()

    def token(self) -> int:
        """The calling thread's token."""
        return self._base | _thread()

    def recover(self, slot: int) -> bool:
        """Release the lock if a thread of the (dead) process of ``slot`` holds it: its token
        says so, or the lock stays taken with no token for :data:`UNCLAIMED` seconds (its
        holder died between taking the semaphore and writing its token, or the other way
        round as it released it)."""
        if _taken_by(self._words, 0, slot, self._semaphore):
            self._words[1] = 0
            self._words[0] = 0
            self._semaphore.release()
            return True
        return False


def _taken_by(words: memoryview, index: int, slot: int, semaphore: SemLock) -> bool:
    """Whether the one-unit ``semaphore``, whose holder's token is ``words[index]``, is held
    by the dead process of ``slot`` (see :meth:`Mutex.recover`)."""
    deadline = time.monotonic() + UNCLAIMED
    while True:
        owner = words[index]
        if owner:
            return owner >> THREAD_BITS == slot
        if semaphore.acquire(False):  # free
            semaphore.release()
            return False
        if time.monotonic() >= deadline:
            return True
        time.sleep(0.001)
