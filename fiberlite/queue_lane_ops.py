"""What a queue's creator does on its lane for the processes that cannot reach it
(another machine, ``share_machine`` off): the ``lane_*`` calls of its servant.

Puts of an unbounded queue come in batches and never wait; gets take what is in the
lane, several items per call, lent until the reader confirms them
(:mod:`fiberlite.runtime.lanes.lending`); a call that has to wait waits on a thread of
the hub's (:class:`~fiberlite.runtime.shm.remote.Waits`).
"""
from __future__ import annotations

import itertools
import queue
from typing import Any

from .queue_lane import QueueLane
from .runtime.lanes.lending import SLOT, Front, Lending
from .runtime.shm.remote import NOT_YET, Waits
from .wire.codec import Payload


class LaneOps:
    """The ``lane_*`` operations of a queue's servant whose queue has a lane (a mixin:
    the servant calls :meth:`_use_lane` first, and :meth:`_lane_peer_lost`)."""

    lane: QueueLane | None = None

    def _use_lane(self, lane: QueueLane) -> None:
        self.lane = lane
        self.waits = Waits()
        self._calls = itertools.count()
        self.front = Front(lane.state.add_front)
        lane.take_front = self.front.take
        self.lending = Lending(self.front.add, lane.consumed, lane.state.end_batch)
        self._readers: set[int] = set()  # the jobs that got through this hub (in READERS)

    def op_lane_put(self, request, payload: Payload, block: bool = True, timeout: float | None = None) -> None:
        if not self.lane.state.maxsize:  # never waits
            self.lane.put(payload)
            request.reply()
            return
        self._wait(request, lambda seconds: self.lane.put(payload, True, seconds), timeout, queue.Full(),
                   catch=queue.Full, block=block)

    def op_lane_get_many(self, request, most: int, block: bool = True, timeout: float | None = None,
                         call: int | None = None) -> None:
        """Up to ``most`` items, lent to the reader: those there now (answered on this
        thread), or the first to come and those behind it. Several only while the reader
        is the queue's one reader (:meth:`QueueState.begin_batch`); a reader waits while
        another holds a batch, since its items come first. ``call``: the reader's number
        for it, by which it withdraws it (:meth:`op_lane_withdraw`)."""
        peer, most = request.peer, max(1, min(int(most), 4096))
        if peer not in self._readers:
            self._readers.add(peer)
            self.lane.state.reader_joins()
        if self.lane.state.wait_unheld(0.0, lambda: self.lending.held_by(peer)):
            there = self._lend(peer, most, 0.0)
            if there is not None:
                request.reply(there)
                return

        def take(seconds: float | None) -> Any:
            if not self.lane.state.wait_unheld(seconds, lambda: self.lending.held_by(peer)):
                raise queue.Empty
            got = self._lend(peer, most, seconds)
            if got is None:
                raise queue.Empty
            return got
        self._wait(request, take, timeout, queue.Empty(), catch=queue.Empty, block=block,
                   undo=self.lending.undo, key=None if call is None else ("get", peer, call))

    def op_lane_withdraw(self, request, call: int) -> None:
        """The reader's get ``call`` was interrupted (Ctrl-C): it is not answered, and what
        it took goes back; answered once that is done."""
        self.waits.cancel(("get", request.peer, call), then=request.reply, prompt=True)

    def _lend(self, peer: int, most: int, wait: float | None) -> tuple[int, list] | None:
        """A batch for ``peer``: the first item within ``wait`` seconds, then those there
        (None: no item came)."""
        state = self.lane.state
        size = state.begin_batch(most)
        got = self.lane.lend(size, wait)
        if size > 1 and len(got) <= 1:
            state.end_batch()  # (not held: the get returns its one item)
        if not got:
            return None
        return self.lending.lend(peer, got, held=size > 1)

    def op_lane_give_back(self, request, tickets: list) -> None:
        """A reader gives back what it holds of batches ``tickets`` and did not take."""
        self.lending.give_back(tickets)
        request.reply()

    def op_lane_front(self, request, most: int) -> None:
        """Up to ``most`` items given back ahead of the lane, for a reader of this machine."""
        request.reply(self.front.take(max(0, int(most))))

    def op_received(self, request, slot: Any, ticket: Any) -> None:
        if slot == SLOT:
            self.lending.confirm(ticket)
        else:
            super().op_received(request, slot, ticket)  # type: ignore[misc]

    def op_lane_put_many(self, request, payloads: list) -> None:
        """Puts of a process of another machine (an unbounded queue's), in their order."""
        for payload in payloads:
            self.lane.put(payload)
        request.reply()

    def op_lane_feed(self, request, payloads: list) -> None:
        """What a job that left had put, counted but not yet in the lane."""
        for payload in payloads:
            self.lane.send(payload)
        request.reply()

    def op_lane_qsize(self, request) -> None:
        request.reply(self.lane.state.qsize())

    def op_lane_empty(self, request) -> None:
        request.reply(self.lane.empty())

    def op_lane_task_done(self, request) -> None:
        self.lane.state.task_done()
        request.reply()

    def op_lane_join(self, request) -> None:
        self._wait(request, lambda seconds: self.lane.state.join(seconds) or NOT_YET, None, None)

    def _wait(self, request, attempt, timeout, timed_out, catch=(), block=True, undo=None, key=None) -> None:
        def attempt_once(seconds):
            try:
                result = attempt(seconds if block else 0.0)
            except catch:
                return NOT_YET if block else timed_out
            return NOT_YET if result is NOT_YET else (True if result is None else result)
        if not block:
            request.reply(attempt_once(0.0))
            return
        self.waits.start(request, (request.peer, next(self._calls)) if key is None else key,
                         attempt_once, timeout, timed_out, undo=undo)

    def _lane_peer_lost(self, peer: int) -> None:
        """The job ``peer`` has gone: its waiting calls are withdrawn, what it was lent
        and did not consume goes back into the lane."""
        self.waits.cancel_peer(peer)
        self.lending.peer_lost(peer)
        if peer in self._readers:
            self._readers.discard(peer)
            self.lane.state.reader_leaves()
