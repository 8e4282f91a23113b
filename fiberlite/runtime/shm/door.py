"""The door: how the processes of this machine reach this process's shared memory.

A Unix socket in Linux's abstract namespace (any process of this network namespace can
connect; no file to remove). A visitor proves the run's key first, through the same
door as every listening socket of fiberlite (:class:`~fiberlite.wire.doorman.Doorman`:
a deadline, a bound, nothing read but the handshake). Then it is given a slot (who it
is in the memory's locks) and asks for segments by id; each answer carries their
descriptors (``SCM_RIGHTS``). Its connection stays open for its life: when it ends,
the visitor's process has gone (or stopped using the memory), and what it held is
recovered (:meth:`~.arena.Arena.recover`).

    visitor -> door   b"S" + u32 n + n x u64 segment id
    door -> visitor   u32 slot + u32 m + m x (u64 id, u64 size), the m descriptors alongside

One thread serves every visitor (the requests are small and answered at once); a
recovery runs on a thread of its own, since it may wait a moment for a lock.
"""
from __future__ import annotations

import logging
import os
import selectors
import socket
import struct
import threading

from ...wire import unix
from ...wire.doorman import Doorman
from ...wire.waking import WakingSelector
from .. import exit_order, identity
from .arena import Arena

log = logging.getLogger(__name__)

SCHEME = "door://"
REQUEST = struct.Struct("<cI")
ANSWER = struct.Struct("<II")
ENTRY = struct.Struct("<QQ")
ID = struct.Struct("<Q")
MAX_IDS = 200  # segments per request (a message carries at most 253 descriptors)
_SEGMENTS = b"S"


class Door:
    """This process's door, serving ``arena``."""

    def __init__(self, arena: Arena) -> None:
        self.arena = arena
        listening, name = unix.listen_abstract("door", 512, blocking=False)
        self.address = SCHEME + name
        self._selector = WakingSelector()
        self._arrived: list[socket.socket] = []
        self._lock = threading.Lock()
        self._closed = False
        self._doorman = Doorman(listening, identity.key(), None, None, "the shared memory door",
                                hand_over=self._admit)
        self._doorman.serve()
        self._thread = threading.Thread(target=self._serve, name="fiberlite-shm-door", daemon=True)
        self._thread.start()

    def _admit(self, sock: socket.socket) -> None:
        """(the doorman's thread) A visitor proved the key: serve it here."""
        with self._lock:
            if self._closed:
                sock.close()
                return
            self._arrived.append(sock)
        self._selector.wake()

    def _serve(self) -> None:
        visitors: dict[socket.socket, _Visitor] = {}
        try:
            while not self._closed:
                ready, woken = self._selector.select()
                if woken:
                    self._take_arrivals(visitors)
                for key, _ in ready:
                    if not key.data.read(self.arena):
                        self._gone(visitors.pop(key.fileobj))
        except Exception:
            log.exception("the shared memory door failed; no more processes attach")
        finally:
            for visitor in visitors.values():
                visitor.sock.close()
            self._selector.close()

    def _take_arrivals(self, visitors: dict) -> None:
        with self._lock:
            arrived, self._arrived = self._arrived, []
        for sock in arrived:
            try:
                visitor = _Visitor(sock, self.arena.slots.take())
            except RuntimeError as exc:
                log.warning("%s", exc)
                sock.close()
                continue
            visitors[sock] = visitor
            self._selector.register(sock, selectors.EVENT_READ, visitor)

    def _gone(self, visitor: "_Visitor") -> None:
        self._selector.unregister(visitor.sock)
        visitor.sock.close()
        try:
            threading.Thread(target=self.arena.recover, args=(visitor.slot,), daemon=True,
                             name="fiberlite-shm-recover").start()
        except RuntimeError:  # the interpreter is finalizing: nothing is left to give back to
            pass

    def abandon(self) -> None:
        """(a forked child) Close this process's copies of the door's descriptors; the
        threads that served them are the parent's."""
        self._closed = True
        self._selector.close()
        self._doorman.abandon()

    def close(self) -> None:
        with self._lock:
            if self._closed:
                return
            self._closed = True
        self._doorman.close()
        self._selector.wake()


class _Visitor:
    """A process that maps the arena: its connection, its slot, what it has half sent."""

    def __init__(self, sock: socket.socket, slot: int) -> None:
        self.sock = sock
        self.slot = slot
        self.data = b""
        sock.setblocking(False)

    def read(self, arena: Arena) -> bool:
        """Read and answer what came; False once the visitor has gone (or misbehaved)."""
        try:
            chunk = self.sock.recv(65536)
        except (BlockingIOError, InterruptedError):
            return True
        except OSError:
            return False
        if not chunk:
            return False
        self.data += chunk
        while len(self.data) >= REQUEST.size:
            kind, count = REQUEST.unpack_from(self.data)
            if kind != _SEGMENTS or count > MAX_IDS:
                return False
            end = REQUEST.size + count * ID.size
            if len(self.data) < end:
                return True
            ids = [ID.unpack_from(self.data, REQUEST.size + i * ID.size)[0] for i in range(count)]
            self.data = self.data[end:]
            if not self._answer(arena.descriptors(ids)):
                return False
        return True

    def _answer(self, found: list[tuple[int, int, int]]) -> bool:
        message = ANSWER.pack(self.slot, len(found)) + b"".join(ENTRY.pack(i, size) for i, size, _ in found)
        self.sock.setblocking(True)
        try:
            unix.send_fds(self.sock, message, [fd for _, _, fd in found])
            return True
        except OSError:
            return False
        finally:
            self.sock.setblocking(False)


_door: Door | None = None
_door_lock = threading.Lock()


def door(arena: Arena) -> Door:
    """This process's door for ``arena`` (opened on first use)."""
    global _door
    if _door is None or _door.arena is not arena:
        with _door_lock:
            if _door is None or _door.arena is not arena:
                _door = Door(arena)
    return _door


def _close() -> None:
    global _door
    with _door_lock:
        current, _door = _door, None
    if current is not None:
        current.close()


exit_order.at_exit("sockets", _close)


def _forked() -> None:
    """In a forked child the parent's door is not this process's: its copies of the
    door's sockets are closed (the parent keeps its own), and a door of its own opens
    when it shares memory."""
    global _door
    current, _door = _door, None
    if current is not None:
        current.abandon()


os.register_at_fork(after_in_child=_forked)
