"""Framing of pickled objects with pickle protocol 5 out-of-band buffers.

A frame is ``u32 n`` + ``n`` x ``u64`` buffer lengths + the pickle + the buffers, so
large ``bytes`` and numpy arrays travel without being copied into the pickle stream.
Envelopes (protocol messages) use the C pickler; user objects are wrapped in a
:class:`Payload`, pickled with cloudpickle by the sender (:func:`~.pickling.dumps`:
large ``bytes`` and ``bytearray`` out of band too) and opaque to every hop in between.
"""
from __future__ import annotations

import pickle
import struct
from typing import Any

from pynng import Message
from pynng._nng import ffi, lib

# what pickles user objects, re-exported: the modules that frame them import it from here
from .pickling import (OUT_OF_BAND_MIN, PROTOCOL, Pickler, dumps, dumps_bytes,  # noqa: F401
                       dumps_quick, loads, name_unpicklable, plain, register_reducer, short_repr,
                       unpicklable_error, writable)

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
_PLAIN = frozenset({bytes, str, int, float, bool, type(None)})
_PLAIN_CONTAINERS = frozenset({tuple, list, dict})  # when plain(): the C pickler too
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
        if (kind in _PLAIN and (kind is not bytes or len(obj) < OUT_OF_BAND_MIN)) or \
                (kind in _PLAIN_CONTAINERS and plain(obj)):
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
    return pickle.loads(main, buffers=writable(buffers))


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
