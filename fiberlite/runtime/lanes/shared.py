"""How a lane reaches the processes of its machine: its place, and its sockets here.

The creator makes the socket pair and shares both sockets through its door
(:meth:`~fiberlite.runtime.shm.arena.Arena.share`). A :class:`LanePlace` travels with
the object that uses the lane (pickled, as a Process argument or on a queue); a process
of the same machine that unpickles it asks the creator's door for the two descriptors
once (:func:`lane_at`), and keeps the lane while anything here uses it. A process that
cannot reach the door (another machine, another network namespace, ``share_machine``
off) gets None, and uses the object through its creator's hub.
"""
from __future__ import annotations

import threading
import weakref
from typing import Callable

from ... import config
from ...wire import unix
from ..shm.arena import arena, current
from ..shm.attach import attach
from ..shm.door import door
from .lane import Lane, available, new_pair


class LanePlace:
    """The lane whose sockets have ids ``writing`` and ``reading`` in the arena with
    ``cookie``, whose door is at ``door_address`` (filled in when first pickled)."""

    __slots__ = ("cookie", "writing", "reading", "door_address")

    def __init__(self, cookie: bytes, writing: int, reading: int, door_address: str | None = None) -> None:
        self.cookie = cookie
        self.writing = writing
        self.reading = reading
        self.door_address = door_address

    def __reduce__(self):
        address = self.door_address
        if address is None:
            own = current()
            if own is not None and own.cookie == self.cookie:
                address = self.door_address = door(own).address
        return (LanePlace, (self.cookie, self.writing, self.reading, address))

    @property
    def key(self) -> tuple:
        return (self.cookie, self.writing)

    def __repr__(self) -> str:
        return f"<LanePlace {self.writing}/{self.reading} of {self.door_address or 'here'}>"


_lanes: "weakref.WeakValueDictionary[tuple, Lane]" = weakref.WeakValueDictionary()
_lock = threading.Lock()


def enabled() -> bool:
    """Whether objects made here use lanes (Linux, and ``share_machine`` on)."""
    return available() and bool(config.get("share_machine"))


def create() -> tuple[Lane, LanePlace, Callable[[], None]]:
    """A new lane: this process's view, its place, and what forgets it (call it once the
    object that uses it has gone; the processes that hold it keep it until they let go)."""
    writing, reading = new_pair()
    own = arena()
    writing_id, reading_id = own.share(writing.fileno()), own.share(reading.fileno())
    lane = Lane(writing, reading)
    place = LanePlace(own.cookie, writing_id, reading_id)
    _lanes[place.key] = lane

    def forget() -> None:
        own.unshare(writing_id)
        own.unshare(reading_id)
    return lane, place, forget


def lane_at(place: LanePlace) -> Lane | None:
    """The lane at ``place`` in this process (None: not reachable from here)."""
    lane = _lanes.get(place.key)
    if lane is not None:
        return lane
    if place.door_address is None or not config.get("share_machine"):
        return None
    attachment = attach(place.door_address, place.cookie)
    if attachment is None:
        return None
    with _lock:
        lane = _lanes.get(place.key)
        if lane is None:
            fds = attachment.descriptors([place.writing, place.reading])
            if fds is None:
                return None
            lane = Lane(unix.adopt(fds[0]), unix.adopt(fds[1]))
            _lanes[place.key] = lane
    return lane
