"""Pickling of user objects: cloudpickle, out-of-band buffers, and errors that name the culprit.

:func:`dumps` pickles with cloudpickle (functions and classes of ``__main__`` by value;
numpy arrays and ``bytes``/``bytearray`` of :data:`OUT_OF_BAND_MIN` bytes or more as
out-of-band buffers), :func:`loads` loads it; :func:`dumps_quick` uses the C pickler for
:func:`plain` values. A global of a ``__main__`` function that cannot be pickled is
replaced by its name when the first try fails (:mod:`.main_globals`). When an object
cannot be pickled, :func:`name_unpicklable` finds the part to name in the error
(:func:`unpicklable_error`). :mod:`.codec` frames what this module pickles.
"""
from __future__ import annotations

import io
import pickle
import struct
import types
from collections import ChainMap
from typing import Any, Callable, Iterable

import cloudpickle

from . import main_globals, tensors

PROTOCOL = 5
OUT_OF_BAND_MIN = 64 * 1024  # smaller payloads are cheaper to copy into the pickle
_LENGTH = struct.Struct("<Q")
_ATOMS = frozenset({str, int, float, bool, complex, type(None)})  # and bytes, when small
_CONTAINERS = frozenset({tuple, list, dict})
_pickle_dumps = pickle.dumps


_CLOUDPICKLE_CODE_REDUCE = cloudpickle.Pickler.dispatch_table[types.CodeType]
_ANONYMOUS_FILE = "<dynamic-code>"


def _reduce_code(code: types.CodeType) -> tuple:
    """cloudpickle's reduction of a code object, keeping the code's file name.

    cloudpickle 3.1.3 and later write ``<dynamic-code>`` in its place, so a job's
    traceback would name no file and show no source line of the user's script."""
    rebuild, args = _CLOUDPICKLE_CODE_REDUCE(code)
    if code.co_filename != _ANONYMOUS_FILE and _ANONYMOUS_FILE in args:
        args = list(args)
        args[args.index(_ANONYMOUS_FILE)] = code.co_filename  # the first str field
        args = tuple(args)
    return rebuild, args


class Pickler(cloudpickle.Pickler):
    """cloudpickle's Pickler (functions and classes of ``__main__`` by value) whose
    functions keep the name of the file they were defined in.

    With ``stand_ins``, a global of a ``__main__`` function that cannot be pickled is
    replaced by a :class:`~fiberlite.wire.main_globals.MainGlobal` naming it."""

    # one level: a miss in a nested ChainMap costs another Python-level lookup
    dispatch_table = ChainMap({types.CodeType: _reduce_code}, *cloudpickle.Pickler.dispatch_table.maps)
    stand_ins = False

    def _dynamic_function_reduce(self, func):
        reduced = super()._dynamic_function_reduce(func)
        if self.stand_ins:
            main_globals.stand_in(func, reduced[2][1]["__globals__"], _pickling_error)
        return reduced


def register_reducer(kind: type, reduce: Any) -> None:
    """Pickle instances of ``kind`` with ``reduce(obj)`` (a reduce tuple), in every
    :class:`Pickler` of this process."""
    Pickler.dispatch_table.maps[0][kind] = reduce


_tensors_pending = True  # torch.Tensor's reducer is registered once torch is imported


def _register_tensors() -> None:
    global _tensors_pending
    found = tensors.reducer_if_imported()
    if found is not None:
        register_reducer(*found)
        _tensors_pending = False


class _StandIns(Pickler):
    stand_ins = True


def _pickling_error(obj: Any) -> Exception | None:
    """The error pickling ``obj`` (globals of the main script replaced), or None."""
    try:
        _StandIns(io.BytesIO(), protocol=PROTOCOL).dump(obj)
    except Exception as exc:
        return exc
    return None


def _with_stand_ins(pickle_it: Callable[[type], Any]) -> Any:
    """``pickle_it(Pickler)``; if that fails and the main script has a file, once more with
    its unpicklable globals replaced (see :mod:`.main_globals`). The first error is raised
    if the second try fails too."""
    if _tensors_pending:
        _register_tensors()
    try:
        return pickle_it(Pickler)
    except Exception as exc:
        first = exc
    if main_globals.main_file() is None:
        raise first
    try:
        return pickle_it(_StandIns)
    except Exception:
        pass
    raise first


