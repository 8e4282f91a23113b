"""``Value``, ``Array``, ``RawValue`` and ``RawArray`` shared by every job of a run.

The ctypes object lives in a servant of the creating process's hub; the handles
pickle to any job. Each access (``.value``, an index or a slice) is one round trip to
the creator (a direct call in the creator itself), not a read of shared memory: read
a whole array with ``arr[:]`` rather than item by item.

Semantics kept from ``multiprocessing.sharedctypes``: typecodes of ``array`` or ctypes
types (including ``Structure`` types, whose fields are attributes); values are
converted, checked and wrapped by ctypes exactly as there (in the creator); ``Value``
and ``Array`` are synchronized by default with a new ``RLock`` (``lock=True``), by a
given lock, or not at all (``lock=False``, which returns the raw object, without
``get_lock()``). A synchronized access waits while another thread or job holds the
lock, so ``with v.get_lock(): v.value += 1`` is atomic across jobs. The lock check
and the access are a single request when the lock is a fiberlite lock of the same
process (always so with ``lock=True``); with another lock the access is wrapped in
``acquire()``/``release()`` by the caller, as ``multiprocessing`` does.

Differences: the raw objects are proxies, not ctypes instances (no buffer protocol:
they cannot be passed to C functions or ``numpy.frombuffer``); iterating an array
takes one snapshot of it; accessing a synchronized object while holding its
(non-recursive) ``Lock`` works instead of deadlocking.
"""
from __future__ import annotations

import ctypes
import operator
import os
import threading
from typing import Any

from .runtime.hub import LOCAL_PEER, Servant
from .synchronize.primitives import RLock, _LockBase, _Shared

__all__ = ["RawValue", "RawArray", "Value", "Array", "copy", "typecode_to_type",
           "Synchronized", "SynchronizedArray", "SynchronizedString"]

typecode_to_type: dict[str, type] = {
    "c": ctypes.c_char, "u": ctypes.c_wchar,
    "b": ctypes.c_byte, "B": ctypes.c_ubyte,
    "h": ctypes.c_short, "H": ctypes.c_ushort,
    "i": ctypes.c_int, "I": ctypes.c_uint,
    "l": ctypes.c_long, "L": ctypes.c_ulong,
    "q": ctypes.c_longlong, "Q": ctypes.c_ulonglong,
    "f": ctypes.c_float, "d": ctypes.c_double,
}

_CTYPES_BASES = (ctypes._SimpleCData, ctypes.Structure, ctypes.Union, ctypes.Array,
                 ctypes._Pointer)  # type: ignore[attr-defined]


def _ctype(typecode_or_type: Any) -> type:
    ctype = typecode_to_type.get(typecode_or_type, typecode_or_type) \
        if isinstance(typecode_or_type, str) else typecode_or_type
    if not (isinstance(ctype, type) and issubclass(ctype, _CTYPES_BASES)):
        raise TypeError(f"{typecode_or_type!r} is neither a typecode "
                        f"({''.join(typecode_to_type)}) nor a ctypes type")
    return ctype


# ------------------------------------------------------------------------------------------
# hub side
# ------------------------------------------------------------------------------------------
def _get(obj: Any, name: str) -> Any:
    return getattr(obj, name)


def _set(obj: Any, name: str, value: Any) -> None:
    setattr(obj, name, value)


_OPS = {"get": _get, "set": _set, "getitem": operator.getitem, "setitem": operator.setitem}


class SharedServant(Servant):
    """A ctypes object; ``guard`` is the LockServant that synchronized accesses respect."""

    def __init__(self, obj: Any, guard: Any = None) -> None:
        self.obj = obj
        self.guard = guard
        self._lock = threading.Lock()

    def _bind(self, op: str, args: tuple):
        fn = _OPS.get(op)
        if fn is None or (op in ("get", "set") and str(args[0]).startswith("_")):
            raise AttributeError(f"shared ctypes objects have no operation {op}{args[:1]!r}")
        obj, lock = self.obj, self._lock

        def access() -> Any:
            with lock:
                return fn(obj, *args)
        return access

    def op_access(self, request, op: str, args: tuple, pid: int | None = None,
                  tid: int | None = None) -> None:
        access = self._bind(op, args)
        if pid is None or self.guard is None:
            request.reply(access())
        else:
            self.guard.run_locked(request, (request.peer, pid, tid), access)

    def op_copy(self, request) -> None:
        """A new raw shared object holding a copy of this one, served here."""
        request.reply(self.copy())

    def copy(self) -> "SharedValue":
        with self._lock:
            snapshot = type(self.obj).from_buffer_copy(self.obj)
        return _wrap(snapshot, False, None)

    def try_access(self, op: str, args: tuple, key: tuple | None) -> tuple[bool, Any]:
        """A direct access from the owning process: ``(False, None)`` if it has to wait."""
        access = self._bind(op, args)
        if key is None or self.guard is None:
            return True, access()
        return self.guard.try_run(key, access)


