"""Where a block of shared memory is, as any process of the run can be told, and its view here.

A :class:`Place` travels with the objects that live in shared memory (pickled, as a
Process argument or on a queue). In the process that made the memory it is the arena's
own mapping; in another process of the machine it is mapped through the creator's door
(:mod:`.attach`), unless the ``share_machine`` setting is off or the creator's memory
cannot be handed over (not Linux: :data:`~.arena.SHAREABLE`); elsewhere it cannot be
mapped, and the object is used through its creator's hub.
"""
from __future__ import annotations

import mmap

from ... import config
from .arena import CREATOR_SLOT, SHAREABLE, Block, arena, current
from .attach import attach
from .door import door


class Place:
    """Segment ``segment`` at ``offset`` (``size`` bytes) of the arena with ``cookie``,
    whose creator's door is at ``door_address`` (filled in when it is first pickled)."""

    __slots__ = ("cookie", "segment", "offset", "size", "door_address")

    def __init__(self, cookie: bytes, segment: int, offset: int, size: int,
                 door_address: str | None = None) -> None:
        self.cookie = cookie
        self.segment = segment
        self.offset = offset
        self.size = size
        self.door_address = door_address

    def __reduce__(self):
        address = self.door_address
        if address is None:  # leaving its creator for the first time: open the door
            own = current()
            if own is not None and own.cookie == self.cookie and SHAREABLE:
                address = self.door_address = door(own).address
        return (Place, (self.cookie, self.segment, self.offset, self.size, address))

    def __repr__(self) -> str:
        return f"<Place {self.size} B at {self.segment}:{self.offset} of {self.door_address or 'here'}>"


def allocate(size: int) -> tuple[Block, Place]:
    """A new zeroed block of this process's arena, and its place."""
    own = arena()
    block = own.allocate(size)
    return block, Place(own.cookie, block.segment, block.offset, block.size)


def view(place: Place) -> tuple[mmap.mmap, int] | None:
    """``(buffer, slot)``: the memory holding ``place`` in this process, and this
    process's slot in it; None when it cannot be mapped here."""
    own = current()
    if own is not None and own.cookie == place.cookie:
        buffer = own.segment_map(place.segment)
        return None if buffer is None else (buffer, CREATOR_SLOT)
    if place.door_address is None or not config.get("share_machine"):
        return None
    attachment = attach(place.door_address, place.cookie)
    if attachment is None:
        return None
    buffer = attachment.segment(place.segment)
    return None if buffer is None else (buffer, attachment.slot)
