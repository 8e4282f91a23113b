"""Raw shared ctypes objects: real ctypes objects in their creator's shared memory.

``RawValue`` and ``RawArray`` return an instance of the ctypes type made on a block of
the creator's arena (:mod:`fiberlite.runtime.shm`): it has the buffer protocol, so
``memoryview``, ``numpy.frombuffer`` and C functions see the shared memory itself. It
pickles (as a Process argument, on a queue) with the block's place: a process that can
map the block gets the same kind of ctypes object on the same memory; any other gets a
:class:`RawProxy`, whose accesses are made by the object's servant in the creator
(:class:`RawServant`), on the same memory. Plain ctypes objects still pickle by value.
"""
from __future__ import annotations

import ctypes
import operator
from typing import Any

from ..runtime import handles
from ..runtime.hub import ObjectRef, current_hub
from ..runtime.shm.arena import Block
from ..runtime.shm.place import Place, allocate, view
from ..runtime.shm.remote import NOT_YET
from ..synchronize import carry
from ..synchronize.shared import BlockServant, remote_call
from ..wire import codec

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
SHARE = "_fiberlite_share"  # the attribute of a shared instance: (place, ref)


def ctype_of(typecode_or_type: Any) -> type:
    ctype = typecode_to_type.get(typecode_or_type, typecode_or_type) \
        if isinstance(typecode_or_type, str) else typecode_or_type
    if not (isinstance(ctype, type) and issubclass(ctype, _CTYPES_BASES)):
        raise TypeError(f"{typecode_or_type!r} is neither a typecode "
                        f"({''.join(typecode_to_type)}) nor a ctypes type")
    return ctype


def _get(obj: Any, name: str) -> Any:
    return getattr(obj, name)


def _set(obj: Any, name: str, value: Any) -> None:
    setattr(obj, name, value)


OPS = {"get": _get, "set": _set, "getitem": operator.getitem, "setitem": operator.setitem}


def bind_op(obj: Any, op: str, args: tuple):
    """``op`` (get, set, getitem, setitem) on ``obj`` with ``args``, checked and ready to run."""
    fn = OPS.get(op)
    if fn is None or (op in ("get", "set") and str(args[0]).startswith("_")):
        raise AttributeError(f"shared ctypes objects have no operation {op}{args[:1]!r}")
    return lambda: fn(obj, *args)


class RawServant(BlockServant):
    """A raw object in its creator's hub: it keeps the object's memory, and reads and
    writes it for the jobs that cannot map it. ``guard``: the mutex of the lock that
    synchronizes it, when that lock lives here too (then a synchronized access from a
    job is one request: the lock is taken for it, here)."""

    def __init__(self, block: Block, ctype: type) -> None:
        super().__init__(block)
        self.obj = ctype.from_buffer(block.buffer, block.offset)
        self.guard: Any = None

    def op_access(self, request, op: str, args: tuple, pid: int | None = None,
                  tid: int | None = None, ticket: int | None = None) -> None:
        access = bind_op(self.obj, op, args)
        guard = self.guard
        if pid is None or guard is None:
            request.reply(access())
            return
        token = self.token(request, pid, tid)
        if guard.owner() == token:  # the caller holds the lock already
            request.reply(access())
            return

        def attempt(seconds: float | None) -> Any:
            if not guard.acquire_as(token, seconds is not None, seconds):
                return NOT_YET
            try:
                return access()
            finally:
                guard.release_as(token)
        value = NOT_YET if self.waits else attempt(None)  # first come, first served
        if value is NOT_YET:
            self.waits.start(request, (request.peer, pid, tid, ticket), attempt, None, None,
                             parks=True)
        else:
            self.waits.released()
            request.reply(value)

    def guard_with(self, lock: Any) -> None:
        """Take ``lock`` (the servant of a lock of this process) for a job's access: its
        mutex, and the calls that wait for it, so that they are served in turn."""
        self.guard = lock.mutex
        self.waits = lock.waits

    def op_copy(self, request) -> None:
        """A new raw object here holding a copy of this one (pickled as a user object)."""
        request.reply(codec.Payload.pack(copy_raw(self.obj)))


def new_raw(ctype: type, fill: Any = None) -> Any:
    """A new ctypes object of ``ctype`` in this process's shared memory, zeroed, then
    ``fill(obj)``."""
    block, place = allocate(ctypes.sizeof(ctype))
    obj = ctype.from_buffer(block.buffer, block.offset)
    if fill is not None:
        fill(obj)
    servant = RawServant(block, ctype)
    ref = handles.register(obj, servant)
    _share(obj, place, ref)
    return obj


