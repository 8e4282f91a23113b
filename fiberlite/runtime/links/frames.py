"""What travels on a pipe's or queue's link: one kind byte, then the payload's own bytes.

The owner forwards items (:func:`item_frame`) and, once the pipe end's writers are gone,
:data:`EOF_FRAME`; the reading job acknowledges each item it consumes (the link's own
:meth:`~fiberlite.wire.link.Link.acknowledge`) and ends what it sends with
:data:`END_FRAME` when it unlinks.
:func:`read_frame` turns a received frame back into a :class:`~fiberlite.wire.codec.Payload`
or a marker.
"""
from __future__ import annotations

from typing import Any

from ...wire import codec
from ...wire.codec import Payload
from ...wire.link.nng import WRITER_RECEIVE_AHEAD

_PICKLED, _RAW, _FRAMED, _EOF, _END = b"\x01", b"\x02", b"\x03", b"\x04", b"\x05"
PICKLED_KIND = _PICKLED  # the first byte of a frame that is a pickle alone (no out-of-band buffer)
READY_FRAME = b"\x06"  # the owner's first frame: the link is in use (not counted as sent)
# (b"\x07" is the link's own acknowledgement, fiberlite.wire.link.ACK)
EOF_FRAME = _EOF
END_FRAME = _END  # the reader's last frame: it sends through the hub from now on
ACK_DRAIN_AT = 256  # unacknowledged items after which the owner takes in the acks that arrived,
ACK_DRAIN_EVERY = 64  # every this many items forwarded
# at most this many items unacknowledged (then the link counts as full): their acks always
# fit in what the owner's end takes in (nng's receive queue; a local link's socket buffer
# holds more), so none waits on the way
ACK_LIMIT = WRITER_RECEIVE_AHEAD - 64
ACK_COUNT_MASK = 0xFFFFFFFF  # acknowledgement counts are compared modulo 2**32
_IN_PLACE = 64 * 1024  # a larger received frame's payload is a view of it, not a copy


def item_frame(payload: Payload) -> Any:
    """The frame that carries ``payload`` over a link (bytes, or a tuple of parts: the
    payload's out-of-band buffers are not copied into one message here)."""
    if payload.buffers is None or not payload.buffers:
        kind = _RAW if payload.buffers is None else _PICKLED
        data = payload.data
        return kind + data if type(data) is bytes else (kind, data)
    frame = codec.encode_parts((payload,))
    if type(frame) is bytes:
        return _FRAMED + frame
    return (_FRAMED + frame[0], *frame[1:])


class _Marker:
    __slots__ = ("name",)

    def __init__(self, name: str) -> None:
        self.name = name

    def __repr__(self) -> str:
        return f"<link {self.name}>"


EOF = _Marker("EOF")  # the writers of the end are gone (sticky: every later read sees it)
END = _Marker("END")
RETRY = _Marker("RETRY")  # to a read in the owner: read the link made since you looked for one


def is_marker(item: Any) -> bool:
    return isinstance(item, _Marker)


def read_frame(frame: Any) -> Any:
    """The :class:`Payload` (or :data:`EOF`, :data:`END`) a link frame carries."""
    kind = frame[:1]
    if kind == _PICKLED or kind == _RAW:
        payload = Payload.__new__(Payload)
        payload.data = frame[1:] if len(frame) < _IN_PLACE else memoryview(frame)[1:]
        payload.buffers = [] if kind == _PICKLED else None
        return payload
    if kind == _FRAMED:
        return codec.decode(memoryview(frame)[1:])[0]
    if kind == _EOF:
        return EOF
    if kind == _END:
        return END
    raise ValueError(f"unknown link frame kind {bytes(kind)!r}")


class Unlinked(Exception):
    """The link is ending or has ended: read and send through the pipe's hub."""
