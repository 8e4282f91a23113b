"""Framing of pickled objects with pickle protocol 5 out-of-band buffers.

A frame is ``u32 n`` + ``n`` x ``u64`` buffer lengths + the pickle + the buffers, so
large ``bytes`` and numpy arrays travel without being copied into the pickle stream.
Envelopes (protocol messages) use the C pickler; user objects are wrapped in a
:class:`Payload`, pickled with cloudpickle by the sender (:func:`dumps`: large
``bytes`` and ``bytearray`` out of band too) and opaque to every hop in between.
When an object cannot be pickled, :func:`name_unpicklable` finds the part to name in
the error (:func:`unpicklable_error`).
"""
from __future__ import annotations

import io
import pickle
import struct
import types
from collections import ChainMap
from typing import Any, Callable, Iterable

import cloudpickle
from pynng import Message
from pynng._nng import ffi, lib

from . import main_globals

_COUNT = struct.Struct("<I")
# high bits of the frame's buffer count: what the sender wants from the server
NO_REPLY = 1 << 31  # a one-way request: the server sends no reply
SYNC = 1 << 30      # answered once every earlier request of the connection is handled
PING = 1 << 29      # answered at once by the server's receiving thread (is it there?)
_FLAGS = NO_REPLY | SYNC | PING
INLINE = 1 << 28    # the frame carries one small Payload after the envelope, as its bytes
_INLINE_HEAD = struct.Struct("<IBBB")  # envelope length, payload's place (2 indexes), raw
_TOP = 255  # second index of a payload that is an item of the envelope itself
INLINE_MAX = 64 * 1024
_LENGTH = struct.Struct("<Q")
PROTOCOL = 5
_PLAIN = frozenset({bytes, str, int, float, bool, type(None)})
_ATOMS = frozenset({str, int, float, bool, complex, type(None)})  # and bytes, when small
_CONTAINERS = frozenset({tuple, list, dict})
OUT_OF_BAND_MIN = 64 * 1024  # smaller payloads are cheaper to copy into the pickle
_new_object = object.__new__
_pickle_dumps = pickle.dumps


class Payload:
    """A user object pickled once by its sender and unpickled only by its receiver."""

    __slots__ = ("data", "buffers")

    def __init__(self, data: Any, buffers: list | tuple = ()) -> None:
        self.data = data
        self.buffers = list(buffers)

    @classmethod
    def pack(cls, obj: Any) -> "Payload":
        """Pickle ``obj`` (functions and classes of ``__main__`` by value)."""
        kind = type(obj)
        if kind in _PLAIN and (kind is not bytes or len(obj) < OUT_OF_BAND_MIN):
            # as cloudpickle would, without its set-up; no __init__ call: this is hot
            payload = _new_object(cls)
            payload.data = _pickle_dumps(obj, PROTOCOL)
            payload.buffers = []
            return payload
        return cls(*dumps(obj))

    @classmethod
    def raw(cls, data: bytes) -> "Payload":
        """Bytes sent as they are (``send_bytes``): marked by a ``None`` buffer list."""
        payload = cls(data)
        payload.buffers = None  # type: ignore[assignment]
        return payload

    @property
    def is_raw(self) -> bool:
        return self.buffers is None

    def unpack(self) -> Any:
        if self.buffers is None:
            return pickle.loads(self.data)
        return loads(self.data, self.buffers)

    def as_bytes(self) -> bytes:
        """The message as one byte string (``recv_bytes`` on a pickled message)."""
        if self.buffers is None:
            return bytes(self.data)
        if not self.buffers:
            return bytes(self.data)
        return pickle.dumps(self.unpack(), protocol=PROTOCOL)

    def owned(self) -> "Payload":
        """This payload with private copies of its out-of-band buffers, which are views
        of the sender's objects (a numpy array, a large bytes): kept for later, it must
        not change when the sender changes them after sending."""
        if not self.buffers:
            return self
        return Payload(self.data, [bytearray(b) for b in self.buffers])

    def nbytes(self) -> int:
        return len(self.data) + sum(memoryview(b).nbytes for b in self.buffers or ())

    def __reduce__(self):
        if self.nbytes() < OUT_OF_BAND_MIN:
            if self.buffers is None:
                return (_rebuild_raw, (bytes(self.data),))
            return (_rebuild, (bytes(self.data), *[bytes(b) for b in self.buffers]))
        if self.buffers is None:
            return (_rebuild_raw, (pickle.PickleBuffer(self.data),))
        return (_rebuild, (pickle.PickleBuffer(self.data),
                           *[pickle.PickleBuffer(b) for b in self.buffers]))


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


def register_reducer(kind: type, reduce: Any) -> None:
    """Pickle instances of ``kind`` with ``reduce(obj)`` (a reduce tuple), in every
    :class:`Pickler` of this process."""
    Pickler.dispatch_table.maps[0][kind] = reduce


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
    return _Unpickler(data, buffers).load()


def _rebuild(data, *buffers) -> Payload:
    return Payload(data, buffers)


def _rebuild_raw(data) -> Payload:
    return Payload.raw(data)


def _inline_place(obj: Any) -> tuple[int, int] | None:
    """Where ``obj`` (an envelope tuple) holds a small :class:`Payload` without buffers:
    ``(i, _TOP)`` for ``obj[i]``, ``(i, j)`` for ``obj[i][j]``; None if it holds none."""
    for i, item in enumerate(obj):
        kind = type(item)
        if kind is Payload:
            return (i, _TOP) if _inlinable(item) else None
        if kind is tuple:
            for j, inner in enumerate(item):
                if type(inner) is Payload:
                    return (i, j) if _inlinable(inner) else None
    return None


