"""A FIFO of payloads with blocked getters and putters: the state behind Queue and Pipe.

A :class:`Channel` lives in the hub of the process that created it. Its methods run
under the owning servant's lock and never block: a request that has to wait is kept
and answered later, and the answers are returned as *actions* that the servant runs
after releasing its lock (sending a reply may take time).

An item a job gets through the hub is *lent* to that job's connection: the reply is
``(ticket, item)``, and the job's receipt for the ticket (:meth:`Channel.confirm`) goes
with its next request to this process, or on its own shortly after its read returned
(:func:`~fiberlite.runtime.links.reader.got_through_hub`). Items still lent when the job's
connection ends go back to the front of the channel, in their order
(:meth:`Channel.drop_peer`).
"""
from __future__ import annotations

import collections
import itertools
import queue
from typing import Any, Callable

from ..hub import LOCAL_PEER

Action = Callable[[], None]
_tickets = itertools.count(1)  # (next() on it is atomic)


class Waiter:
    """A request waiting in a channel, with its optional deadline timer."""

    __slots__ = ("request", "payload", "peek", "timer", "done")

    def __init__(self, request: Any, payload: Any = None, peek: bool = False) -> None:
        self.request = request
        self.payload = payload
        self.peek = peek
        self.timer = None
        self.done = False

    def finish(self) -> None:
        self.done = True
        if self.timer is not None:
            self.timer.cancel()


class Channel:
    """FIFO with optional bound; EOF once ``writers_gone`` is set and it is empty."""

    def __init__(self, maxsize: int = 0) -> None:
        self.items: collections.deque = collections.deque()
        self.maxsize = maxsize
        self.getters: collections.deque[Waiter] = collections.deque()
        self.putters: collections.deque[Waiter] = collections.deque()
        self.writers_gone = False
        self.readers_gone = False
        self.held = False  # getters wait even if there are items (a link hands items back)
        self.enqueued = 0  # items that ever entered the channel (JoinableQueue counts these)
        self.lent: dict[int, dict[int, Any]] = {}  # peer -> {ticket: item} not yet confirmed

    def full(self) -> bool:
        return 0 < self.maxsize <= len(self.items)

    # each method returns the actions to run once the lock is released
    def put(self, request: Any, payload: Any, block: bool, timeout: float | None,
            schedule: Callable) -> list[Action]:
        if self.readers_gone:
            return [lambda: request.fail(BrokenPipeError(32, "the other end of the pipe is closed"))]
        actions: list[Action] = []
        if not self.full():
            self.items.append(payload)
            self.enqueued += 1
            actions.append(request.reply)
            self._serve_getters(actions)
        elif not block or (timeout is not None and timeout <= 0):
            actions.append(lambda: request.fail(queue.Full()))
        else:
            waiter = Waiter(request, payload)
            self.putters.append(waiter)
            if timeout is not None:
                waiter.timer = schedule(timeout, waiter, self.putters, queue.Full)
        return actions

    def get(self, request: Any, block: bool, timeout: float | None, schedule: Callable,
            peek: bool = False) -> list[Action]:
        actions: list[Action] = []
        if (self.items or self.writers_gone) and not self.held:
            self.getters.append(Waiter(request, peek=peek))
            self._serve_getters(actions)
            return actions
        if not block or (timeout is not None and timeout <= 0):
            actions.append((lambda: request.reply(False)) if peek else (lambda: request.fail(queue.Empty())))
            return actions
        waiter = Waiter(request, peek=peek)
        self.getters.append(waiter)
        if timeout is not None:
            waiter.timer = schedule(timeout, waiter, self.getters, None if peek else queue.Empty)
        return actions

    def extend(self, items: list) -> list[Action]:
        """Add ``items`` (sent earlier, over a link) as if they were put now."""
        if self.readers_gone:
            return []
        self.items.extend(items)
        self.enqueued += len(items)
        actions: list[Action] = []
        self._serve_getters(actions)
        return actions

    def release(self, items: list) -> list[Action]:
        """End :attr:`held`: ``items`` (handed back) go first, then waiting getters are served."""
        self.held = False
        return self._put_back(items)

    def release_one(self, item: Any) -> list[Action]:
        """Put ``item`` (lent, and handed back unread) back at the front."""
        return self._put_back([item])

    def _put_back(self, items: list) -> list[Action]:
        self.items.extendleft(reversed(items))
        actions: list[Action] = []
        self._serve_getters(actions)
        return actions

    def confirm(self, peer: int, ticket: int) -> None:
        """The job ``peer`` got the item lent to it with ``ticket``: it is no longer ours."""
        lent = self.lent.get(peer)
        if lent is not None:
            lent.pop(ticket, None)
            if not lent:
                del self.lent[peer]

    def _serve_getters(self, actions: list[Action]) -> None:
        if self.held:
            return
        while self.getters and (self.items or self.writers_gone):
            waiter = self.getters.popleft()
            if waiter.done:
                continue
            waiter.finish()
            request = waiter.request
            if waiter.peek:
                actions.append(lambda r=request: r.reply(True))
            elif self.items:
                payload = self.items.popleft()
                if request.peer != LOCAL_PEER:  # lent until the job's receipt comes
                    ticket = next(_tickets)
                    self.lent.setdefault(request.peer, {})[ticket] = payload
                    actions.append(lambda r=request, p=(ticket, payload): r.reply(p))
                else:
                    actions.append(lambda r=request, p=payload: r.reply(p))
                self._admit_putter(actions)
            else:
                actions.append(lambda r=request: r.fail(EOFError()))

    def _admit_putter(self, actions: list[Action]) -> None:
        while self.putters and not self.full():
            waiter = self.putters.popleft()
            if waiter.done:
                continue
            waiter.finish()
            self.items.append(waiter.payload)
            self.enqueued += 1
            actions.append(waiter.request.reply)

    def close_writers(self) -> list[Action]:
        """No writer is left: readers get what remains, then EOF."""
        self.writers_gone = True
        actions: list[Action] = []
        self._serve_getters(actions)
        return actions

    def close_readers(self) -> list[Action]:
        """No reader is left: blocked and later writers get BrokenPipeError."""
        self.readers_gone = True
        actions: list[Action] = []
        while self.putters:
            waiter = self.putters.popleft()
            if not waiter.done:
                waiter.finish()
                actions.append(lambda r=waiter.request: r.fail(BrokenPipeError(32, "the other end of the pipe is closed")))
        return actions

    def take_getters(self, which: Callable[[Any], bool]) -> list:
        """Remove the waiting getters whose request ``which`` accepts; their requests."""
        taken = [w for w in self.getters if not w.done and which(w.request)]
        for waiter in taken:
            waiter.finish()
            self.getters.remove(waiter)
        return [w.request for w in taken]

    def drop_peer(self, peer: int) -> list[Action]:
        """Forget the waiting requests of a peer whose connection ended; what was lent to
        it goes back to the front, for the next readers."""
        for waiters in (self.getters, self.putters):
            for waiter in [w for w in waiters if w.request.peer == peer]:
                waiter.finish()
                waiters.remove(waiter)
        lent = self.lent.pop(peer, None)
        return self._put_back(list(lent.values())) if lent else []
