"""A small shared object carried by its lock to a job of another machine.

``with v.get_lock(): v.value += 1`` in a job that cannot map ``v`` would be four calls
to ``v``'s creator (acquire, read, write, release). When ``v``'s ``RLock`` lives with
it (``Value(..., lock=True)``), the creator's answer to the acquire carries a copy of
``v``'s bytes (:func:`snapshot`), the job reads and writes that copy while its thread
holds the lock (:class:`Carried`), and the release carries what it wrote back
(:func:`write_back`): two calls. Nothing else changes ``v`` meanwhile: every access
of a ``Value`` takes its lock, and a ``RawProxy`` access of the same thread writes
the copy back first (:meth:`Carried.settle`).

What a holder wrote reaches the memory when it releases: a holder killed while it
holds the lock loses its writes (the lock itself is given back, as always).
"""
from __future__ import annotations

import ctypes
import threading
from typing import Any, Callable

CARRY_MAX = 512  # bytes: larger objects are read and written by a call each
_carrying = threading.local()  # .held: (address, oid) -> this thread's Carried


class Carried:
    """A thread's copy of an object while it holds the object's lock."""

    __slots__ = ("obj", "dirty", "settle")

    def __init__(self, ctype: type, data: bytes, settle: Callable[[], None]) -> None:
        self.obj = ctype.from_buffer_copy(data)
        self.dirty = False
        self.settle = settle  # write the copy back now and stop using it

    def written(self) -> bytes | None:
        """The copy's bytes if it was written to (None: nothing to write back)."""
        if not self.dirty:
            return None
        return ctypes.string_at(ctypes.addressof(self.obj), ctypes.sizeof(self.obj))


def _held() -> dict:
    held = getattr(_carrying, "held", None)
    if held is None:
        held = _carrying.held = {}
    return held


def live(key: tuple[str, int]) -> Carried | None:
    """This thread's copy of the object ``key`` (its creator's address, its id), if any."""
    held = getattr(_carrying, "held", None)
    return held.get(key) if held else None


def begin(key: tuple[str, int], ctype: type, data: bytes, settle: Callable[[], None]) -> None:
    _held()[key] = Carried(ctype, data, settle)


def end(key: tuple[str, int]) -> Carried | None:
    """Stop using this thread's copy of ``key``; the copy (None: there was none)."""
    held = getattr(_carrying, "held", None)
    return held.pop(key, None) if held else None


def access(carried: Carried, op: Callable[..., Any], writes: bool, *args: Any) -> Any:
    """``op(copy, *args)`` on the copy; a write marks it to be written back."""
    result = op(carried.obj, *args)
    if writes:
        carried.dirty = True
    return result


# -- in the creator ------------------------------------------------------------------------
def snapshot(raw: Any) -> bytes:
    """The bytes of ``raw``'s object (a :class:`~fiberlite.sharedctypes.raw.RawServant`)."""
    return ctypes.string_at(ctypes.addressof(raw.obj), ctypes.sizeof(raw.obj))


def write_back(raw: Any, data: bytes) -> None:
    if len(data) != ctypes.sizeof(raw.obj):
        raise ValueError(f"{len(data)} bytes written back to an object of {ctypes.sizeof(raw.obj)}")
    ctypes.memmove(ctypes.addressof(raw.obj), data, len(data))


class SnapshotReply:
    """A job's acquire whose answer, when it is granted, carries ``snapshot(raw)``:
    ``(granted, bytes or None)`` (None: the caller held the lock already)."""

    __slots__ = ("_request", "peer", "_raw", "_depth")

    def __init__(self, request: Any, raw: Any, depth: Callable[[], int]) -> None:
        self._request = request
        self.peer = request.peer
        self._raw = raw
        self._depth = depth

    def reply(self, value: Any = None) -> None:
        data = snapshot(self._raw) if value is True and self._depth() == 1 else None
        self._request.reply((value, data))

    def fail(self, exc: BaseException) -> None:
        self._request.fail(exc)
