"""The pool's chunk format: how calls, items, results and failures are pickled.

The master (:mod:`.master.pool` packs, :mod:`.master.core` unpacks results,
:mod:`.master.dispatch` splits chunks and describes them) and every worker job
(:mod:`.job.worker`) share it:

- a call's function travels as a ``Payload`` of ``(kind, function)``, ``kind`` being
  ``"map"``, ``"star"`` or ``"apply"`` (:func:`pack_call`: pickled once while the
  function is unchanged);
- a chunk's data is the pickled list of its items, or ``(args, kwds)`` for an
  ``apply`` (:func:`pack_items`, :func:`pack_arguments`, which name what cannot be
  pickled); a batch of results is the list of their values (:func:`pack`,
  :func:`unpack`: bytes, or a Payload when there are out-of-band buffers);
- an exception a task raised travels as a :class:`~fiberlite.failure.Failure`
  (:func:`pack_failure`, :func:`unpack_failure`);
- a message carries at most :data:`MAX_BATCH` chunks and about :data:`MESSAGE_BYTES`
  of arguments (the master's replies) or results (a worker's requests).
"""
from __future__ import annotations

import pickle
import threading
import types
import weakref
from multiprocessing.pool import MaybeEncodingError
from typing import Any, Callable, Sequence

from ..failure import Failure
from ..wire.codec import (PROTOCOL, Payload, dumps_bytes, dumps_quick, name_unpicklable,
                          short_repr, unpicklable_error)

MAX_BATCH = 512  # chunks in one message between the master and a worker, at most
MESSAGE_BYTES = 4 << 20  # pickled arguments or results in one message, about (at least one chunk)


# -- items and results ------------------------------------------------------------------------
def pack(obj: Any) -> Any:
    """Pickle ``obj`` for a worker: bytes, or a Payload when it has out-of-band buffers
    (numpy arrays, large ``bytes``: see :func:`fiberlite.wire.codec.dumps`)."""
    if type(obj) is range:  # a short list of ints pickles several times faster than a range
        return pickle.dumps(list(obj) if len(obj) <= 16 else obj, PROTOCOL)
    data, buffers = dumps_quick(obj)  # a short list of plain items: nothing cloudpickle would change
    if not buffers:
        return data
    return Payload(data, buffers)


def unpack(data: Any) -> Any:
    """Load what :func:`pack` made."""
    if type(data) is bytes:
        return pickle.loads(data)
    return data.unpack()


# -- failures ---------------------------------------------------------------------------------
def encoding_error(reason: str, value: str) -> MaybeEncodingError:
    """``MaybeEncodingError`` from what was already described as text (``repr(exc)``,
    ``short_repr(value)``): its message shows each once, as the stdlib's does (whose
    constructor takes the objects themselves and quotes their ``repr``)."""
    error = MaybeEncodingError(reason, value)
    error.exc, error.value = reason, value  # str() reads these; they travel in __dict__
    return error


def pack_failure(exc: BaseException, tb: str) -> bytes:
    """An exception raised by a task, with its formatted traceback (:class:`Failure`)."""
    return pickle.dumps(Failure.of(exc, tb), PROTOCOL)


def unpack_failure(data: bytes) -> BaseException:
    """The exception :func:`pack_failure` packed, its traceback attached as its cause; one
    that could not travel is a ``MaybeEncodingError`` saying why."""
    try:
        failure = pickle.loads(data)
    except Exception as error:
        return encoding_error(repr(error), "an exception raised by the task")
    return failure.rebuild(lambda f: encoding_error(f.why or "not an exception", f.shown))


# -- the master's side: calls, arguments and items, pickled once ------------------------------
class _FunctionPickles:
    """Pickled functions, reused while the function's code, defaults and closure are the same.

    A function of ``__main__`` travels by value; pickling it is most of the cost of an
    ``apply_async``. Globals it uses are sent as they were first pickled, which is what a
    worker keeps anyway (see :func:`fiberlite.pool.job.worker.adopt`).
    """

    def __init__(self) -> None:
        self._cache: "weakref.WeakKeyDictionary[Any, tuple]" = weakref.WeakKeyDictionary()
        self._lock = threading.Lock()

    @staticmethod
    def _fingerprint(func: Any) -> tuple | None:
        if type(func) is not types.FunctionType:
            return None  # callable objects and methods may carry state: pickle each time
        try:
            cells = tuple(cell.cell_contents for cell in func.__closure__ or ())
        except ValueError:  # an empty cell
            return None
        return (func.__code__, func.__defaults__, func.__kwdefaults__, *cells)

    def get(self, kind: str, func: Any) -> Payload:
        fingerprint = self._fingerprint(func)
        if fingerprint is not None:
            with self._lock:
                entry = self._cache.get(func)
            if entry is not None and entry[0] == kind and len(entry[1]) == len(fingerprint) \
                    and all(a is b for a, b in zip(entry[1], fingerprint, strict=True)):
                return entry[2]
        payload = Payload.pack((kind, func))
        if fingerprint is not None:
            with self._lock:
                self._cache[func] = (kind, fingerprint, payload)
        return payload


_function_pickles = _FunctionPickles()


def pack_call(kind: str, func: Callable, method: str) -> Payload:
    """Pickle a call's function (once per call at most), naming it if it cannot be."""
    try:
        return _function_pickles.get(kind, func)
    except Exception as exc:
        raise unpicklable_error(exc, (
            f"Pool.{method}: the function {short_repr(func)} cannot be pickled ({exc}). Functions "
            "and arguments are sent to the worker jobs; pass a picklable callable (a function "
            "of a module or of the script, not one holding locks, files or sockets).")) from None


def pack_arguments(args: tuple, kwds: dict, method: str) -> Any:
    """Pickle the arguments of an ``apply``, naming the one that cannot be."""
    try:
        return pack((args, kwds))
    except Exception as exc:
        culprit = name_unpicklable(
            [(f"argument {i}", a) for i, a in enumerate(args)]
            + [(f"keyword argument {k!r}", v) for k, v in kwds.items()]) or "an argument"
        raise unpicklable_error(exc, (
            f"Pool.{method}: {culprit} cannot be pickled ({exc}). Arguments are sent to the "
            "worker jobs; pass picklable objects, or create the object inside the task.")) from None


def pack_items(items: Sequence, start: int, method: str) -> Any:
    """Pickle a chunk's items (``start`` is the first one's index in the call's input),
    naming the one that cannot be."""
    try:
        return pack(items)
    except Exception as exc:
        culprit = name_unpicklable((f"item {start + offset} of the iterable,", item)
                                   for offset, item in enumerate(items))
        culprit = (f"{culprit}," if culprit is not None
                   else f"one of the items {start}..{start + len(items) - 1}")
        raise unpicklable_error(exc, (
            f"Pool.{method}: {culprit} cannot be pickled ({exc}). Arguments are sent to the "
            "worker jobs; pass picklable objects.")) from None


def describe_args(kind: str, data: Any) -> str:
    """The arguments of a chunk's task(s) of a call of ``kind``, for an error message."""
    try:
        items = unpack(data)
        if kind == "apply":
            args, kwds = items
            parts = [short_repr(a) for a in args]
            parts += [f"{k}={short_repr(v)}" for k, v in kwds.items()]
            return ", ".join(parts)
        if len(items) == 1:
            item = items[0]
            if kind == "star" and isinstance(item, tuple):
                return ", ".join(short_repr(a) for a in item)
            return short_repr(item)
        return "one of " + short_repr(items)
    except Exception as exc:
        return f"<arguments could not be shown: {exc}>"
