"""Gets from a lane by a process of another machine: several items per call to the
lane's creator, none lost when the reader dies.

A process that cannot reach a queue's lane gets through the creator's hub, each get a
direct call (:mod:`fiberlite.runtime.direct`; Ctrl-C withdraws it, and what it was lent
meanwhile goes back). One call per item would cost a round trip each, so while that
process is the queue's one reader the hub hands it what is already in the lane, up to the
number it asks for (at least one, waiting for it as a get would), and the reader keeps
the rest in this process (:class:`BatchReader`), for its next gets. With several readers
each get takes one item: a get returns the oldest item, as ``multiprocessing``'s does,
and a reader that holds a batch would be passed by the others (a reader that stops at a
marker then leaves what it holds to readers that stopped too). A reader that comes waits
until no batch is held (:meth:`fiberlite.queue_lane.QueueState.begin_batch`).

Nothing handed out is lost: the hub *lends* each batch (:class:`Lending`) until the
reader's receipts say which of its items were consumed. A receipt for each item goes
with the reader's next call to the hub, or on its own within milliseconds (the hub's
receipts, :meth:`~fiberlite.runtime.hub.ObjectRef.confirm`), so that when the reader's
connection ends (killed, or gone with items it never read) what it had not consumed goes
back into the lane; a reader that holds items and does not get for :data:`HOLD_SECONDS`
gives them back too, for the queue's other readers. Items given back go behind what is in
the lane then: they are not lost, but a reader that was killed or stalled loses its
place in the order. An item consumed just before its reader was killed, whose receipt had
not yet left, is given to another reader too (as the hub does for one item lent to a
job without lanes).

The reader asks for as many items as it consumed within :data:`KEEP_TRIPS` round trips
of the last call (1 at first, doubling while it keeps up, up to :data:`BATCH_MAX`): a
reader that drains the queue gets large batches, one that works for a while on each item
gets one at a time and holds none back from the others.
"""
from __future__ import annotations

import bisect
import collections
import itertools
import queue
import threading
import time
from typing import Any, Callable

from .. import direct, exit_order
from ..dialed import pending_receipts
from ..hub import get_hub

BATCH_MAX = 256  # items a reader asks for in one call, at most
KEEP_TRIPS = 4  # a reader asks for more while it consumes a batch within this many round trips
TRIP_CAP = 0.002  # (a call that waited for an item does not count as a long round trip)
HOLD_SECONDS = 0.1  # items a reader holds and does not take for this long go back
SLOT = "lane"  # the receipts' slot

_tickets = itertools.count(1)  # (next() on it is atomic)
_calls = itertools.count(1)  # a reader's calls, by which one that was interrupted is withdrawn


class Lending:
    """In the creator's hub: the batches lent to readers of other machines, and which of
    their items were not yet confirmed consumed; ``give_back(ticket, payloads)`` puts items
    back ahead of the lane (:class:`Front`), ``consumed()`` counts one out of the queue (a
    lent item is counted in it, by ``qsize()`` and a bounded queue's room, until its receipt
    comes), ``unheld()`` is called when a batch lent as *held* (its reader may hold items
    its get did not return) is no longer: consumed, or given back."""

    def __init__(self, give_back: Callable[[int, list], None], consumed: Callable[[], None],
                 unheld: Callable[[], None] = lambda: None) -> None:
        self._lent: dict[int, tuple[int, collections.deque, bool]] = {}  # ticket -> (peer, left, held)
        self._held: collections.Counter = collections.Counter()  # peer -> its held batches
        self._lock = threading.Lock()
        self._give_back = give_back
        self._consumed = consumed
        self._unheld = unheld

    def lend(self, peer: int, payloads: list, held: bool = False) -> tuple[int, list]:
        """The answer that hands ``payloads`` to the reader ``peer`` (``held``: a batch that
        counts as held while more than the item its get returns is left)."""
        ticket = next(_tickets)
        held = held and len(payloads) > 1
        with self._lock:
            self._lent[ticket] = (peer, collections.deque(payloads), held)
            if held:
                self._held[peer] += 1
        return ticket, payloads

    def held_by(self, peer: int) -> int:
        """How many held batches the reader ``peer`` has."""
        with self._lock:
            return self._held[peer]

    def _forget(self, ticket: int) -> tuple[collections.deque, bool]:
        """Batch ``ticket`` is done with (the lock is held): what is left of it, and whether
        it was held."""
        peer, left, held = self._lent.pop(ticket, (0, collections.deque(), False))
        if held:
            self._held[peer] -= 1
            if not self._held[peer]:
                del self._held[peer]
        return left, held

    def confirm(self, ticket: int) -> None:
        """The reader consumed the next item of batch ``ticket``."""
        held = False
        with self._lock:
            lent = self._lent.get(ticket)
            if lent is None:
                return
            lent[1].popleft()
            if not lent[1]:
                held = self._forget(ticket)[1]
        self._consumed()
        if held:
            self._unheld()

    def give_back(self, tickets: list) -> None:
        """What is left of batches ``tickets`` goes back ahead of the lane."""
        with self._lock:
            left = [(ticket, *self._forget(ticket)) for ticket in tickets]
        for ticket, payloads, held in left:
            if payloads:
                self._give_back(ticket, list(payloads))
            if held:
                self._unheld()

    def undo(self, answer: Any) -> None:
        """A call was withdrawn after it took ``answer`` (a lent batch): back it goes."""
        if type(answer) is tuple:
            self.give_back([answer[0]])

    def peer_lost(self, peer: int) -> None:
        """The reader ``peer`` has gone: what it had not consumed goes back."""
        with self._lock:
            tickets = [ticket for ticket, (owner, _, _) in self._lent.items() if owner == peer]
        self.give_back(tickets)


