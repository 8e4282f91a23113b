"""``Synchronized``, ``SynchronizedArray`` and ``SynchronizedString``: a shared object and its lock.

As in ``multiprocessing``: each access takes the lock (``acquire``/``release`` are the
lock's own methods), ``get_obj()`` is the raw object and ``get_lock()`` the lock. In a
process that maps the object, an access is the lock's C calls around a ctypes access to
shared memory. In one that cannot, when the lock lives with the object in its creator
(always for ``Value(..., lock=True)``), an access is one request: the creator takes
the lock for the caller, reads or writes, and gives the lock back; with another lock,
the lock is taken around the request.
"""
from __future__ import annotations

import ctypes
from typing import Any

from ..synchronize import carry
from ..synchronize.locks import RLock, _LockBase
from ..synchronize.shared import caller, remote_call
from .raw import OPS, AccessedArray, RawProxy, accessed

__all__ = ["SynchronizedBase", "Synchronized", "SynchronizedArray", "SynchronizedString", "synchronized"]


class SynchronizedBase:
    """A raw object (``get_obj()``) and the lock (``get_lock()``) every access takes."""

    def __init__(self, obj: Any, lock: Any, guarded: bool = False) -> None:
        self._obj = obj
        self._lock = lock
        self.acquire = lock.acquire
        self.release = lock.release
        self._leave = getattr(lock, "_leave", lock.release)  # gives back what an access took
        # the object is reached through its creator, which holds this lock for the caller
        self._in_one = guarded and isinstance(obj, RawProxy) and isinstance(lock, _LockBase)
        self._guarded = guarded
        if self._in_one:
            self._key = (obj._ref.address, obj._ref.oid)
            if ctypes.sizeof(obj._ctype) <= carry.CARRY_MAX:
                lock._carry_with(obj._ref.oid, obj._ctype)

    def __enter__(self) -> Any:
        return self._lock.__enter__()

    def __exit__(self, *args: Any) -> Any:
        return self._lock.__exit__(*args)

    def __reduce__(self):
        return (_rebuild, (self._obj, self._lock, self._guarded))

    def get_obj(self) -> Any:
        return self._obj

    def get_lock(self) -> Any:
        return self._lock

    def _access(self, op: str, *args: Any) -> Any:
        """``op`` (get, set, getitem, setitem) on the object, under the lock."""
        if self._in_one:
            carried = carry.live(self._key)
            if carried is not None:  # this thread holds the lock, which brought a copy
                return carry.access(carried, OPS[op], op.startswith("set"), *args)
            return remote_call(self._obj._ref, "access", op, args, *caller(), 0)
        self.acquire()
        try:
            return OPS[op](self._obj, *args)
        finally:
            self._leave()

    def __repr__(self) -> str:
        return f"<{type(self).__name__} wrapper for {self._obj!r}>"


class Synchronized(SynchronizedBase):
    """A shared value (or structure, whose fields are attributes) and its lock."""

    @property
    def value(self) -> Any:
        if self._in_one:
            return self._access("get", "value")
        self.acquire()
        try:
            return self._obj.value
        finally:
            self._leave()

    @value.setter
    def value(self, value: Any) -> None:
        if self._in_one:
            return self._access("set", "value", value)
        self.acquire()
        try:
            self._obj.value = value
        finally:
            self._leave()



class SynchronizedArray(AccessedArray, SynchronizedBase):
    """A shared array and its lock."""

    def __len__(self) -> int:
        return len(self._obj)


class SynchronizedString(SynchronizedArray):
    """A shared array of ``c_char`` and its lock, with ``value`` and ``raw``."""

    value = accessed("value")
    raw = accessed("raw")


def _fields(obj: Any) -> tuple:
    ctype = obj._ctype if isinstance(obj, RawProxy) else type(obj)
    return tuple(f[0] for f in getattr(ctype, "_fields_", ()))


_structures: dict[type, type] = {}


def _class_for(obj: Any) -> type:
    ctype = obj._ctype if isinstance(obj, RawProxy) else type(obj)
    if issubclass(ctype, ctypes.Array):
        return SynchronizedString if ctype._type_ is ctypes.c_char else SynchronizedArray
    names = _fields(obj)
    if not names:
        return Synchronized
    cls = _structures.get(ctype)
    if cls is None:  # a Structure: its fields are properties that take the lock (as the stdlib's)
        cls = _structures[ctype] = type(f"Synchronized{ctype.__name__}", (Synchronized,),
                                        {name: accessed(name) for name in names})
    return cls


def synchronized(obj: Any, lock: Any = None, ctx: Any = None, guarded: bool = False) -> SynchronizedBase:
    """``obj`` (a raw shared object) wrapped with ``lock`` (a new RLock when None)."""
    if lock is None:
        lock = RLock(ctx=ctx)
    if not hasattr(lock, "acquire"):
        raise AttributeError(f"{lock!r} has no method 'acquire'")
    return _class_for(obj)(obj, lock, guarded)


def _rebuild(obj: Any, lock: Any, guarded: bool) -> SynchronizedBase:
    return _class_for(obj)(obj, lock, guarded)