def dumps_bytes(obj: Any) -> bytes:
    """Pickle ``obj`` in band with :class:`Pickler` (as ``cloudpickle.dumps``)."""
    def pickle_it(pickler: type) -> bytes:
        file = io.BytesIO()
        pickler(file, protocol=PROTOCOL).dump(obj)
        return file.getvalue()
    return _with_stand_ins(pickle_it)


def short_repr(obj: Any, limit: int = 200) -> str:
    """``repr(obj)`` cut to ``limit`` characters, for an error message (never raises)."""
    try:
        text = repr(obj)
    except Exception:
        text = f"<{type(obj).__name__} object>"
    return text if len(text) <= limit else text[:limit] + "..."


def name_unpicklable(parts: Iterable[tuple[str, Any]]) -> str | None:
    """``"<label> <repr>"`` of the first of ``(label, value)`` ``parts`` whose value
    cannot be pickled (as :func:`dumps_bytes` pickles it), or None if every one can:
    what an error message names when a whole (a Process, a call's arguments) cannot."""
    for label, value in parts:
        try:
            dumps_bytes(value)
        except Exception:
            through = main_globals.culprit(value, _pickling_error)
            return f"{label} {short_repr(value)}" + (f" ({through})" if through else "")
    return None


def unpicklable_error(exc: Exception, message: str) -> Exception:
    """The error to raise instead of ``exc``, which pickling raised: of ``exc``'s type
    when it takes a message (else ``TypeError``), saying ``message``."""
    try:
        return type(exc)(message)
    except Exception:
        return TypeError(message)


class _InBand(Exception):
    """The fast pass met a large ``bytes`` or ``bytearray``: pickle again with :class:`_Pickler`."""


_HEADERS = ((b"B", struct.Struct("<I")), (b"\x8e", _LENGTH))  # BINBYTES, BINBYTES8


class _Parts:
    """The file of the fast pass: keeps the pieces the pickler writes.

    The C pickler writes a ``bytes`` or ``bytearray`` of 64 KiB or more (its frame size,
    equal to :data:`OUT_OF_BAND_MIN`) as a write of the object itself, right after a
    write ending with its opcode and length: that is how one is recognised. A false
    alarm only costs the exact second pass.
    """

    __slots__ = ("parts",)

    def __init__(self) -> None:
        self.parts: list = []

    def write(self, data: Any) -> None:
        if type(data) is not bytes or (len(data) >= OUT_OF_BAND_MIN and self._after_header(len(data))):
            raise _InBand
        self.parts.append(data)

    def _after_header(self, n: int) -> bool:
        if not self.parts:
            return False
        last = self.parts[-1]
        for opcode, length in _HEADERS:
            if n < 1 << (8 * length.size) and last.endswith(opcode + length.pack(n)):
                return True
        return False


class _Pickler(Pickler):
    """A :class:`Pickler` that saves every ``bytes`` and ``bytearray`` of
    :data:`OUT_OF_BAND_MIN` bytes or more as an out-of-band buffer (pickle puts them in
    the stream whatever their size, and never asks ``reducer_override`` about them).

    The hook is ``persistent_id``: it sees every object, so this pickler is slower on
    many small objects and :func:`dumps` uses it only when the fast pass found one.
    """

    def __init__(self, file: Any, buffer_callback: Any, stand_ins: bool = False) -> None:
        super().__init__(file, protocol=PROTOCOL, buffer_callback=buffer_callback)
        self.stand_ins = stand_ins
        self._large: dict[int, tuple[int, Any]] = {}  # id -> (index, object kept alive)

    def persistent_id(self, obj: Any) -> Any:
        kind = type(obj)
        if (kind is bytes or kind is bytearray) and len(obj) >= OUT_OF_BAND_MIN:
            seen = self._large.get(id(obj))
            if seen is not None:
                return seen[0]  # the same object again: loaded once, shared
            self._large[id(obj)] = (len(self._large), obj)
            return (kind is bytearray, pickle.PickleBuffer(obj))
        return None


