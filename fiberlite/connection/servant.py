"""The hub side of a :func:`~fiberlite.connection.Pipe`: ``PipeServant``, the two
channels of a pipe and the processes that hold each of its ends.

It lives in the hub of the process that created the pipe and serves the
``Connection`` objects of :mod:`fiberlite.connection.pipe`, in any job; an end read by
one other job alone is linked to it (:mod:`fiberlite.runtime.links.servant`). It tells the
watchers of an end when it becomes readable (:mod:`fiberlite.connection.readiness`).
"""
from __future__ import annotations

import collections
import weakref
from typing import Any

from ..runtime.hub import LOCAL_PEER, ObjectRef, unregister
from ..runtime.lanes import shared as lanes
from ..runtime.links.channel import Channel
from ..runtime.links.servant import LinkingServant
from ..wire.codec import Payload
from .pipe_lanes import LaneOps
from .readiness import _tell_ready

__all__ = ["PipeServant"]


class PipeServant(LaneOps, LinkingServant):
    """Two channels (or, on a machine that shares lanes, two lanes) and the holders of
    each end."""

    def __init__(self, duplex: bool) -> None:
        super().__init__()
        if lanes.enabled():  # lane[e]: what end e reads
            made = [lanes.create() for _ in range(2 if duplex else 1)]
            self.lanes = tuple(m[0] for m in made) + ((None,) if not duplex else ())
            self.places = tuple(m[1] for m in made) + ((None,) if not duplex else ())
            for _, _, forget in made:
                weakref.finalize(self, forget)
        # inbox[e] holds what end e will read
        self.inbox = (Channel(), Channel())
        # how many Connection objects each process holds, per end
        self.holders = (collections.Counter({LOCAL_PEER: 1}), collections.Counter({LOCAL_PEER: 1}))
        self.oid: int | None = None  # set by Pipe(): dropped from the hub once both ends are
        # ends pickled for another job and not attached there yet: end -> export tokens
        self.pending: tuple[set[bytes], set[bytes]] = (set(), set())
        # wait() calls to tell when an end becomes readable: end -> {token: readiness ref}
        self.watchers: tuple[dict, dict] = ({}, {})
        if not duplex:  # end 1 only writes: nobody reads it (a job that holds it may
            self.inbox[1].close_writers()  # still be linked: what it sends comes back)

    def op_send(self, request, end: int, payload: Payload) -> None:
        target = 1 - end
        with self._lock:
            self._used(end, request.peer)
            # another writer than the job linked to `end` (it sends over its link): unlink
            actions = self._unlink(end) if end in self.links else []
            sent = None if self.inbox[target].readers_gone else self._forward(target, payload)
            if sent:
                actions.append(request.reply)
            else:
                if sent is False:  # the reader leaves it unread until the link is full
                    actions += self._unlink(target)
                actions += self.inbox[target].put(request, payload, True, None, self.schedule_expiry)
                if self.watchers[target]:
                    actions += self._wake(target)
        self.run_actions(actions)

    def send_local(self, end: int, payload: Payload) -> bool:
        """A send of this process into the end linked to a job, straight over the link;
        False: send as usual."""
        if end in self.links or self.inbox[1 - end].readers_gone:
            return False
        return self.forward_local(1 - end, payload)

    def receive_local(self, end: int, timeout: float | None = None, peek: bool = False) -> Any:
        """Read ``end`` in this process from the link of the job that writes into it
        (see :meth:`~fiberlite.runtime.links.servant.LinkingServant.receive_returned`)."""
        return self.receive_returned(1 - end, timeout, peek)

    # -- links (fiberlite.runtime.links.servant): a slot is the end the job reads ---------------------------
    def _forward_channel(self, end: int) -> Channel:
        return self.inbox[end]

    def _return_channel(self, end: int) -> Channel:
        return self.inbox[1 - end]

    def _readable(self, channel: Channel) -> list:
        end = self.inbox.index(channel)
        return self._wake(end) if self.watchers[end] else []

    def _may_link(self, end: int, peer: int) -> bool:
        inbox = self.inbox[end]
        allowed = {peer, LOCAL_PEER}
        return (not inbox.readers_gone and not inbox.held and not inbox.lent
                and set(self.holders[end]) <= allowed and set(self.holders[1 - end]) <= allowed
                and not self.pending[end] and not self.watchers[end]
                and not any(not w.done for w in inbox.getters)
                and not any(not w.done and w.request.peer != LOCAL_PEER
                            for w in self.inbox[1 - end].getters))

    def op_watch(self, request, end: int, token: tuple, readiness: ObjectRef) -> None:
        """Tell ``readiness`` once ``end`` has something to read (or EOF); the reply says
        whether it has already."""
        if self.lanes is not None:
            self.watch_lane(request, end, token, readiness)
            return
        with self._lock:
            actions = self._unlink(end) + self._unlink(1 - end)  # readiness comes from the pipe
            inbox = self.inbox[end]
            ready = (bool(inbox.items) or inbox.writers_gone) and not inbox.held
            if not ready:
                self.watchers[end][token] = readiness
        request.reply(ready)
        self.run_actions(actions)

    def op_unwatch(self, request, end: int, token: tuple) -> None:
        if self.lanes is not None:
            self.lane_waits.cancel(("watch", end, token))
        with self._lock:
            self.watchers[end].pop(token, None)
        request.reply()

    def _wake(self, end: int) -> list:
        inbox = self.inbox[end]
        if inbox.held or not (inbox.items or inbox.writers_gone):
            return []
        watchers = list(self.watchers[end].items())
        self.watchers[end].clear()
        return [lambda t=token, r=ref: _tell_ready(r, t) for token, ref in watchers]

    def _other_reader(self, request, end: int) -> list:
        """``request`` reads ``end`` through the pipe: a job linked to ``end`` hands back
        what it has not read; a link carrying what is sent to ``end`` is read here no more
        unless this process reads. The lock is held."""
        self._used(end, request.peer)
        actions = self._unlink(end)
        if request.peer != LOCAL_PEER:
            self._used(1 - end, request.peer)
            actions += self._unlink(1 - end)
        return actions

    def op_receive(self, request, end: int, block: bool = True, timeout: float | None = None) -> None:
        with self._lock:
            actions = self._other_reader(request, end)
            actions += self._read_returned(request, 1 - end, block, timeout)
        self.run_actions(actions)

    def op_poll(self, request, end: int, timeout: float | None) -> None:
        with self._lock:
            actions = self._other_reader(request, end)
            actions += self._read_returned(request, 1 - end, timeout is None or timeout > 0, timeout,
                                           peek=True)
        self.run_actions(actions)

    def op_export(self, request, end: int, token: bytes) -> None:
        with self._lock:
            self.pending[end].add(token)
            actions = self._unlink(0) + self._unlink(1)  # on its way to another job
        request.reply()
        self.run_actions(actions)

    def op_attach(self, request, end: int, token: bytes) -> None:
        with self._lock:
            self.pending[end].discard(token)
            self.holders[end][request.peer] += 1
        request.reply()

    def op_expire(self, request, end: int, token: bytes) -> None:
        """The job an end was pickled for ended without attaching it: forget the export."""
        with self._lock:
            if token not in self.pending[end]:
                actions: list = []
            else:
                self.pending[end].discard(token)
                actions = self._check_end(end)
        request.reply()
        self.run_actions(actions)

    def op_close(self, request, end: int) -> None:
        with self._lock:
            holders = self.holders[end]
            holders[request.peer] -= 1
            actions = []
            if holders[request.peer] <= 0:
                del holders[request.peer]
                link = self.links.get(end)
                if link is not None and link.reader_peer == request.peer:
                    actions = self._unlink(end)  # what it leaves unread stays for the end's other holders
            actions += self._check_end(end)
        request.reply()
        self.run_actions(actions)

    def _check_end(self, end: int) -> list:
        if self.holders[end] or self.pending[end]:
            return []
        other = 1 - end
        if self.oid is not None and not (self.holders[other] or self.pending[other]):
            unregister(self.oid)  # nobody holds either end: the pipe is gone
            self.oid = None
        # nobody holds `end` any more: its peer reads EOF, writes to it break
        if self.lanes is not None:
            self.end_lanes(end)
        return (self.inbox[other].close_writers() + self._forward_eof(other)
                + self.inbox[end].close_readers() + self._wake(other))

    def peer_lost(self, peer: int) -> None:
        if self.lanes is not None:
            self.lane_waits.cancel_peer(peer)
        for end, link in self.links_of(peer):  # what it sent before it went is read before EOF
            self._link_lost(end, link)
        actions: list = []
        with self._lock:
            for end in (0, 1):
                actions += self.inbox[end].drop_peer(peer)
                if self.holders[end].pop(peer, 0):
                    actions += self._check_end(end)
        self.run_actions(actions)
