"""In a channel's owner: asking the jobs that hold batches of its items (lent to their
gets, :meth:`~.channel.Channel.get` with ``most``) to give back what they have not taken,
when another read waits for them.

A job's get takes what is there, up to what it keeps up with, and holds the rest for its
next gets. ``multiprocessing``'s get returns the oldest item, one at a time: once a
reader stops reading, the items behind its last one are the others'. So a read waits
for the items other jobs hold (older than any in the channel: their next gets would
have taken them first) rather than pass them (:meth:`~.channel.Channel.held_elsewhere`),
and each such holder is asked, once until its next batch, to give back what it has not
taken (:class:`~fiberlite.runtime.lanes.lending.Recall`); a reader stopped at its share
of stop markers then leaves no item behind. A holder that has gone gives everything back
with its connection's end.
"""
from __future__ import annotations

from typing import Any, Callable

from .channel import Channel


class Recalls:
    """The holders of one channel's batches: where to ask each, and whom it asked."""

    def __init__(self, channel: Channel) -> None:
        self._channel = channel
        self._at: dict[int, Any] = {}  # peer -> the ref its recall goes to
        self._asked: set[int] = set()  # peers asked since their last batch

    def lending(self, peer: int, recall: Any) -> None:
        """``peer`` asks for a batch; ``recall``: its ref for the request (the lock is held)."""
        self._at[peer] = recall
        self._asked.discard(peer)

    def check(self) -> list[Callable[[], None]]:
        """Actions that ask the holders a waiting read waits for (the lock is held)."""
        channel = self._channel
        if not channel.batched or not channel.getters:
            return []
        holders = [peer for peer in channel.held_elsewhere() if peer not in self._asked]
        self._asked.update(holders)
        return [lambda ref=self._at[peer]: _ask(ref) for peer in holders if peer in self._at]

    def forget(self, peer: int) -> None:
        """``peer`` has gone (what it held is back already; the lock is held)."""
        self._at.pop(peer, None)
        self._asked.discard(peer)


def _ask(ref: Any) -> None:
    try:
        ref.cast("recall")
    except Exception:  # its process has gone: its connection's end gives the items back
        pass