def copy_raw(obj: Any) -> Any:
    """A new raw object here holding a copy of the ctypes object ``obj``."""
    return new_raw(type(obj), lambda new: ctypes.memmove(ctypes.addressof(new), ctypes.addressof(obj),
                                                         ctypes.sizeof(obj)))


def servant_of(obj: Any) -> RawServant | None:
    """The servant of a raw object made in this process (None: made elsewhere, or plain)."""
    share = shared(obj)
    if share is None:
        return None
    hub = current_hub()
    ref = share[1]
    return hub.servant(ref.oid) if hub is not None and hub.address == ref.address else None


def shared(obj: Any) -> tuple[Place, ObjectRef] | None:
    """``(place, ref)`` of a shared ctypes object, None for a plain one."""
    try:
        return obj.__dict__.get(SHARE)
    except AttributeError:
        return None


def _share(obj: Any, place: Place, ref: ObjectRef) -> None:
    obj.__dict__[SHARE] = (place, ref)
    codec.register_reducer(type(obj), _reduce)


def _reduce(obj: Any) -> tuple:
    share = shared(obj)
    if share is None:  # a plain object of a type some shared object has: by value
        return obj.__reduce_ex__(codec.PROTOCOL)
    place, ref = share
    handles.exported(ref)
    return (_rebuild, (*_type_args(type(obj)), place, ref))


def _type_args(ctype: type) -> tuple:
    """How to name ``ctype`` to another process: an array type by its item type and length."""
    if issubclass(ctype, ctypes.Array):
        return (ctype._type_, ctype._length_)
    return (ctype, None)


def _rebuild(ctype: type, length: int | None, place: Place, ref: ObjectRef) -> Any:
    if length is not None:
        ctype = ctype * length
    here = view(place)
    if here is None:
        return RawProxy(ctype, place, ref)
    buffer, _ = here
    obj = ctype.from_buffer(buffer, place.offset)
    _share(obj, place, ref)
    handles.loaded(obj, ref)
    return obj


def accessed(name: str) -> property:
    """An attribute read and written by ``self._access("get"/"set", name)``."""
    return property(lambda self: self._access("get", name),
                    lambda self, value: self._access("set", name, value))


class AccessedArray:
    """Indexing and iteration of an array reached through ``self._access(op, *args)``
    (iterating takes one snapshot)."""

    def __getitem__(self, index: Any) -> Any:
        return self._access("getitem", index)  # type: ignore[attr-defined]

    def __setitem__(self, index: Any, value: Any) -> None:
        self._access("setitem", index, value)  # type: ignore[attr-defined]

    def __iter__(self):
        data = self[:]
        if isinstance(data, bytes):  # items of a char array are 1-byte strings
            return (data[i:i + 1] for i in range(len(data)))
        return iter(data)


class RawProxy(AccessedArray):
    """A raw object of another machine: each access is a request to its creator."""

    value = accessed("value")
    raw = accessed("raw")

    def __init__(self, ctype: type, place: Place, ref: ObjectRef) -> None:
        object.__setattr__(self, "_ctype", ctype)
        object.__setattr__(self, "_place", place)
        object.__setattr__(self, "_ref", ref)
        object.__setattr__(self, "_fields", tuple(f[0] for f in getattr(ctype, "_fields_", ())))

    def __reduce__(self):
        handles.exported(self._ref)
        return (_rebuild, (*_type_args(self._ctype), self._place, self._ref))

    def _access(self, op: str, *args: Any) -> Any:
        carried = carry.live((self._ref.address, self._ref.oid))
        if carried is not None:  # a copy this thread's lock brought: written back first
            carried.settle()
        return remote_call(self._ref, "access", op, args)

    def __len__(self) -> int:
        return self._ctype._length_

    def __getattr__(self, name: str) -> Any:  # Structure fields
        if name in self.__dict__.get("_fields", ()):
            return self._access("get", name)
        raise AttributeError(f"{self._ctype.__name__!r} object has no attribute {name!r}")

    def __setattr__(self, name: str, value: Any) -> None:
        if name in self._fields:
            self._access("set", name, value)
        elif isinstance(getattr(type(self), name, None), property):  # value, raw
            object.__setattr__(self, name, value)
        else:
            raise AttributeError(f"{self._ctype.__name__!r} object has no attribute {name!r}")

    def __repr__(self) -> str:
        return f"<{self._ctype.__name__} of {self._ref.address}, reached through its hub>"
