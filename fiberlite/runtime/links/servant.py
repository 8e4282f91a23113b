"""The owner's side of links (:mod:`.reader`), for any servant made of channels.

A servant links a *slot* to one job: what it forwards is read by that job (the slot's
*forward* channel, if any), what the job sends comes back over the link into the
slot's *return* channel, read in the owner's process. A pipe's slot is the end the job
reads (forward: that end's inbox; return: the other end's); a queue has a slot for a
job that only gets (forward) and one for a job that only puts (return).
"""
from __future__ import annotations

import threading
import time
from typing import Any, Hashable

from ...wire import link as links
from ...wire.codec import Payload
from .. import identity
from ..hub import LOCAL_PEER, LockedServant, ObjectRef
from ..machine import machine_id
from .channel import Channel
from .forwarder import LINKED, LINKING, UNLINKING, Forwarder
from .frames import END, EOF_FRAME, READY_FRAME, RETRY, Unlinked, item_frame


RELINK_QUIET = 1.0  # seconds without another user before a slot is linked (again)


class LinkingServant(LockedServant):
    """A servant whose slots may be linked to jobs; subclasses say which channels a slot
    moves and when a job may have it (:meth:`_may_link`)."""

    # whether this process's reads of a link look awake before they sleep (a pipe's, whose
    # reader waits for an answer); a queue's get sleeps at once, so that what arrives
    # while it sleeps is read in one call rather than one item a call
    look_awake = True

    def __init__(self) -> None:
        super().__init__()
        self.links: dict[Hashable, Forwarder] = {}
        self.never_link: set = set()  # slots that cannot be linked (a bounded queue's, ...)
        # slot -> {peer: when it last used the slot through this servant}: a slot is linked
        # again once no other process has used it for RELINK_QUIET seconds
        self.last_use: dict[Hashable, dict[int, float]] = {}

    # -- for subclasses --------------------------------------------------------------------
    def _forward_channel(self, slot: Hashable) -> Channel | None:
        """The channel whose items go to the job linked to ``slot``."""
        raise NotImplementedError

    def _return_channel(self, slot: Hashable) -> Channel | None:
        """The channel into which what that job sends goes."""
        raise NotImplementedError

    def _may_link(self, slot: Hashable, peer: int) -> bool:
        """Whether ``slot`` may be linked to the job ``peer`` now (the lock is held)."""
        raise NotImplementedError

    def _used(self, slot: Hashable, peer: int) -> None:
        """``peer`` used ``slot`` through this servant (the lock is held)."""
        self.last_use.setdefault(slot, {})[peer] = time.monotonic()

    def _contested(self, slot: Hashable, peer: int) -> bool:
        """Whether a process other than ``peer`` used ``slot`` lately (the lock is held)."""
        users = self.last_use.get(slot)
        if not users:
            return False
        recent = time.monotonic() - RELINK_QUIET
        for user, when in list(users.items()):
            if when < recent:
                del users[user]
        return any(user != peer for user in users)

    def _readable(self, channel: Channel) -> list:
        """Actions once ``channel`` may have become readable (to wake watchers)."""
        return []

    # -- forwarding ------------------------------------------------------------------------
    def _forward(self, slot: Hashable, payload: Payload) -> bool | None:
        """Send ``payload`` over the link of ``slot``: True sent, None no link; False the
        link cannot take it (it is then being unlinked). The lock is held."""
        link = self.links.get(slot)
        if link is None or link.state != LINKED:
            return None
        if link.forward(item_frame(payload), payload):
            self._forward_channel(slot).enqueued += 1  # type: ignore[union-attr]
            return True
        return False

    def forward_local(self, slot: Hashable, payload: Payload) -> bool:
        """A put or send of this process, straight over the link of ``slot``; False: make
        it as usual (no link, or it is ending)."""
        with self._lock:
            sent = self._forward(slot, payload)
            if sent is not False:
                return bool(sent)
            actions = self._unlink(slot)
        self.run_actions(actions)
        return False

    # -- making a link ---------------------------------------------------------------------
    def op_link(self, request, slot: Hashable, address: str, mailbox: ObjectRef, token: int) -> None:
        """The job of ``request`` listens at ``address`` for ``slot``: link it if it may;
        the reply says whether."""
        with self._lock:
            agreed = (request.peer != LOCAL_PEER and slot not in self.links
                      and slot not in self.never_link and not self._contested(slot, request.peer)
                      and self._may_link(slot, request.peer))
            if agreed:
                forwarder = Forwarder(request.peer, mailbox, token)
                self.links[slot] = forwarder
        request.reply(agreed)
        if agreed:
            threading.Thread(target=self._connect_link, args=(slot, forwarder, address),
                             daemon=True, name="fiberlite-link").start()

    def _connect_link(self, slot: Hashable, forwarder: Forwarder, address: str) -> None:
        try:
            link = links.dial(address, identity.key())
        except Exception:
            link = None
        else:
            if not self.look_awake and getattr(link, "awake", False):
                link.awake = False
        with self._lock:
            if self.links.get(slot) is not forwarder or link is None or not link.send(READY_FRAME):
                if self.links.get(slot) is forwarder:
                    self._drop(slot)
                if link is not None:
                    link.close()
                return
            forwarder.connected(link)
            actions: list = []
            back = self._return_channel(slot)
            if back is not None:  # reads of this process waiting there read the link now
                retry = back.take_getters(lambda r: r.peer == LOCAL_PEER)
                actions += [lambda r=request: r.reply(RETRY) for request in retry]
            ahead = self._forward_channel(slot)
            if ahead is not None:
                while ahead.items and forwarder.forward(item_frame(ahead.items[0]), ahead.items[0]):
                    ahead.items.popleft()
                if ahead.items:  # full already (a reader that stopped reading)
                    actions += self._unlink(slot)
                else:
                    actions += self._forward_eof(slot)
        link.on_lost(lambda: self._link_lost(slot, forwarder))
        self.run_actions(actions)

    def _forward_eof(self, slot: Hashable) -> list:
        """Tell the job linked to ``slot`` that its writers are gone, after what they sent."""
        link = self.links.get(slot)
        ahead = self._forward_channel(slot)
        if link is not None and link.state == LINKED and ahead is not None and ahead.writers_gone:
            if not link.forward(EOF_FRAME):
                return self._unlink(slot)
        return []

    def _drop(self, slot: Hashable) -> None:
        del self.links[slot]  # (linked again when a job asks and nobody competes)

    # -- ending a link ---------------------------------------------------------------------
    def _unlink(self, slot: Hashable) -> list:
        """Stop forwarding to the job linked to ``slot`` and ask it for what it has not read;
        the slot's other readers wait until that is back (``relinquish``). The lock is held."""
        link = self.links.get(slot)
        if link is None or link.state == UNLINKING:
            return []
        if link.state == LINKING:  # not linked yet: the link is dropped when made
            self._drop(slot)
            return []
        link.state = UNLINKING
        ahead = self._forward_channel(slot)
        if ahead is not None:
            ahead.held = True

        def ask() -> None:
            try:
                link.ask_back()
            except (ConnectionError, ReferenceError):
                self._link_lost(slot, link)  # the job has gone
        return [ask]

    def op_unlink(self, request, slot: Hashable, token: int) -> None:
        """The linked job asks to go through the hub again; the reply says whether it will
        be asked for what it has not read (else its link is gone here)."""
        with self._lock:
            link = self.links.get(slot)
            asked = link is not None and link.token == token and link.state != LINKING
            actions = self._unlink(slot)
        request.reply(asked)
        self.run_actions(actions)

    def op_relinquish(self, request, slot: Hashable, token: int, unread: list) -> None:
        """What the linked job had received and not consumed, to be read first; what it sent
        over the link before its :data:`~.frames.END` is taken from the link."""
        with self._lock:
            link = self.links.get(slot)
            if link is not None and link.token != token:
                link = None
        if link is not None:
            self._take_link(slot, link, unread, until_end=True)
        request.reply()

    def _link_lost(self, slot: Hashable, link: Forwarder) -> None:
        """The job's connection ended: what it was sent and did not consume goes back to
        the front of the slot's channel; what it sent and had arrived is read."""
        self._take_link(slot, link, None, until_end=False)

    def _take_link(self, slot: Hashable, link: Forwarder, unread: list | None,
                   until_end: bool) -> None:
        """End the link of ``slot``: ``unread`` (what the reader handed back; None: what
        it has not acknowledged) is read first, what it sent is taken from the link."""
        with link.take_lock:  # one taker; a second one finds it done
            if link.taken:
                return
            sent = link.take_sent(until_end)  # waits for the frames still on their way
            if unread is None:  # (its acknowledgements are all in: the link is drained)
                link.settle()
                unread = list(link.unacked)
            with self._lock:
                if self.links.get(slot) is not link:
                    return
                self._drop(slot)
                actions: list = []
                ahead = self._forward_channel(slot)
                if ahead is not None:
                    actions += ahead.release(unread) + self._readable(ahead)
                back = self._return_channel(slot)
                if back is not None:
                    actions += back.extend(sent) + self._readable(back)
        self.run_actions(actions + [link.close])

    def op_withdraw(self, request, slot: Hashable) -> None:
        """A read of ``slot`` by the job was interrupted (Ctrl-C): its waiting reads are
        answered RETRY now (a read of the job's other threads simply asks again)."""
        with self._lock:
            channel = self._forward_channel(slot)
            waiting = channel.take_getters(lambda r: r.peer == request.peer) if channel else []
        self.run_actions([lambda r=r: r.reply(RETRY) for r in waiting] + [request.reply])

    def op_hand_back(self, request, slot: Hashable, ticket: int | None, item: Any = None) -> None:
        """The item lent with ``ticket`` (or, in this process, which borrows nothing,
        ``item``) reached a read that was interrupted: it goes back to the front, for the
        next read."""
        with self._lock:
            channel = self._forward_channel(slot)
            lent = channel.lent.get(request.peer, {}) if channel else {}
            if ticket in lent:
                item = lent.pop(ticket)
                if not lent:
                    del channel.lent[request.peer]
            actions = [] if item is None else channel.release_one(item) + self._readable(channel)
        self.run_actions(actions + [request.reply])

    def op_received(self, request, slot: Hashable, ticket: int) -> None:
        """The receipt of a job for the item lent to it with ``ticket`` (see
        :func:`~.reader.got_through_hub`): the item is the job's now."""
        with self._lock:
            self._forward_channel(slot).confirm(request.peer, ticket)  # type: ignore[union-attr]

    def op_machine(self, request) -> None:
        """This process's :func:`~fiberlite.runtime.machine.machine_id`: a job that shares it
        is linked over a Unix socket."""
        request.reply(machine_id())

    def op_ping(self, request) -> None:
        """Answer a linked job that lost its link and asks whether this process is still here."""
        request.reply()

    def links_of(self, peer: int) -> list:
        """``(slot, link)`` of the links of the job ``peer``."""
        return [(slot, link) for slot, link in list(self.links.items()) if link.reader_peer == peer]

    # -- reading, in this process, what a linked job sends -----------------------------------
    def _read_returned(self, request, slot: Hashable, block: bool, timeout: float | None,
                       peek: bool = False) -> list:
        """Actions for ``request``, a read of the return channel of ``slot``. A read of this
        process is answered :data:`~.frames.RETRY` if the link of ``slot`` came up after
        the read looked for it (:meth:`receive_returned`) and before it reached here: what
        the job sends comes over the link, not into the channel, so the read goes there,
        as the reads already waiting when the link came up do. The lock is held."""
        channel = self._return_channel(slot)
        if request.peer == LOCAL_PEER and not channel.items and self._link_carries(slot):  # type: ignore[union-attr]
            return [lambda: request.reply(RETRY)]
        return channel.get(request, block, timeout, self.schedule_expiry, peek=peek)  # type: ignore[union-attr]

    def _link_carries(self, slot: Hashable) -> bool:
        """Whether what the job linked to ``slot`` sends comes over its link (not when the
        link is not up yet, or is ending: its END read, or its job gone)."""
        link = self.links.get(slot)
        if link is None or link.state != LINKED or link.reading is None:
            return False
        reading = link.reading
        pending = reading.pending
        return not (reading.stopped or link.link.lost or (pending and pending[0] is END))  # type: ignore[union-attr]

    def receive_returned(self, slot: Hashable, timeout: float | None = None, peek: bool = False) -> Any:
        """What the job linked to ``slot`` sent next: a Payload (or with ``peek`` True),
        False after ``timeout``; None: read the channel instead (no link, or something to
        read there first)."""
        link = self.links.get(slot)
        if link is None or link.state != LINKED or self._return_channel(slot).items:  # type: ignore[union-attr]
            return None
        reading = link.reading
        with reading.lock:
            try:
                item = reading.next(timeout) if peek else reading.take(timeout)
            except Unlinked:
                return None
            if item is None:
                return False
            if item is END:
                return None  # the link is ending: what it carried will be in the channel
            return True if peek else item
