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

A get of a job may ask for up to ``most`` items (:meth:`Channel.get`): what is there (at
least one, waited for as a single get would) is lent as one *batch* under one ticket,
``(ticket, [items])``. The job keeps what it does not take at once; a receipt for the
ticket confirms the batch's next item, and :meth:`Channel.give_back` takes what it had not
taken back to the front. Items of a batch count as in the channel (``size()``, a bound's
room) until their receipts come.
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

    __slots__ = ("request", "payload", "peek", "most", "now", "timer", "done")

    def __init__(self, request: Any, payload: Any = None, peek: bool = False, most: int = 0,
                 now: bool = False) -> None:
        self.request = request
        self.payload = payload
        self.peek = peek
        self.most = most  # a job's get of up to this many items, lent as one batch (0: one item)
        self.now = now  # a get that does not wait: it takes what is there
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
        # peer -> {ticket: item, or the deque of a batch's items} not yet confirmed
        self.lent: dict[int, dict[int, Any]] = {}
        self.batched = 0  # items of lent batches not yet confirmed (counted as in the channel)

    def full(self) -> bool:
        return 0 < self.maxsize <= len(self.items) + self.batched

    def size(self) -> int:
        """The items in the channel, those of batches a job holds and has not taken included."""
        return len(self.items) + self.batched

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
            peek: bool = False, most: int = 0) -> list[Action]:
        """A read: an item, or with ``most`` (a job's) up to that many lent as one batch."""
        actions: list[Action] = []
        now = not block or (timeout is not None and timeout <= 0)
        waiter = Waiter(request, peek=peek, most=most, now=now)
        if (self.items or self.writers_gone) and not self.held:
            self.getters.append(waiter)
            self._serve_getters(actions)
            if waiter.done:
                return actions
            self.getters.remove(waiter)  # (behind items other jobs hold: see _serve_getters)
            if not now:
                waiter = Waiter(request, peek=peek, most=most)
        if now:
            actions.append((lambda: request.reply(False)) if peek else (lambda: request.fail(queue.Empty())))
            return actions
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

    def holders(self) -> list[int]:
        """The jobs that hold items of batches they have not taken (nor confirmed)."""
        return [peer for peer, loans in self.lent.items()
                if any(type(loan) is collections.deque and loan for loan in loans.values())]

    def hand_back(self, peer: int, ticket: int) -> list[Action]:
        """What the job ``peer`` was lent with ``ticket`` and did not take (an item that
        reached an interrupted read, what is left of a batch) goes back to the front."""
        return self.give_back(peer, [ticket])

    def release_one(self, item: Any) -> list[Action]:
        """Put ``item`` (handed back unread) back at the front."""
        return self._put_back([item])

    def give_back(self, peer: int, tickets: list) -> list[Action]:
        """What the job ``peer`` holds of what it was lent with ``tickets`` and did not take
        goes back to the front, first lent first."""
        lent = self.lent.get(peer)
        if not lent:
            return []
        back: list = []
        for ticket in sorted(tickets):
            if ticket in lent:
                back += self._unlent(lent.pop(ticket))
        if not lent:
            del self.lent[peer]
        return self._put_back(back) if back else []

    def _unlent(self, lent: Any) -> list:
        """The items of one loan (an item, or a batch's deque) as a list, uncounted."""
        if type(lent) is not collections.deque:
            return [lent]
        self.batched -= len(lent)
        return list(lent)

    def _put_back(self, items: list) -> list[Action]:
        self.items.extendleft(reversed(items))
        actions: list[Action] = []
        self._serve_getters(actions)
        return actions

    def confirm(self, peer: int, ticket: int) -> list[Action]:
        """The job ``peer`` got the item lent to it with ``ticket`` (a batch's next one):
        it is no longer ours."""
        lent = self.lent.get(peer)
        if lent is None or ticket not in lent:
            return []
        batch = lent[ticket]
        actions: list[Action] = []
        if type(batch) is collections.deque:
            if batch:
                batch.popleft()
                self.batched -= 1
                self._admit_putter(actions)
            if batch:
                return actions
        del lent[ticket]
        if not lent:
            del self.lent[peer]
        if type(batch) is collections.deque and self.getters:
            self._serve_getters(actions)  # (a read may have waited for the batch)
        return actions

    def held_elsewhere(self) -> list[int]:
        """The jobs whose held batches the first waiting read must wait for: items
        older than any in the channel, which a get of ``multiprocessing`` would return
        first (a reader that stops reading must not keep them from the others)."""
        for waiter in self.getters:
            if not waiter.done:
                if waiter.peek or waiter.now or not self.batched:
                    return []
                peer = waiter.request.peer
                return [holder for holder in self.holders() if holder != peer]
        return []

    def _serve_getters(self, actions: list[Action]) -> None:
        if self.held:
            return
        while self.getters and (self.items or self.writers_gone):
            waiter = self.getters[0]
            if waiter.done:
                self.getters.popleft()
                continue
            if self.batched and not (waiter.peek or waiter.now) and self.held_elsewhere():
                return  # (the holders are asked for them: Recalls)
            self.getters.popleft()
            waiter.finish()
            request = waiter.request
            if waiter.peek:
                actions.append(lambda r=request: r.reply(True))
            elif self.items:
                if request.peer != LOCAL_PEER:  # lent until the job's receipt comes
                    ticket = next(_tickets)
                    loan = self._lend(waiter.most)
                    self.lent.setdefault(request.peer, {})[ticket] = loan
                    reply = (ticket, list(loan) if waiter.most else loan)
                    actions.append(lambda r=request, p=reply: r.reply(p))
                else:
                    payload = self.items.popleft()
                    actions.append(lambda r=request, p=payload: r.reply(p))
                self._admit_putter(actions)
            else:
                actions.append(lambda r=request: r.fail(EOFError()))

    def _lend(self, most: int) -> Any:
        """The next item, or (``most``) a batch of up to that many, taken to be lent."""
        if not most:
            return self.items.popleft()
        batch = collections.deque(self.items.popleft() for _ in range(min(most, len(self.items))))
        self.batched += len(batch)
        return batch

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
        if not lent:
            return []
        return self._put_back([item for loan in lent.values() for item in self._unlent(loan)])
