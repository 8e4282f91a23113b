"""This process's shared memory: segments other processes of the machine map, and blocks in them.

A process that creates a ``Value``, an ``Array`` or a lock allocates its memory here.
Each *segment* is a ``memfd`` (anonymous: nothing to clean up if the process is killed;
the memory goes with the last process that maps it), handed to the processes of this
machine through the door (:mod:`.door`) and mapped there too. Where there is no memfd
and no abstract Unix socket to hand it over (not Linux), a segment is memory of this
process alone, and other processes use its objects through its hub. A segment starts with a
header, the arena's random cookie and the segment's id, by which a process that maps it
checks that it really is the memory it was told about (:mod:`.attach`).

Small blocks come from 1 MiB segments, by size class; a block of a quarter of a segment
or more gets a segment of its own, closed once the block is freed. Every segment is
given its memory as it is made (:mod:`.room`: one too large for the memory left is a
``MemoryError`` then, not a SIGBUS at a later write).
Blocks are aligned to 64 bytes (a cache line), so that two primitives never share one.

Processes that use the memory are told apart by *slot* (:class:`Slots`): the memory's
locks and semaphores name their holders by slot, and when a process that held a slot
goes, :meth:`Arena.recover` releases what it held.
"""
from __future__ import annotations

import logging
import mmap
import os
import secrets
import struct
import sys
import threading
from typing import Callable

from . import room, sync

log = logging.getLogger(__name__)

HEADER = struct.Struct("<8s8sQ")  # magic, the arena's cookie, the segment's id
MAGIC = b"FLSHM" + sync.KIND + b"v1"  # sync.KIND: which implementation lays out locks
HEADER_SIZE = 64
ALIGN = 64
SEGMENT_SIZE = 1 << 20
LARGE = SEGMENT_SIZE // 4
CREATOR_SLOT = 1
# segments other processes can map: memfds, handed over a Unix socket (Linux only)
SHAREABLE = hasattr(os, "memfd_create") and sys.platform.startswith("linux")


def _round_up(n: int, to: int) -> int:
    return (n + to - 1) // to * to


def _size_class(size: int) -> int:
    """The block size a request of ``size`` bytes gets: a power of two, at least 64."""
    return max(ALIGN, 1 << (size - 1).bit_length())


class Segment:
    """One memfd and this process's mapping of it."""

    def __init__(self, seg_id: int, size: int, cookie: bytes, large: bool = False) -> None:
        self.id = seg_id
        self.size = size
        if large:  # (too large: a MemoryError now, not SIGBUS at a write)
            room.check_room(size)
        if not SHAREABLE:  # this process's own memory: its door stays shut (door.py)
            self.fd = -1
            self.map = mmap.mmap(-1, size)
        else:
            self.fd = os.memfd_create(f"fiberlite-{os.getpid()}-{seg_id}", os.MFD_CLOEXEC)
            try:
                os.ftruncate(self.fd, size)
                room.commit(self.fd, size)  # (a small segment's megabyte too: no SIGBUS later)
                self.map = mmap.mmap(self.fd, size)
            except BaseException:
                os.close(self.fd)
                raise
        HEADER.pack_into(self.map, 0, MAGIC, cookie, seg_id)
        if SHAREABLE:
            sync.mark_segment(self.map)
        self.used = HEADER_SIZE  # bump pointer (small-block segments)

    def close(self) -> None:
        """Forget it here: the memory stays as long as another mapping or handle does."""
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1


class Block:
    """``size`` bytes at ``offset`` of segment ``segment`` (its mapping here: ``buffer``)."""

    __slots__ = ("segment", "offset", "size", "buffer", "__weakref__")

    def __init__(self, segment: int, offset: int, size: int, buffer: mmap.mmap) -> None:
        self.segment = segment
        self.offset = offset
        self.size = size
        self.buffer = buffer

    def __repr__(self) -> str:
        return f"<Block {self.size} B at {self.segment}:{self.offset}>"


class Slots:
    """Slot numbers of the processes that use the arena: 1 is the creator; a slot is
    given again only once what its last holder held has been recovered."""

    def __init__(self, limit: int) -> None:
        self._limit = limit
        self._free: list[int] = []
        self._next = CREATOR_SLOT + 1
        self._lock = threading.Lock()

    def take(self) -> int:
        with self._lock:
            if self._free:
                return self._free.pop()
            if self._next > self._limit:
                raise RuntimeError(f"more than {self._limit} processes use this process's shared memory")
            slot, self._next = self._next, self._next + 1
            return slot

    def give_back(self, slot: int) -> None:
        with self._lock:
            self._free.append(slot)


