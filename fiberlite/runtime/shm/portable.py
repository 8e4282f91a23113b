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

    Mutex      word 0: the token of the process that took it last (slot << 12; the
               creator acting for a thread of another process writes that thread's
               token, slot << 12 | its index, and clears it as it gives back); word 1:
               the depth of such a thread's hold; a semaphore of one unit is the lock
    Semaphore  see :mod:`.portable_semaphore`
    a word     that is waited on (an event's flag, a condition's sequence): see
               :mod:`.portable_words`

What the C extension does and this cannot: a lock's semaphore does not say who took
it, and taking it and writing the token are two steps. A process's threads take a
lock with the C call of the standard library and one write of the token, and give it
back with the C call alone (which thread holds it, and how many times, the process's
SemLock of the lock knows), as cheap as it gets from Python; so a taken lock whose
word names a dead process may have been given back by it and taken by another that
has not written its token yet, and one that names nobody by one that died before it
did. Either is taken for the dead one's once it stayed so for :data:`UNCLAIMED`
seconds (:func:`_held_by`). A word's bookkeeping left half done by a killed process is
not repaired (docs/multiprocessing.md says what that means).
"""
from __future__ import annotations

import _multiprocessing
import base64
import hashlib
import os
import threading
import time
from _multiprocessing import SemLock
from ctypes import addressof, c_uint32
from typing import Any

from ...units import check_timeout
from .. import exit_order

RECURSIVE_KIND, SEMAPHORE_KIND = 0, 1  # multiprocessing.synchronize.RECURSIVE_MUTEX, SEMAPHORE
VALUE_MAX = SemLock.SEM_VALUE_MAX
THREAD_BITS = 12
THREAD_MASK = (1 << THREAD_BITS) - 1
TOKEN_MASK = 0x7FFFFFFF
MAX_SLOT = TOKEN_MASK >> THREAD_BITS
UNCLAIMED = 1.0  # seconds a lock stays taken naming a dead process (or nobody) before it is its
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


def _open(buffer: Any, offset: int, role: bytes, maxvalue: int, kind: int = SEMAPHORE_KIND) -> SemLock:
    name = _name(buffer, offset, role)
    try:
        return SemLock._rebuild(0, kind, maxvalue, name)
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


def mark_segment(buffer: Any) -> None:
    """A segment is laid out: make its mark, a semaphore named after its header, that a
    process which maps it can look for (:func:`reachable`). Removed with the segment's
    other names, at the creator's exit."""
    _create(buffer, 0, b"S", 0, 1)


def reachable(buffer: Any) -> bool:
    """Whether this process sees the named semaphores of the process that laid out the
    segment it maps: not in a container with a ``/dev/shm`` of its own, which maps the
    memory through the door but cannot open them (then the segment's objects go through
    their creator's hub)."""
    try:
        SemLock._rebuild(0, SEMAPHORE_KIND, 1, _name(buffer, 0, b"S"))
    except (FileNotFoundError, PermissionError):
        return False
    return True


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


# -- the semaphores a process's handles share -------------------------------------------------
# The standard library's SemLock keeps, per object, how many times this process took it
# and which thread took it last (what its RLock and `_is_mine` go by): every handle of
# this process on one lock uses one such object, so that these say what the process did.
_shared: dict[tuple[str, int], list] = {}  # (name, kind) -> [SemLock, handles using it]


def _share(buffer: Any, offset: int, role: bytes, kind: int) -> tuple[str, int]:
    """Count a handle among the users of this process's SemLock of ``kind`` on the
    semaphore ``role`` of the word at ``offset``; its key (for :func:`_shared_semlock`
    and :func:`_unshare`)."""
    key = (_name(buffer, offset, role), kind)
    with _created_lock:
        entry = _shared.get(key)
        if entry is None:
            entry = _shared[key] = [_open(buffer, offset, role, 1, kind), 0]
        entry[1] += 1
    return key


def _shared_semlock(key: tuple[str, int]) -> SemLock:
    return _shared[key][0]