# ------------------------------------------------------------------------------------------
# the handles users hold
# ------------------------------------------------------------------------------------------
class _SharedCtype(_Shared):
    """What raw and synchronized objects share: where the object is and what it is."""

    _synchronized = False

    def _init(self, obj: Any, lock: Any = None) -> None:
        guard = lock._servant if isinstance(lock, _LockBase) else None
        self._register(SharedServant(obj, guard))
        self._lock = lock
        self._guarded = guard is not None  # the hub checks the lock itself
        ctype = type(obj)
        self._typename = ctype.__name__
        self._fields = tuple(f[0] for f in getattr(ctype, "_fields_", ()))
        self._length = len(obj) if isinstance(obj, ctypes.Array) else None
        self._elemname = obj._type_.__name__ if isinstance(obj, ctypes.Array) else None

    def _getstate(self) -> tuple:
        return (self._lock, self._guarded, self._typename, self._fields, self._length,
                self._elemname)

    def _setstate(self, state: tuple) -> None:
        (self._lock, self._guarded, self._typename, self._fields, self._length,
         self._elemname) = state

    def __reduce__(self):
        keep = self.__dict__.get("_keep")  # a raw view of a synchronized object
        if keep is not None:
            keep.__reduce__()
        return super().__reduce__()

    def _access(self, op: str, *args: Any) -> Any:
        if not self._synchronized:
            servant = self._servant
            if servant is not None:
                return servant.try_access(op, args, None)[1]
            return self._ref.call("access", op, args)
        if not self._guarded:  # a lock the hub cannot see: hold it around the access
            with self._lock:
                servant = self._servant
                if servant is not None:
                    return servant.try_access(op, args, None)[1]
                return self._ref.call("access", op, args)
        pid, tid = os.getpid(), threading.get_ident()
        servant = self._servant
        if servant is not None:
            done, value = servant.try_access(op, args, (LOCAL_PEER, pid, tid))
            if done:
                return value
        return self._ref.call("access", op, args, pid, tid)

    # Structure fields are attributes
    def __getattr__(self, name: str) -> Any:
        if not name.startswith("_") and name in self.__dict__.get("_fields", ()):
            return self._access("get", name)
        raise AttributeError(f"{type(self).__name__!r} object has no attribute {name!r}")

    def __setattr__(self, name: str, value: Any) -> None:
        if not name.startswith("_") and name in self.__dict__.get("_fields", ()):
            self._access("set", name, value)
        else:
            object.__setattr__(self, name, value)


class _ValueMixin:
    @property
    def value(self) -> Any:
        return self._access("get", "value")  # type: ignore[attr-defined]

    @value.setter
    def value(self, value: Any) -> None:
        self._access("set", "value", value)  # type: ignore[attr-defined]


class _ArrayMixin:
    def __len__(self) -> int:
        return self._length  # type: ignore[attr-defined]

    def __getitem__(self, index: Any) -> Any:
        return self._access("getitem", index)  # type: ignore[attr-defined]

    def __setitem__(self, index: Any, value: Any) -> None:
        self._access("setitem", index, value)  # type: ignore[attr-defined]

    def __iter__(self):
        data = self[:]
        if isinstance(data, bytes):  # items of a char array are 1-byte strings
            return (data[i:i + 1] for i in range(len(data)))
        return iter(data)


class _StringMixin(_ValueMixin):
    @property
    def raw(self) -> bytes:
        return self._access("get", "raw")  # type: ignore[attr-defined]

    @raw.setter
    def raw(self, value: bytes) -> None:
        self._access("set", "raw", value)  # type: ignore[attr-defined]


class _SyncMixin:
    """``get_lock()``, ``get_obj()`` and the lock's methods (``multiprocessing``'s wrappers)."""

    _synchronized = True
    _raw_class: type

    def get_lock(self) -> Any:
        return self._lock  # type: ignore[attr-defined]

    def get_obj(self) -> Any:
        """The unsynchronized object (accesses do not wait for the lock)."""
        raw = self._raw_class.__new__(self._raw_class)
        object.__setattr__(raw, "__dict__", dict(self.__dict__))
        raw._keep = self  # the raw object keeps the servant alive too
        return raw

    def acquire(self, *args: Any, **kwargs: Any) -> bool:
        return self._lock.acquire(*args, **kwargs)  # type: ignore[attr-defined]

    def release(self) -> None:
        self._lock.release()  # type: ignore[attr-defined]

    def __enter__(self) -> bool:
        return self._lock.__enter__()  # type: ignore[attr-defined]

    def __exit__(self, *exc: Any) -> None:
        self._lock.__exit__(*exc)  # type: ignore[attr-defined]


