"""The owner's half of a link (:class:`Forwarder`): where what is sent to a linked pipe
end or queue goes, with a copy of each item kept until the reading job acknowledges it.
"""
from __future__ import annotations

import collections
import threading
from typing import Any

from ...wire.codec import Payload
from ...wire.link import Link
from ..hub import ObjectRef
from .frames import ACK_COUNT_MASK, ACK_DRAIN_AT, ACK_DRAIN_EVERY, ACK_LIMIT, END
from .reading import Reading

LINKING, LINKED, UNLINKING = "linking", "linked", "unlinking"


class Forwarder:
    """The owner's half of a link: where messages for a linked end go."""

    __slots__ = ("reader_peer", "mailbox", "token", "state", "link", "sent", "reading",
                 "take_lock", "taken", "unacked", "settled", "_settling")

    def __init__(self, reader_peer: int, mailbox: ObjectRef, token: int) -> None:
        self.reader_peer = reader_peer
        self.mailbox = mailbox
        self.token = token
        self.state = LINKING
        self.link: Link | None = None
        self.reading: Reading | None = None  # what the reader sends into the other end
        self.sent = 0
        self.take_lock = threading.Lock()  # held while what the reader sent is taken
        self.taken = False
        # the items forwarded and not yet consumed by the reader, oldest first; of those
        # forwarded, the reader acknowledged `settled` (as of the last settle())
        self.unacked: collections.deque = collections.deque()
        self.settled = 0
        self._settling = threading.Lock()

    def connected(self, link: Link) -> None:
        self.link = link
        self.reading = Reading(link)
        self.state = LINKED

    def settle(self) -> None:
        """Forget the copies of the items the reader acknowledged since the last look."""
        link = self.link
        if link is None:
            return
        with self._settling:
            done = (link.acknowledged() - self.settled) & ACK_COUNT_MASK
            if done:
                self.settled += done
                unacked = self.unacked
                for _ in range(min(done, len(unacked))):
                    unacked.popleft()

    def forward(self, frame: Any, item: Payload | None = None) -> bool:
        """Send a frame to the reader (``item``: the payload it carries, kept until the
        reader consumes it); False if the link is full or gone."""
        if self.link is None:
            return False
        if len(self.unacked) >= ACK_DRAIN_AT and (
                not self.sent % ACK_DRAIN_EVERY or len(self.unacked) >= ACK_LIMIT):
            if self.reading is not None:  # (acknowledgements that come in line)
                self.reading.take_in()
            self.settle()
            if len(self.unacked) >= ACK_LIMIT:
                return False
        if item is not None:  # kept before it goes: its acknowledgement may come at once
            self.unacked.append(item)
        if not self.link.send(frame, timeout_ms=0):
            if item is not None:
                self.unacked.pop()
            return False
        self.sent += 1
        return True

    def ask_back(self) -> None:
        """Ask the reader for what it has not consumed (answered by ``relinquish``)."""
        self.mailbox.cast("unlink", self.token, self.sent)

    def take_sent(self, until_end: bool) -> list:
        """Stop reading what the reader sent and take it all: up to its :data:`END`
        (``until_end``), or what arrives until its connection is gone. The caller holds
        :attr:`take_lock`, and hands the items over before releasing it."""
        self.taken = True
        if self.reading is None:
            return []  # never linked
        self.reading.stop()
        try:
            return self.reading.drain(until=END if until_end else None)
        finally:
            self.reading.lock.release()

    def close(self) -> None:
        if self.link is not None:
            self.link.close()