def _unshare(key: tuple[str, int]) -> None:
    """A handle counted by :func:`_share` is gone (the last one closes the SemLock)."""
    with _created_lock:
        entry = _shared.get(key)
        if entry is not None:
            entry[1] -= 1
            if entry[1] <= 0:
                del _shared[key]


def after_fork() -> None:
    """In a forked child: no thread of it holds a lock yet, and the names its parent made
    are the parent's to remove, not this process's at its exit."""
    with _created_lock:
        _created.clear()
        for semlock, _ in _shared.values():
            semlock._after_fork()


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


def _acquirer(semlock: SemLock, words: memoryview, base: int) -> Any:
    """The ``acquire`` of a handle: the SemLock's, then this process's token in word 0."""
    take = semlock.acquire

    def acquire(block: bool = True, timeout: float | None = None) -> bool:
        """Acquire the lock; wait up to ``timeout`` seconds (None: forever). True if acquired."""
        if timeout is not None:
            check_timeout(timeout)
        if take(False) or (block and _contended(semlock, timeout)):
            words[0] = base
            return True
        return False
    return acquire


def _releaser(semlock: SemLock) -> Any:
    """The ``release`` of a handle on an RLock: the SemLock's, with the error of the seam."""
    give = semlock.release

    def release() -> None:
        """Release the lock once (NotOwnedError if the calling thread does not hold it)."""
        try:
            give()
        except AssertionError:
            raise NotOwnedError("attempt to release recursive lock not owned by thread") from None
    return release


