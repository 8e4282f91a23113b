"""A process's view of the shared memory of other processes of its machine.

:func:`attach` connects to a creator's door (:mod:`.door`), proves the run's key, and
keeps the connection for the life of this process: its end tells the creator that this
process has gone. Segments are asked for by id and mapped here; a segment's header must
hold the creator's cookie and the id asked for, or the memory is not used: "same
machine" is decided by the memory itself being shared, not by names. A creator that
cannot be attached (another machine or network namespace, a door that refuses) is
remembered as such: its objects are used through its hub, as from another machine.
"""
from __future__ import annotations

import logging
import mmap
import os
import socket
import threading
import time
import weakref

from ...errors import AuthenticationError
from ...wire import auth, unix
from .. import identity
from . import sync
from .arena import HEADER, MAGIC
from .door import ANSWER, ENTRY, ID, MAX_IDS, REQUEST, SCHEME

log = logging.getLogger(__name__)

CONNECT_TIMEOUT = 10.0


class Attachment:
    """This process's connection to one creator's door, and the segments mapped through it."""

    def __init__(self, address: str, cookie: bytes) -> None:
        self.address = address
        self.cookie = cookie
        self._lock = threading.Lock()
        self._maps: weakref.WeakValueDictionary[int, mmap.mmap] = weakref.WeakValueDictionary()
        self._sock = self._connect(address)
        self.slot, _ = self._ask([])

    @staticmethod
    def _connect(address: str) -> socket.socket:
        deadline = time.monotonic() + CONNECT_TIMEOUT
        sock = unix.connect_abstract(address[len(SCHEME):], CONNECT_TIMEOUT)
        try:
            auth.prove_on(sock, identity.key(), address, deadline)
        except BaseException:
            sock.close()
            raise
        sock.settimeout(CONNECT_TIMEOUT)
        return sock

    def _ask(self, ids: list[int]) -> tuple[int, dict[int, tuple[int, int]]]:
        """Ask for ``ids``: this process's slot, and ``{id: (size, fd)}`` of those that exist."""
        request = REQUEST.pack(b"S", len(ids)) + b"".join(ID.pack(i) for i in ids)
        self._sock.sendall(request)
        data, fds = unix.recv_fds(self._sock, ANSWER.size + MAX_IDS * ENTRY.size, MAX_IDS)
        if len(data) < ANSWER.size:
            for fd in fds:
                os.close(fd)
            raise ConnectionError(f"the door at {self.address} closed")
        slot, count = ANSWER.unpack_from(data)
        entries = [ENTRY.unpack_from(data, ANSWER.size + i * ENTRY.size) for i in range(count)]
        if len(fds) != count or len(entries) != count:
            for fd in fds:
                os.close(fd)
            raise ConnectionError(f"the door at {self.address} answered {count} segments, "
                                  f"{len(fds)} descriptors")
        return slot, {seg_id: (size, fd) for (seg_id, size), fd in zip(entries, fds)}

    def descriptors(self, ids: list[int]) -> list[int] | None:
        """New descriptors of this process for the shared descriptors ``ids`` (the
        caller closes them); None when one of them is not there any more."""
        with self._lock:
            _, found = self._ask(ids)
        fds = [found[i][1] for i in ids if i in found]
        if len(fds) != len(ids):
            for fd in fds:
                os.close(fd)
            return None
        return fds

    def segment(self, seg_id: int) -> mmap.mmap | None:
        """The mapping of segment ``seg_id`` (None: it does not exist, or is not the memory
        its header says). Kept while anything here uses it."""
        area = self._maps.get(seg_id)
        if area is not None:
            return area
        with self._lock:
            area = self._maps.get(seg_id)
            if area is not None:
                return area
            _, found = self._ask([seg_id])
            if seg_id not in found:
                return None
            size, fd = found[seg_id]
            try:
                area = mmap.mmap(fd, size)
            finally:
                os.close(fd)
            magic, cookie, header_id = HEADER.unpack_from(area, 0)
            if magic[:5] == MAGIC[:5] and magic != MAGIC and cookie == self.cookie:
                log.info("segment %d from %s was laid out by the other implementation of locks "
                         "(runtime/shm/sync.py): its objects go through its hub", seg_id, self.address)
                return None
            if magic != MAGIC or cookie != self.cookie or header_id != seg_id:
                log.warning("segment %d from %s is not the memory it was said to be", seg_id, self.address)
                return None
            if not sync.reachable(area):
                log.info("segment %d from %s: this process cannot open the named semaphores of its "
                         "locks (a /dev/shm of its own): its objects go through its hub",
                         seg_id, self.address)
                return None
            self._maps[seg_id] = area
            return area


_attachments: dict[str, Attachment | None] = {}
_lock = threading.Lock()


def attach(address: str, cookie: bytes) -> Attachment | None:
    """This process's attachment to the door at ``address`` (None: it cannot be reached
    or refused; remembered)."""
    if address in _attachments:
        return _attachments[address]
    with _lock:
        if address not in _attachments:
            try:
                _attachments[address] = Attachment(address, cookie)
            except (OSError, AuthenticationError) as exc:
                log.info("cannot attach to %s (%s): its objects go through its hub", address, exc)
                _attachments[address] = None
        return _attachments[address]


def _forked() -> None:
    """A forked child is a process of its own: it attaches again, with a slot of its own,
    and its copies of the parent's connections are closed (their end is the parent's)."""
    for attachment in _attachments.values():
        if attachment is not None:
            attachment._sock.close()
    _attachments.clear()


os.register_at_fork(after_in_child=_forked)