class SharedValue(_ValueMixin, _SharedCtype):
    """A raw shared scalar or structure (``RawValue``)."""

    def __repr__(self) -> str:
        return f"<{type(self).__name__} {_describe(self)}>"


class SharedArray(_ArrayMixin, _SharedCtype):
    """A raw shared array (``RawArray``)."""

    def __repr__(self) -> str:
        return f"<{type(self).__name__} {self._elemname}[{self._length}] {self._ref.oid}@{self._ref.address}>"


class SharedString(_StringMixin, SharedArray):
    """A raw shared array of ``c_char`` with ``value`` and ``raw``."""


class Synchronized(_SyncMixin, SharedValue):
    _raw_class = SharedValue

    def __repr__(self) -> str:
        return f"<Synchronized wrapper for {_describe(self)}>"


class SynchronizedArray(_SyncMixin, SharedArray):
    _raw_class = SharedArray

    def __repr__(self) -> str:
        return (f"<{type(self).__name__} wrapper for {self._elemname}[{self._length}] "
                f"{self._ref.oid}@{self._ref.address}>")


class SynchronizedString(_SyncMixin, SharedString):
    _raw_class = SharedString


def _describe(obj: Any) -> str:
    if obj._fields:
        return obj._typename
    try:
        return f"{obj._typename}({obj.value!r})"
    except Exception:
        return obj._typename


# ------------------------------------------------------------------------------------------
# factories
# ------------------------------------------------------------------------------------------
def _new_value(typecode_or_type: Any, args: tuple) -> Any:
    return _ctype(typecode_or_type)(*args)


def _new_array(typecode_or_type: Any, size_or_initializer: Any) -> Any:
    ctype = _ctype(typecode_or_type)
    if isinstance(size_or_initializer, int):
        return (ctype * size_or_initializer)()
    items = list(size_or_initializer)
    return (ctype * len(items))(*items)


def _wrap(obj: Any, lock: Any, ctx: Any) -> Any:
    """The handle for ``obj``: raw when ``lock`` is False, else synchronized by ``lock``."""
    string = isinstance(obj, ctypes.Array) and obj._type_ is ctypes.c_char
    if lock is False:
        cls: type = SharedString if string else SharedArray if isinstance(obj, ctypes.Array) else SharedValue
        lock = None
    else:
        if lock is True or lock is None:
            lock = RLock(ctx=ctx)
        if not hasattr(lock, "acquire"):
            raise AttributeError(f"{lock!r} has no method 'acquire'")
        cls = SynchronizedString if string else SynchronizedArray if isinstance(obj, ctypes.Array) \
            else Synchronized
    handle = cls.__new__(cls)
    handle._init(obj, lock)
    return handle


def RawValue(typecode_or_type: Any, *args: Any) -> SharedValue:
    """A shared ctypes value without a lock."""
    return _wrap(_new_value(typecode_or_type, args), False, None)


def RawArray(typecode_or_type: Any, size_or_initializer: Any) -> SharedArray:
    """A shared ctypes array without a lock: ``size`` zeros, or a copy of a sequence."""
    return _wrap(_new_array(typecode_or_type, size_or_initializer), False, None)


def copy(obj: Any) -> Any:
    """A new raw shared object holding a copy of ``obj``: a ctypes object, or a shared
    value or array (raw or synchronized; it is copied where it lives, without its lock)."""
    if isinstance(obj, _SharedCtype):
        servant = obj._servant
        return servant.copy() if servant is not None else obj._ref.call("copy")
    if isinstance(obj, (ctypes._SimpleCData, ctypes.Structure, ctypes.Union, ctypes.Array)):
        return _wrap(type(obj).from_buffer_copy(obj), False, None)
    raise TypeError(f"copy() takes a ctypes object or a shared Value/Array, not {type(obj).__name__}")


def Value(typecode_or_type: Any, *args: Any, lock: Any = True, ctx: Any = None) -> Any:
    """A shared ctypes value, synchronized by a new RLock (``lock=True``), by ``lock``,
    or raw (``lock=False``)."""
    return _wrap(_new_value(typecode_or_type, args), lock, ctx)


def Array(typecode_or_type: Any, size_or_initializer: Any, *, lock: Any = True,
          ctx: Any = None) -> Any:
    """A shared ctypes array, synchronized like :func:`Value`."""
    return _wrap(_new_array(typecode_or_type, size_or_initializer), lock, ctx)