class _Unpickler(pickle.Unpickler):
    """Loads what :class:`_Pickler` wrote: real ``bytes`` and ``bytearray`` again."""

    def __init__(self, data: Any, buffers: Any) -> None:
        super().__init__(io.BytesIO(data), buffers=buffers)
        self._loaded: list = []

    def persistent_load(self, pid: Any) -> Any:
        if type(pid) is int and 0 <= pid < len(self._loaded):
            return self._loaded[pid]
        if type(pid) is tuple and len(pid) == 2 and type(pid[0]) is bool:
            obj = (bytearray if pid[0] else bytes)(pid[1])
            self._loaded.append(obj)
            return obj
        raise pickle.UnpicklingError(f"unknown persistent id {pid!r}")


def dumps(obj: Any) -> tuple[bytes, list]:
    """Pickle ``obj`` with cloudpickle: ``(pickle, out-of-band buffers)``.

    Buffers are numpy arrays and the like, and ``bytes`` / ``bytearray`` of
    :data:`OUT_OF_BAND_MIN` bytes or more. Most objects hold no large ``bytes``: the
    fast pass pickles them with cloudpickle as it is, and stops at the first large one
    to pickle again with :class:`_Pickler`.
    """
    return _with_stand_ins(lambda pickler: _dumps(obj, pickler))


def _dumps(obj: Any, pickler: type) -> tuple[bytes, list]:
    buffers: list = []
    out = _Parts()
    try:
        pickler(out, protocol=PROTOCOL, buffer_callback=buffers.append).dump(obj)
    except _InBand:
        buffers = []
        file = io.BytesIO()
        _Pickler(file, buffers.append, pickler.stand_ins).dump(obj)
        data = file.getvalue()
    else:
        parts = out.parts
        data = parts[0] if len(parts) == 1 else b"".join(parts)
    return data, [b.raw() for b in buffers]


def plain(obj: Any, depth: int = 2, width: int = 16) -> bool:
    """Whether ``obj`` holds builtin values only: atoms (``None``, ``bool``, ``int``,
    ``float``, ``complex``, ``str``, ``bytes`` under :data:`OUT_OF_BAND_MIN`) and, down to
    ``depth`` levels, tuples, lists and dicts of at most ``width`` of them. Such an
    object pickles the same with the C pickler as with cloudpickle, several times faster."""
    kind = type(obj)
    if kind in _ATOMS:
        return True
    if kind is bytes:
        return len(obj) < OUT_OF_BAND_MIN
    if kind not in _CONTAINERS or depth <= 0 or len(obj) > width:
        return False
    depth -= 1
    atoms = _ATOMS
    if kind is dict:
        for key, value in obj.items():
            if not ((type(key) in atoms or plain(key, depth, width))
                    and (type(value) in atoms or plain(value, depth, width))):
                return False
        return True
    for item in obj:
        if type(item) not in atoms and not plain(item, depth, width):
            return False
    return True


def dumps_quick(obj: Any, depth: int = 2) -> tuple[bytes, list]:
    """:func:`dumps`, with the C pickler when ``obj`` is :func:`plain` (down to ``depth``)."""
    if plain(obj, depth):
        return _pickle_dumps(obj, PROTOCOL), []
    return dumps(obj)


def loads(data: Any, buffers: Any) -> Any:
    """Load what :func:`dumps` returned (``buffers`` may be views of a received frame)."""
    if not buffers:
        return pickle.loads(data)
    return _Unpickler(data, writable(buffers)).load()


def writable(buffers: Iterable[Any]) -> list:
    """Out-of-band buffers that a numpy array loaded from them can be written through, as
    an array the stdlib's pickles carry can: each buffer itself when it is writable, a
    copy of one that is not (a view of a received ``bytes``)."""
    return [buffer if not memoryview(buffer).readonly else bytearray(buffer) for buffer in buffers]
