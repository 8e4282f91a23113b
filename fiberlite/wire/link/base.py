"""What every link shares: its interface (:class:`Link`), its errors, its acknowledgements."""
from __future__ import annotations

import threading
from typing import Any, Callable, Protocol

from .. import threads

# what a reader sends (nng) or counts (local) for each item it consumed: the writer keeps
# a copy of each item until then
ACK = b"\x07"


class LinkError(Exception):
    """Base of the errors of a link."""


class LinkTimeout(LinkError):
    """Nothing arrived within the time the receiver gave."""


class LinkCanceled(LinkError):
    """Another thread woke the receiver (:meth:`Link.cancel`)."""


class LinkClosed(LinkError, ConnectionError):
    """The link is closed here, or its connection ended and everything that had arrived was read."""


class Link(Protocol):
    """One end of a link, used by one receiving and one sending thread at a time."""

    address: str
    lost: bool  # the peer's connection ended (what had arrived may still be read)
    acks_in_line: bool  # acknowledgements travel as frames (sent one thread at a time)

    def accept(self, key: bytes) -> bool:
        """(the listening end) Wait for the first peer to prove ``key``: whether it did."""

    def send(self, frame: Any, timeout_ms: int = 0) -> bool:
        """Send ``frame``, waiting up to ``timeout_ms`` for room (0: not at all, -1: for
        ever): False if it did not go (the link is full or gone)."""

    def recv(self, timeout_ms: int = -1) -> Any:
        """The next frame (a bytes-like object), waiting up to ``timeout_ms`` (-1: for ever)."""

    def recv_nowait(self) -> Any:
        """The next frame if one has arrived, else None."""

    def acknowledge(self, timeout_ms: int = 0) -> bool:
        """Tell the peer that one more of the frames it sent is consumed (False: not done,
        the link is full or gone)."""

    def acknowledged(self) -> int:
        """How many frames the peer acknowledged so far (those it sent in the frames this
        end has read, for a transport that carries them in line)."""

    def cancel(self) -> None:
        """Wake a thread blocked in :meth:`recv` (:class:`LinkCanceled`)."""

    def on_lost(self, callback: Callable[[], None]) -> None:
        """Call ``callback`` (on a thread of its own) once the peer's connection ends."""

    def close(self) -> None:
        """Close this end: a receive or send under way on another thread fails at once."""


class LossCallbacks:
    """:meth:`Link.on_lost` for a link whose :attr:`lost` and callbacks are kept under its
    ``_lock``: the link sets ``lost`` and takes the callbacks under that lock, then hands
    them to :meth:`_call_lost`."""

    lost: bool
    _closed: bool
    _lock: threading.Lock
    _lost_callbacks: list

    def on_lost(self, callback: Callable[[], None]) -> None:
        """Call ``callback`` (on a thread of its own) once the peer's connection ends."""
        with self._lock:
            if not self.lost:
                self._lost_callbacks.append(callback)
                return
        callback()

    def _mark_closed(self) -> bool:
        """Closed here: lost, and no callback is called any more. False if it was already."""
        with self._lock:
            if self._closed:
                return False
            self._closed = True
            self.lost = True
            self._lost_callbacks = []
        return True

    @staticmethod
    def _call_lost(callbacks: list) -> None:
        """Run ``callbacks`` on a thread of their own (never on a thread the transport owns)."""
        if callbacks:
            threads.start(lambda: [cb() for cb in callbacks], name="fiberlite-link-lost")