class Mutex:
    """Mutex(buffer, offset, slot, recursive=False): a lock in shared memory.

    A thread of this process takes and gives back the lock through this process's
    SemLock of the lock (a recursive one for an RLock), which knows which thread holds
    it and how many times; taking it writes the process's token (``slot <<
    THREAD_BITS``) into word 0, and giving it back leaves the token there. Word 0 names
    the holder while the semaphore is taken, and the last one after (:meth:`owner`).
    The creator acting for other processes (``*_as``, ``release_save(token)``) takes and
    gives back with their tokens, the thread's index in the low bits, and its depth in
    word 1, and clears them as it gives back.
    """

    __slots__ = ("_words", "_semaphore", "_own", "_key", "_base", "_recursive", "_address",
                 "acquire", "release", "leave")

    def __init__(self, buffer: Any, offset: int, slot: int, recursive: bool = False) -> None:
        _check_slot(slot)
        self._words = memoryview(buffer)[offset:offset + MUTEX_BYTES].cast("I")
        self._address = addressof(c_uint32.from_buffer(buffer, offset))
        self._semaphore = _open(buffer, offset, b"m", 1)  # for other processes' tokens
        self._key = _share(buffer, offset, b"m", RECURSIVE_KIND if recursive else SEMAPHORE_KIND)
        self._own = own = _shared_semlock(self._key)  # for this process's threads
        self._base = slot << THREAD_BITS
        self._recursive = recursive
        self.acquire = _acquirer(own, self._words, self._base)
        self.release = _releaser(own) if recursive else own.release  # (a Lock's: the C method)
        self.leave = own.release  # give back a hold the calling thread took (a with block's)

    def __del__(self) -> None:
        try:
            _unshare(self._key)
        except Exception:  # never counted (its __init__ failed), or the interpreter exits
            pass

    def __enter__(self) -> bool:
        return self.acquire()

    def __exit__(self, *exc: Any) -> None:
        self.release()

    # -- for the token of another process's thread -------------------------------------------
    def acquire_as(self, token: int, block: bool = True, timeout: float | None = None) -> bool:
        """Acquire for the holder named by ``token``."""
        token &= TOKEN_MASK
        words = self._words
        if self._recursive and words[0] == token and self.owner():
            words[1] += 1
            return True
        if self._semaphore.acquire(block, timeout):
            words[0] = token
            words[1] = 1
            return True
        return False

    def release_as(self, token: int) -> None:
        token &= TOKEN_MASK
        words = self._words
        if self._recursive:
            if self.owner() != token:
                raise NotOwnedError("attempt to release recursive lock not owned by thread")
            if words[1] > 1:
                words[1] -= 1
                return
        elif not self.owner():
            raise ValueError("semaphore or lock released too many times")
        words[1] = 0
        words[0] = 0
        self._semaphore.release()

    # -- a condition's wait ------------------------------------------------------------------
    def release_save(self, token: int = 0) -> int:
        """Release the calling thread's hold (or that of ``token``) at any depth; the depth."""
        if not token:
            if not self.is_mine():
                raise NotOwnedError("cannot wait on un-acquired lock")
            own = self._own
            depth = own._count() if self._recursive else 1
            for _ in range(depth):
                own.release()
            return depth
        token &= TOKEN_MASK
        words = self._words
        if self.owner() != token:
            raise NotOwnedError("cannot wait on un-acquired lock")
        depth = words[1] if self._recursive else 1
        words[1] = 0
        words[0] = 0
        self._semaphore.release()
        return depth

    def acquire_restore(self, depth: int, token: int = 0) -> None:
        """Hold it again at ``depth``, however long it takes."""
        words = self._words
        if not token:
            own = self._own
            try:
                _acquire_whatever(own)
            finally:
                words[0] = self._base
                for _ in range(depth - 1):
                    own.acquire(False)  # (held by this thread: counted, never waits)
            return
        try:
            _acquire_whatever(self._semaphore)
        finally:
            words[0] = token & TOKEN_MASK
            words[1] = depth

    # -- what it is ---------------------------------------------------------------------------
    def address(self) -> int:
        """The address of word 0 (which memory this is)."""
        return self._address

    def owner(self) -> int:
        """The holder's token (0: free)."""
        owner = self._words[0]
        return owner if owner and self._semaphore._is_zero() else 0

    def depth(self) -> int:
        """How many times the holder holds it."""
        if self._recursive and self._own._is_mine():
            return self._own._count()
        owner = self.owner()
        if self._recursive and owner & THREAD_MASK:  # another process's, held through the creator
            return self._words[1]
        return int(owner != 0)

    def is_mine(self) -> bool:
        """Whether the calling thread holds it."""
        own = self._own
        if self._recursive:
            return own._is_mine()
        # this process's SemLock names the thread that took it last, and counts what this
        # process took and gave back (another process may have given back what it took)
        return own._is_mine() and self._words[0] == self._base and own._is_zero()

    def token(self) -> int:
        """The token of the calling thread's process."""
        return self._base

    def recover(self, slot: int) -> bool:
        """Release the lock if the (dead) process of ``slot`` holds it (:func:`_held_by`)."""
        if _held_by(self._words, slot, self._semaphore):
            self._words[1] = 0
            self._words[0] = 0
            self._semaphore.release()
            return True
        return False


def _held_by(words: memoryview, slot: int, semaphore: SemLock) -> bool:
    """Whether the mutex whose words are ``words`` is held by the dead process of ``slot``.

    Word 0 names the last process that took it, and is written just after the semaphore
    is taken: a taken mutex that names ``slot`` may have been given back by it and taken
    by another process that has not written its token yet, and one that names nobody
    was taken by a process that has not written its token yet (or that died before it
    did). Either is ``slot``'s only once it has stayed so for :data:`UNCLAIMED` seconds.
    """
    deadline = time.monotonic() + UNCLAIMED
    while True:
        owner = words[0]
        if owner and owner >> THREAD_BITS != slot:
            return False
        if not semaphore._is_zero():  # free
            return False
        if time.monotonic() >= deadline:
            return True
        time.sleep(0.001)


def _taken_by(words: memoryview, index: int, slot: int, semaphore: SemLock) -> bool:
    """Whether the one-unit ``semaphore`` (a guard), whose holder's token is
    ``words[index]`` while it is held (cleared before it is given back), is held by the
    dead process of ``slot``; one taken with no token is so once it has stayed so for
    :data:`UNCLAIMED` seconds."""
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