class Arena:
    """The shared memory this process created, and what lives in it."""

    def __init__(self) -> None:
        self.cookie = secrets.token_bytes(8)
        self.slots = Slots(sync.MAX_SLOT)
        self._segments: dict[int, Segment] = {}
        self._small: list[Segment] = []   # segments blocks of the size classes are cut from
        self._free: dict[int, list[tuple[int, int]]] = {}  # size class -> [(segment, offset)]
        self._next_id = 1
        self._shared: dict[int, int] = {}  # id -> a descriptor handed out as it is (share)
        self._handed: set[int] = set()  # the segments handed to another process of this machine
        self._lock = threading.Lock()
        # what to call when a slot's process goes: id -> recover(slot)
        self._recoverers: dict[int, Callable[[int], object]] = {}
        self._next_recoverer = 1

    # -- memory ----------------------------------------------------------------------------
    def allocate(self, size: int) -> Block:
        """A zeroed block of at least ``size`` bytes."""
        size = max(1, size)
        with self._lock:
            if size >= LARGE:
                segment = self._new_segment(_round_up(HEADER_SIZE + size, mmap.PAGESIZE), True)
                return Block(segment.id, HEADER_SIZE, size, segment.map)
            klass = _size_class(size)
            free = self._free.get(klass)
            if free:
                seg_id, offset = free.pop()
                segment = self._segments[seg_id]
                segment.map[offset:offset + klass] = bytes(klass)
                return Block(seg_id, offset, klass, segment.map)
            segment = self._small[-1] if self._small else None
            if segment is None or segment.used + klass > segment.size:
                segment = self._new_segment(SEGMENT_SIZE)
                self._small.append(segment)
            offset, segment.used = segment.used, segment.used + klass
            return Block(segment.id, offset, klass, segment.map)

    def free(self, block: Block) -> None:
        """Give ``block`` back (its segment is closed here if it was the block's own)."""
        with self._lock:
            segment = self._segments.get(block.segment)
            if segment is None:
                return
            if segment not in self._small:
                del self._segments[block.segment]
                segment.close()
            else:
                self._free.setdefault(block.size, []).append((block.segment, block.offset))

    def _new_segment(self, size: int, large: bool = False) -> Segment:
        segment = Segment(self._next_id, size, self.cookie, large)
        self._next_id += 1
        self._segments[segment.id] = segment
        return segment

    def segment_map(self, seg_id: int) -> mmap.mmap | None:
        """This process's mapping of segment ``seg_id`` (None: freed)."""
        segment = self._segments.get(seg_id)
        return None if segment is None else segment.map

    def descriptors(self, ids: list[int]) -> list[tuple[int, int, int]]:
        """``(id, size, fd)`` of the segments and shared descriptors among ``ids`` that
        exist (fds still ours; a shared descriptor's size is 0)."""
        with self._lock:
            found = [(i, self._segments.get(i), self._shared.get(i)) for i in ids]
            self._handed.update(i for i, s, _ in found if s is not None)
            return [(s.id, s.size, s.fd) if s is not None else (i, 0, fd)
                    for i, s, fd in found if (s is not None and s.fd >= 0) or fd is not None]

    def handed_out(self, seg_id: int) -> bool:
        """Whether segment ``seg_id`` was handed to another process (which may then
        change its words without this process's hub knowing)."""
        return seg_id in self._handed

    # -- other descriptors the door hands out ------------------------------------------------
    def share(self, fd: int) -> int:
        """Hand ``fd`` (a socket, ...) to the processes of this machine that ask by the
        id returned; the arena keeps a duplicate of it until :meth:`unshare`."""
        own = os.dup(fd)
        with self._lock:
            key, self._next_id = self._next_id, self._next_id + 1
            self._shared[key] = own
        return key

    def unshare(self, key: int) -> None:
        with self._lock:
            fd = self._shared.pop(key, None)
        if fd is not None:
            os.close(fd)

    # -- processes that go -----------------------------------------------------------------
    def on_recover(self, recover: Callable[[int], object]) -> int:
        """Call ``recover(slot)`` whenever a slot's process goes; an id for :meth:`forget`."""
        with self._lock:
            key, self._next_recoverer = self._next_recoverer, self._next_recoverer + 1
            self._recoverers[key] = recover
            return key

    def forget(self, key: int) -> None:
        with self._lock:
            self._recoverers.pop(key, None)

    def recover(self, slot: int) -> None:
        """The process of ``slot`` is gone: release what it held, then free the slot."""
        with self._lock:
            recoverers = list(self._recoverers.values())
        for recover in recoverers:
            try:
                recover(slot)
            except Exception:
                log.exception("recovering slot %d failed in %r", slot, recover)
        self.slots.give_back(slot)


_arena: Arena | None = None
_arena_lock = threading.Lock()


def current() -> Arena | None:
    """This process's arena, if it made one."""
    return _arena


def arena() -> Arena:
    """This process's arena (made on first use)."""
    global _arena
    if _arena is None:
        with _arena_lock:
            if _arena is None:
                _arena = Arena()
    return _arena


def _forked() -> None:
    """In a forked child the parent's arena is not this process's to serve."""
    global _arena
    _arena = None
    sync.after_fork()


os.register_at_fork(after_in_child=_forked)