class Front:
    """In the creator's hub: items given back by readers of other machines, which come
    before everything in the lane (they were taken from its head), in the order they
    were lent (their batches' tickets); ``count(delta)`` keeps the count in the queue's
    shared state, by which every reader of the machine knows to take them first."""

    def __init__(self, count: Callable[[int], None]) -> None:
        self._batches: list[tuple[int, collections.deque]] = []  # sorted by ticket
        self._lock = threading.Lock()
        self._count = count

    def add(self, ticket: int, payloads: list) -> None:
        with self._lock:
            bisect.insort(self._batches, (ticket, collections.deque(payloads)), key=lambda batch: batch[0])
            self._count(len(payloads))

    def take(self, most: int) -> list:
        """Up to ``most`` of the items, first first."""
        taken: list = []
        with self._lock:
            while self._batches and len(taken) < most:
                batch = self._batches[0][1]
                while batch and len(taken) < most:
                    taken.append(batch.popleft())
                if not batch:
                    del self._batches[0]
            if taken:
                self._count(-len(taken))
        return taken


class BatchReader:
    """In a process of another machine: its gets from one queue through the creator's
    hub (``ref``'s ``lane_get_many``), and the items it was handed and has not taken yet."""

    def __init__(self, ref: Any) -> None:
        self.ref = ref
        self._held: collections.deque = collections.deque()  # (ticket, payload), in order
        self._lock = threading.Lock()
        self._most = 1
        self._trip = 0.0  # how long the last call took
        self._came = 0.0  # when its batch came
        self._used = 0.0  # when an item was last taken from what is held
        self._timer: Any = None

    def get(self, block: bool = True, timeout: float | None = None) -> Any:
        """The next item's payload (``queue.Empty`` as a queue's get raises it)."""
        with self._lock:
            if self._held:
                ticket, payload = self._held.popleft()
                self._used = time.monotonic()
                self.ref.confirm(SLOT, ticket)
                return payload
            most = self._next_size()
        start = time.monotonic()
        call = next(_calls)  # (a direct call: its thread writes and reads a link to the hub)
        answer = direct.call(self.ref, "lane_get_many", most, block, timeout, call, interruptible=True,
                             interrupted=("lane_withdraw", call), kept=self._hand_back,
                             receipts=pending_receipts(self.ref.address))
        if isinstance(answer, queue.Empty):
            raise queue.Empty
        ticket, payloads = answer
        came = time.monotonic()
        self.ref.confirm(SLOT, ticket)
        with self._lock:
            self._trip, self._came = min(TRIP_CAP, came - start), came
            if len(payloads) > 1:
                self._held.extend((ticket, payload) for payload in payloads[1:])
                self._used = came
                self._hold_watch()
        return payloads[0]

    def _hand_back(self, ok: bool, answer: Any) -> None:
        """An interrupted get's answer, which came before its withdrawal: back it goes."""
        if ok and type(answer) is tuple:
            self.ref.call("lane_give_back", [answer[0]])

    def _next_size(self) -> int:
        """How many items to ask for, now that what was held is taken (the lock is held)."""
        if self._came:
            quick = time.monotonic() - self._came <= KEEP_TRIPS * self._trip
            self._most = min(BATCH_MAX, self._most * 2) if quick else max(1, self._most // 2)
            self._came = 0.0
        return self._most

    def _hold_watch(self) -> None:
        """Give back what is held once it was not taken from for HOLD_SECONDS (the lock is
        held)."""
        if self._timer is None:
            self._timer = get_hub().scheduler.call_later(HOLD_SECONDS, self._look_at_held)

    def _look_at_held(self) -> None:
        with self._lock:
            self._timer = None
            if not self._held:
                return
            idle = time.monotonic() - self._used
            if idle < HOLD_SECONDS:
                self._timer = get_hub().scheduler.call_later(HOLD_SECONDS - idle, self._look_at_held)
                return
        self.give_back(wait=False)

    def give_back(self, wait: bool = True) -> None:
        """What this process holds goes back to the queue (``wait``: until it is there)."""
        with self._lock:
            tickets = list(dict.fromkeys(ticket for ticket, _ in self._held))
            self._held.clear()
        if not tickets:
            return
        try:  # (the receipts of what was taken go first, with the call)
            if wait:
                self.ref.call("lane_give_back", tickets)
            else:
                self.ref.cast("lane_give_back", tickets)
        except Exception:  # the creator has gone
            pass

# (kept while the process lives: what one holds goes back once not taken, see HOLD_SECONDS)
_readers: dict[tuple, BatchReader] = {}
_readers_lock = threading.Lock()


def reader(ref: Any) -> BatchReader:
    """This process's one :class:`BatchReader` of the queue ``ref``."""
    key = (ref.address, ref.oid)
    with _readers_lock:
        found = _readers.get(key)
        if found is None:
            found = _readers[key] = BatchReader(ref)
        return found


def _give_back_all() -> None:
    for found in list(_readers.values()):
        found.give_back()


exit_order.at_exit("links", _give_back_all)