def _inlinable(payload: Payload) -> bool:
    return not payload.buffers and len(payload.data) < INLINE_MAX


def _encode_inline(obj: tuple, place: tuple[int, int], flags: int) -> bytes:
    """The envelope pickled without its payload, then the payload's own bytes: loading
    it costs no lookup of a global, and the payload is never pickled twice."""
    i, j = place
    if j == _TOP:
        payload = obj[i]
        head = obj[:i] + (None,) + obj[i + 1:]
    else:
        inner = obj[i]
        payload = inner[j]
        head = obj[:i] + (inner[:j] + (None,) + inner[j + 1:],) + obj[i + 1:]
    envelope = pickle.dumps(head, protocol=PROTOCOL)
    return (_COUNT.pack(flags | INLINE) + _INLINE_HEAD.pack(len(envelope), i, j, payload.buffers is None)
            + envelope + payload.data)


_INLINE_START = _COUNT.size + _INLINE_HEAD.size


def _decode_inline(frame: Any) -> Any:
    size, i, j, raw = _INLINE_HEAD.unpack_from(frame, _COUNT.size)
    end = _INLINE_START + size
    head = pickle.loads(frame[_INLINE_START:end])
    payload = Payload.__new__(Payload)
    payload.data = bytes(frame[end:])
    payload.buffers = None if raw else []
    if j == _TOP:
        return head[:i] + (payload,) + head[i + 1:]
    inner = head[i]
    return head[:i] + (inner[:j] + (payload,) + inner[j + 1:],) + head[i + 1:]


def encode(obj: Any, flags: int = 0) -> bytes | Message:
    """Frame ``obj``: bytes when it has no out-of-band buffers, else an nng message
    assembled with a single copy of every buffer. ``flags``: :data:`NO_REPLY`, :data:`SYNC`, :data:`PING`.

    An envelope (a tuple) carrying a small :class:`Payload` sends it as its bytes
    after the envelope (:data:`INLINE`)."""
    frame = encode_parts(obj, flags)
    return frame if type(frame) is bytes else join_message(frame)


def encode_parts(obj: Any, flags: int = 0) -> bytes | tuple:
    """As :func:`encode`, but a frame with out-of-band buffers is left in its parts (a
    tuple: the header, the pickle, then the buffers, read in place), for a transport
    that sends parts without joining them first."""
    if type(obj) is tuple:
        place = _inline_place(obj)
        if place is not None:
            return _encode_inline(obj, place, flags)
    buffers: list = []
    main = pickle.dumps(obj, protocol=PROTOCOL, buffer_callback=buffers.append)
    if not buffers:
        return _COUNT.pack(flags) + main
    views = [memoryview(b.raw()) for b in buffers]
    head = _COUNT.pack(flags | len(views)) + b"".join(_LENGTH.pack(v.nbytes) for v in views)
    return (head, main, *views)


def join_message(parts: tuple) -> Message:
    """One nng message holding ``parts`` (bytes-like) one after the other: one copy each."""
    views = [memoryview(part).cast("B") for part in parts]
    total = sum(v.nbytes for v in views)
    msg_p = ffi.new("nng_msg **")
    if lib.nng_msg_alloc(msg_p, total) != 0:
        raise MemoryError(f"cannot allocate a message of {total} bytes")
    body = ffi.cast("char *", lib.nng_msg_body(msg_p[0]))
    offset = 0
    for view in views:
        ffi.memmove(body + offset, ffi.from_buffer(view), view.nbytes)
        offset += view.nbytes
    return Message(msg_p[0])


def flags_of(frame) -> int:
    """The :data:`NO_REPLY` / :data:`SYNC` flags of a frame."""
    return _COUNT.unpack_from(frame, 0)[0] & _FLAGS


def decode(frame) -> Any:
    """Load a frame produced by :func:`encode` (``frame`` a bytes-like object;
    out-of-band buffers are views into it)."""
    (count,) = _COUNT.unpack_from(frame, 0)
    if count & INLINE:
        return _decode_inline(frame)
    view = memoryview(frame)
    count &= ~_FLAGS
    if count == 0:
        return pickle.loads(view[4:])
    offset = 4 + 8 * count
    lengths = [_LENGTH.unpack_from(view, 4 + 8 * i)[0] for i in range(count)]
    main_len = len(view) - offset - sum(lengths)
    if main_len < 0:
        raise ValueError("truncated frame")
    main = view[offset:offset + main_len]
    offset += main_len
    buffers = []
    for n in lengths:
        buffers.append(view[offset:offset + n])
        offset += n
    return pickle.loads(main, buffers=buffers)


ZERO_COPY_MIN = 256 * 1024  # from this size a received message is used in place


def frame_from_message(msg: Message):
    """The body of a received message as a bytes-like object.

    Small messages are copied out of nng's memory. A large one that carries
    out-of-band buffers is used in place: the message is taken over from pynng and
    freed when the last view of it (e.g. a received numpy array) is gone; its memory
    is writable, so received arrays are writable, as in multiprocessing.
    """
    size = lib.nng_msg_len(msg._nng_msg)
    body = ffi.cast("char *", lib.nng_msg_body(msg._nng_msg))
    if size >= ZERO_COPY_MIN and ffi.buffer(body, 4)[:] != b"\x00\x00\x00\x00":
        with msg._mem_freed_lock:
            if not msg._mem_freed:
                msg._mem_freed = True  # from now on ours: freed by the gc hook below
                owner = ffi.gc(body, lambda _p, m=msg._nng_msg: lib.nng_msg_free(m))
                return ffi.buffer(owner, size)
    return ffi.buffer(body, size)[:]
