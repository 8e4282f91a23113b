"""A member's inbox: the :class:`RingMember` servant that receives its messages.

Peers deliver to it (``ref.cast("deliver", src, tag, obj)``, sent by
:class:`~fiberlite.ring.member.Member`) and say farewell when their target ends; the
parent (:mod:`.parent`) calls ``abort`` on it when the ring breaks. The member takes
messages by ``(src, tag)`` and learns here which peers are lost and whether the ring
is broken.
"""
from __future__ import annotations

import collections
import threading
import time
from typing import Any, Callable

from .. import config
from ..errors import RingError
from ..runtime.hub import LOCAL_PEER, Servant
from ..wire import liveness
from .errors import RingTimeoutError


class RingMember(Servant):
    """A member's inbox: messages by ``(src, tag)``, plus what it knows of lost peers."""

    def __init__(self) -> None:
        self._cond = threading.Condition(threading.Lock())
        self._boxes: dict[tuple, collections.deque] = {}
        self._rank_of_peer: dict[int, int] = {}
        self._silent: set[int] = set()  # peers whose connection is given up as silent
        self.lost: dict[int, RingError] = {}   # rank -> why it cannot be heard from again
        self.error: RingError | None = None
        self.on_fail: Callable[[], None] | None = None   # also told when the ring is aborted

    def op_deliver(self, request: Any, src: int, tag: Any, obj: Any) -> None:
        key = (src, tag)
        with self._cond:
            box = self._boxes.get(key)
            if box is None:
                box = self._boxes[key] = collections.deque()
            box.append(obj)
            if request.peer != LOCAL_PEER:
                self._rank_of_peer[request.peer] = src
            self._cond.notify_all()
        request.reply()

    def op_abort(self, request: Any, message: str, rank: int | None, exitcode: int | None) -> None:
        self.fail(RingError(message, rank, exitcode))
        request.reply()

    def op_farewell(self, request: Any, src: int, why: str, culprit: int | None) -> None:
        """``src`` ended its target; ``culprit`` is the rank whose failure made it stop."""
        if culprit is None or culprit == src:
            self.mark_lost(src, RingError(f"rank {src} left the ring ({why})", src))
        else:  # it stopped because of another rank: pass that story on
            self.mark_lost(src, RingError(why, culprit))
        request.reply()

    def peer_silent(self, peer: int) -> None:
        self._silent.add(peer)

    def peer_lost(self, peer: int) -> None:
        rank = self._rank_of_peer.pop(peer, None)
        silent = peer in self._silent
        self._silent.discard(peer)
        if rank is not None:  # (a rank cut off: said as its parent says it)
            why = liveness.silence(config.get("peer_timeout")) if silent else "connection lost"
            self.mark_lost(rank, RingError(f"rank {rank} left the ring ({why})", rank))

    def mark_lost(self, rank: int, error: RingError) -> None:
        with self._cond:
            self.lost.setdefault(rank, error)
            self._cond.notify_all()

    def fail(self, error: RingError) -> None:
        with self._cond:
            if self.error is None:
                self.error = error
            self._cond.notify_all()
        if self.on_fail is not None:
            self.on_fail()

    def await_story(self, rank: int, seconds: float) -> None:
        """Wait up to ``seconds`` to learn why ``rank`` cannot be heard from (or that the
        ring broke): its farewell, the parent's abort, or its hub connection's end."""
        deadline = time.monotonic() + seconds
        with self._cond:
            while self.error is None and rank not in self.lost:
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    return
                self._cond.wait(remaining)

    def check(self, rank: int) -> None:
        """Raise if the ring is broken or ``rank`` is known to have left."""
        error = self.error
        if error is not None:
            raise RingError(str(error), error.rank, error.exitcode)
        lost = self.lost.get(rank)
        if lost is not None:
            raise RingError(str(lost), lost.rank)

    def take(self, src: int, tag: Any, deadline: float | None, on_timeout: Callable[[int], str]) -> Any:
        """The next message from ``src`` with ``tag``; waits until ``deadline``."""
        key = (src, tag)
        with self._cond:
            while True:
                box = self._boxes.get(key)
                if box:
                    obj = box.popleft()
                    if not box:
                        del self._boxes[key]
                    return obj
                self.check(src)
                if deadline is None:
                    self._cond.wait()
                    continue
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    raise RingTimeoutError(on_timeout(src))
                self._cond.wait(remaining)
