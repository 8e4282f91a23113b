"""The neighbour byte streams of ring reductions, carried as ring messages.

A ring normally moves the bulk bytes of its reductions on direct TCP links
(:mod:`fiberlite.ring.link`). Those are not encrypted, so a run with ``tls`` on has
no links and its members use this instead: the same interface (``send``,
``receive``, ``wait_sent``, ``wait_received``), on top of the members' messages,
which travel on their TLS connections. Every ``send`` becomes one message; receives
cut the stream their own way, as on a link.
"""
from __future__ import annotations

import collections
from typing import Any, Callable

import numpy as np

TAG = ("ring-stream",)


class MessageStream:
    """Bytes to the right neighbour, from the left one, as messages."""

    def __init__(self, post: Callable[[int, Any, Any], None], take: Callable[[int, Any], Any],
                 left: int, right: int) -> None:
        self._post, self._take = post, take
        self.left, self.right = left, right
        self._pending: collections.deque[np.ndarray] = collections.deque()
        self._posted = 0     # receives asked for so far
        self._filled = 0     # receives filled so far
        self._rest = _bytes_of(np.zeros(0, np.uint8))   # the last message's unread part

    def send(self, data: np.ndarray) -> int:
        """Send ``data`` now (it is copied into the message); its ticket."""
        self._post(self.right, TAG, np.ascontiguousarray(data))
        return 0

    def receive(self, into: np.ndarray) -> int:
        """Ask for the next ``into.nbytes`` bytes, into ``into``; its ticket."""
        self._pending.append(_bytes_of(into))
        self._posted += 1
        return self._posted - 1

    def wait_sent(self, ticket: int, deadline: float | None = None) -> None:
        """Sends are complete when :meth:`send` returns."""

    def wait_received(self, ticket: int, deadline: float | None = None) -> None:
        """Fill the receives asked for, in order, up to ``ticket`` (the member's own
        deadline and peer checks apply while it waits for messages)."""
        while self._filled <= ticket:
            view = self._pending.popleft()
            offset = 0
            while offset < len(view):
                if not len(self._rest):
                    self._rest = _bytes_of(np.ascontiguousarray(self._take(self.left, TAG)))
                n = min(len(view) - offset, len(self._rest))
                view[offset:offset + n] = self._rest[:n]
                self._rest = self._rest[n:]
                offset += n
            self._filled += 1


def _bytes_of(array: np.ndarray) -> np.ndarray:
    """A contiguous array's memory as a flat uint8 view (never a copy)."""
    if not array.flags.c_contiguous:
        raise ValueError("ring streams move contiguous arrays only")
    return array.reshape(-1).view(np.uint8)
