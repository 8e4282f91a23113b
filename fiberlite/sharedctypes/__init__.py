"""``Value``, ``Array``, ``RawValue`` and ``RawArray`` in shared memory (``multiprocessing.sharedctypes``).

The objects are real ctypes objects in the creating process's shared memory
(:mod:`.raw`): in every process of its machine a ``RawArray`` is a ctypes array on the
same memory (``numpy.frombuffer(arr.get_obj())`` works in a child as in the parent),
and ``Value``/``Array`` wrap one with a lock (:mod:`.wrappers`) exactly as
``multiprocessing`` does. A job on another machine (or with ``share_machine`` off) gets
a proxy whose accesses its creator makes on the same memory.

Semantics kept from ``multiprocessing.sharedctypes``: typecodes of ``array`` or ctypes
types (``Structure`` types too, whose fields are attributes); values converted and
checked by ctypes; ``Value`` and ``Array`` synchronized by a new ``RLock``
(``lock=True``), by a given lock, or not at all (``lock=False``: the raw object).
"""
from __future__ import annotations

import ctypes
from typing import Any

from ..runtime.hub import current_hub
from ..synchronize.locks import RLock, _LockBase
from .raw import RawProxy, copy_raw, ctype_of, new_raw, servant_of, typecode_to_type
from .wrappers import (Synchronized, SynchronizedArray, SynchronizedBase, SynchronizedString,
                       synchronized)

__all__ = ["RawValue", "RawArray", "Value", "Array", "copy", "synchronized", "typecode_to_type",
           "Synchronized", "SynchronizedArray", "SynchronizedString"]


def RawValue(typecode_or_type: Any, *args: Any) -> Any:
    """A shared ctypes value without a lock."""
    ctype = ctype_of(typecode_or_type)
    return new_raw(ctype, (lambda obj: obj.__init__(*args)) if args else None)


def RawArray(typecode_or_type: Any, size_or_initializer: Any) -> Any:
    """A shared ctypes array without a lock: ``size`` zeros, or a copy of a sequence."""
    ctype = ctype_of(typecode_or_type)
    if isinstance(size_or_initializer, int):
        return new_raw(ctype * size_or_initializer)
    items = list(size_or_initializer)
    return new_raw(ctype * len(items), lambda obj: obj.__init__(*items))


def _wrap(obj: Any, lock: Any, ctx: Any) -> Any:
    """``obj`` raw when ``lock`` is False, else synchronized by ``lock`` (True: a new RLock)."""
    if lock is False:
        return obj
    if lock is True or lock is None:
        lock = RLock(ctx=ctx)
    if not hasattr(lock, "acquire"):
        raise AttributeError(f"{lock!r} has no method 'acquire'")
    guarded = False
    hub = current_hub()
    if isinstance(lock, _LockBase) and hub is not None and hub.address == lock._ref.address:
        servant_of(obj).guard_with(hub.servant(lock._ref.oid))  # a job's access is one request
        guarded = True
    return synchronized(obj, lock, ctx, guarded)


def Value(typecode_or_type: Any, *args: Any, lock: Any = True, ctx: Any = None) -> Any:
    """A shared ctypes value, synchronized by a new RLock (``lock=True``), by ``lock``,
    or raw (``lock=False``)."""
    return _wrap(RawValue(typecode_or_type, *args), lock, ctx)


def Array(typecode_or_type: Any, size_or_initializer: Any, *, lock: Any = True,
          ctx: Any = None) -> Any:
    """A shared ctypes array, synchronized like :func:`Value`."""
    return _wrap(RawArray(typecode_or_type, size_or_initializer), lock, ctx)


def copy(obj: Any) -> Any:
    """A new raw shared object holding a copy of ``obj``: a ctypes object, or a shared
    value or array (raw or synchronized, copied without its lock), made in this process
    (or, for a proxy of another machine's, in its creator)."""
    if isinstance(obj, SynchronizedBase):
        obj = obj.get_obj()
    if isinstance(obj, RawProxy):
        return obj._ref.call("copy").unpack()
    if isinstance(obj, (ctypes._SimpleCData, ctypes.Structure, ctypes.Union, ctypes.Array)):
        return copy_raw(obj)
    raise TypeError(f"copy() takes a ctypes object or a shared Value/Array, not {type(obj).__name__}")
