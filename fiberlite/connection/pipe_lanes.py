"""A pipe's ends on a machine that shares lanes: each end reads a lane of its own.

On the creator's machine (:mod:`fiberlite.runtime.lanes`), what end ``e`` reads is lane
``e``: every holder of the other end writes into it, every holder of ``e`` reads it,
straight through the kernel, so a send that returned is ahead of every later send, in
any process of the machine (as with ``multiprocessing``'s one OS pipe). When nobody holds
an end any more its creator ends the lanes: the other end reads what is left, then
``EOFError``, and sends to the gone end raise ``BrokenPipeError``.

:class:`LaneOps` is the pipe servant's part for the processes that cannot reach the
lanes (another machine): it sends, receives, polls and watches for them, each wait on a
thread of the hub (:class:`~fiberlite.runtime.shm.remote.Waits`).
"""
from __future__ import annotations

import collections
import itertools
from typing import Any

from ..runtime import direct
from ..runtime.hub import ObjectRef
from ..runtime.lanes.feeder import Feeder
from ..runtime.lanes.lane import Lane
from ..runtime.lanes.shared import lane_at
from ..runtime.links.frames import EOF
from ..runtime.shm.remote import NOT_YET, Waits
from ..wire.codec import Payload
from .readiness import _tell_ready


class LaneOps:
    """The lanes of a pipe (``lanes[e]``: what end ``e`` reads; None for the second end of
    a one-way pipe) and the calls of processes that cannot reach them."""

    lanes: tuple | None = None
    places: tuple | None = None
    _lane_waits: Waits | None = None
    _feeders: dict | None = None  # end -> what other machines sent to it that waits for room

    @property
    def lane_waits(self) -> Waits:
        if self._lane_waits is None:
            self._lane_waits = Waits()
            self._lane_calls = itertools.count()
        return self._lane_waits

    def end_lanes(self, end: int) -> None:
        """Nobody holds ``end``: the other end reads EOF once it read what is left, and
        what is sent to ``end`` breaks."""
        mine, other = self.lanes[end], self.lanes[1 - end]
        if other is not None:
            other.end_writing()
        if mine is not None:
            mine.end_reading()

    _fronts: dict | None = None  # end -> what reads that were withdrawn took, to read first

    def _wait(self, request: Any, attempt: Any, timeout: float | None, timed_out: Any, key: Any = None,
              undo: Any = None) -> None:
        waits = self.lane_waits
        waits.start(request, key if key is not None else ("call", next(self._lane_calls)),
                    attempt, timeout, timed_out, undo=undo)

    def _front(self, end: int) -> collections.deque:
        """What reads of ``end`` by other machines took and were withdrawn before they
        could hand it over: read before the lane, by those readers."""
        if self._fronts is None:
            self._fronts = {}
        return self._fronts.setdefault(end, collections.deque())

    def op_lane_send_many(self, request, end: int, payloads: list) -> None:
        """Sends of another machine's process: into the lane now, or after what waits for
        room already (in the order they came)."""
        if self._feeders is None:
            self._feeders = {}
        feeder = self._feeders.get(end)
        if feeder is None:
            feeder = self._feeders[end] = Feeder(self.lanes[1 - end])
        for payload in payloads:
            feeder.send(payload)
        request.reply()

    def op_lane_receive(self, request, end: int, block: bool = True, timeout: float | None = None,
                        call: int | None = None) -> None:
        """The next message of ``end`` for a process of another machine; ``call``: the
        reader's number for it, by which it withdraws it (:meth:`op_lane_withdraw`)."""
        lane, front = self.lanes[end], self._front(end)

        def attempt(seconds: float | None) -> Any:
            if front:
                try:
                    return front.popleft()
                except IndexError:  # (another read took it)
                    pass
            payload = lane.receive(seconds)
            if payload is EOF:
                raise EOFError
            return NOT_YET if payload is None else payload
        if not block:
            payload = front.popleft() if front else lane.receive(0.0)
            if payload is EOF:
                request.fail(EOFError())
            else:
                request.reply(payload)  # None: nothing there
            return
        self._wait(request, attempt, timeout, None, key=None if call is None else ("read", request.peer, call),
                   undo=front.appendleft)

    def op_lane_poll(self, request, end: int, timeout: float | None, call: int | None = None) -> None:
        lane, front = self.lanes[end], self._front(end)
        if front or lane.poll(0) or timeout is not None and timeout <= 0:
            request.reply(bool(front) or lane.poll(0))
            return
        self._wait(request, lambda seconds: True if front or lane.poll(seconds) else NOT_YET, timeout, False,
                   key=None if call is None else ("read", request.peer, call))

    def op_lane_withdraw(self, request, end: int, call: int) -> None:
        """The reader's receive or poll ``call`` was interrupted (Ctrl-C): it is not
        answered (what it takes after this is read first by the next); answered at once."""
        self.lane_waits.cancel(("read", request.peer, call), then=request.reply, prompt=True)

    def watch_lane(self, request, end: int, token: tuple, readiness: ObjectRef) -> None:
        """Tell ``readiness`` once lane ``end`` has something to read (or is at EOF)."""
        lane = self.lanes[end]
        if lane is None or lane.poll(0):
            request.reply(lane is not None)
            return
        request.reply(False)

        class _Told:  # the watch's answer goes to the readiness mailbox, not to the caller
            peer = request.peer

            @staticmethod
            def reply(_: Any = None) -> None:
                _tell_ready(readiness, token)

            @staticmethod
            def fail(_: Any) -> None:
                pass
        self._wait(_Told, lambda seconds: True if lane.poll(seconds) else NOT_YET, None, None,
                   key=("watch", end, token))


_calls = itertools.count(1)  # this process's reads through a hub, by which one is withdrawn


class ReadsThroughHub:
    """The reads of a pipe's end by a process that cannot reach its lane (another
    machine): calls to the pipe's hub, each withdrawn when Ctrl-C interrupts it; a message
    that came before its withdrawal is kept here, for the next read."""

    def __init__(self, ref: ObjectRef, end: int) -> None:
        self.ref = ref
        self.end = end
        self.kept: collections.deque = collections.deque()

    def receive(self) -> Payload:
        if self.kept:
            try:
                return self.kept.popleft()
            except IndexError:  # (another thread of this process took it)
                pass
        call = next(_calls)
        return direct.call(self.ref, "lane_receive", self.end, True, None, call, interruptible=True,
                           interrupted=("lane_withdraw", self.end, call), kept=self._keep)

    def poll(self, timeout: float | None) -> bool:
        if self.kept:
            return True
        call = next(_calls)
        return direct.call(self.ref, "lane_poll", self.end, timeout, call, interruptible=True,
                           interrupted=("lane_withdraw", self.end, call))

    def _keep(self, ok: bool, answer: Any) -> None:
        if ok and isinstance(answer, Payload):
            self.kept.append(answer)


def lanes_here(places: tuple | None, end: int, readable: bool, writable: bool) -> tuple[Lane | None, Lane | None] | None:
    """``(read, write)``: the lanes end ``end`` uses in this process; None when this
    process cannot reach them (it goes through the pipe's hub)."""
    if places is None:
        return None
    read = lane_at(places[end]) if readable else None
    write = lane_at(places[1 - end]) if writable else None
    if (readable and read is None) or (writable and write is None):
        return None
    return read, write
