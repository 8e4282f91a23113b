"""The reading job's side of links: a job's pipe ends and queues linked to their owner.

A pipe or queue lives in the hub of the process that created it (its *owner*). Used
through the hub, each message to a job costs a request from the job and a reply, and
each message from it a hand-over by the hub's thread. Once a job has used a *slot* a
few times (read a pipe end, got from or put into a queue) and nobody else competes for
it, the slot is *linked*: the job listens on a link of its own
(:mod:`fiberlite.wire.link`: a Unix socket when the owner shares this machine, else an
nng PAIR), the owner dials it, and from then on the owner forwards what is sent to the
job as it is sent (:mod:`.forwarder`), and what the job sends comes straight back. Each
side's reading thread receives from the link itself (:mod:`.reading`).

A link ends (*unlinks*) as soon as that stops being true: another process reads the
end or gets from the queue, the job closes the end or waits on it, the job leaves so
much unread that the link is full, or the job ends. The owner then stops forwarding
and asks the job to hand back what it received and did not consume, after a last
:data:`~.frames.END` frame behind what the job sent; until that is back the slot's other
readers wait, so nothing is lost or read twice. The job acknowledges each item as it
consumes it (:meth:`~fiberlite.wire.link.Link.acknowledge`, before its read returns), and the owner
keeps a copy of every forwarded item until then: if the job dies, or its link breaks,
what it was sent and had not consumed goes back to the front of the pipe or queue, for
the next reader. If the owner dies, the job reads what had arrived and then fails as it
would through the hub.

The owner's servant side is :mod:`.servant`.
"""
from __future__ import annotations

import collections
import itertools
import threading
import time
from typing import Any

from ...wire import link as links, threads
from ...wire.codec import Payload
from ...wire.link import Link, LinkError, LinkTimeout
from ...wire.tls import host_port
from .. import exit_order, identity
from ..hub import ObjectRef, Servant, get_hub
from ..machine import same_machine
from .frames import END_FRAME, EOF, READY_FRAME, Unlinked, item_frame
from .reading import CANCEL_RETRY_MS, DRAIN_TIMEOUT_MS, LOST_POLL_MS, Reading

LINK_AFTER = 8  # reads through the hub before a job asks for a link (short-lived pipes never do)


class LinkedReader:
    """The slot ``end`` of the pipe or queue ``ref`` (a pipe's end, a queue's "get" or
    "put"), as used by this job over a link: it reads what the owner forwards and sends
    what it sends over the same link."""

    def __init__(self, ref: ObjectRef, end: int, link: Link, token: int) -> None:
        self.ref, self.end, self.token = ref, end, token
        self.link = link
        self.reading = Reading(link, keep_arrived=self._owner_gone)
        self._send_lock = threading.Lock()
        self._sending = True  # False once END is sent: sends go through the hub
        self._done = threading.Event()
        link.on_lost(self._wake_reader)

    # -- reading ----------------------------------------------------------------------
    def receive(self, timeout: float | None = None) -> Payload | None:
        """The next message, None after ``timeout`` (``EOFError`` at EOF; :class:`Unlinked`:
        read through the hub after :meth:`wait_done`)."""
        reading = self.reading
        with reading.lock:
            try:
                item = reading.take(timeout)
            except Unlinked:
                self._lost_drained()
                raise
            if item is EOF:
                raise EOFError
            if item is not None:
                if not self.link.acks_in_line:
                    if self._sending:  # (a count in shared memory: see _acknowledge)
                        self.link.acknowledge()
                else:
                    self._acknowledge()
            return item

    def _acknowledge(self) -> None:
        """Tell the owner an item is consumed (before the read returns it): from now on
        it is not given back to the pipe or queue if this job dies. An acknowledgement
        in line is a frame, sent under the send lock; one counted in shared memory needs
        no lock (none can follow :data:`~.frames.END`: unlinking takes the read lock the
        reading thread holds)."""
        link = self.link
        with self._send_lock:  # a frame among the frames this job sends
            while self._sending and not link.lost:
                if link.acknowledge(CANCEL_RETRY_MS):
                    return

    def _owner_gone(self) -> bool:
        """Whether the owner can no longer be reached (asked once the link is lost): else
        it takes back what it sent and this job did not consume, and none of it is read here."""
        try:
            self.ref.call("ping")
        except (ConnectionError, ReferenceError):
            return True
        return False

    def poll(self, timeout: float | None) -> bool:
        """Whether a message (or EOF) is there to read, waiting up to ``timeout``."""
        with self.reading.lock:
            try:
                return self.reading.next(timeout) is not None
            except Unlinked:
                self._lost_drained()
                raise

    def _lost_drained(self) -> None:
        if self.link.lost and not self.reading.stopped:
            self._finish()  # the owner has gone and everything it sent is read

    # -- sending ----------------------------------------------------------------------
    def send(self, payload: Payload) -> None:
        """Send into the other end over the link (:class:`Unlinked`: through the hub)."""
        frame = item_frame(payload)
        with self._send_lock:
            while self._sending:
                if self.link.send(frame, CANCEL_RETRY_MS):
                    return
                if self.link.lost:
                    break
        raise Unlinked

    # -- ending --------------------------------------------------------------------------
    def unlink(self, sent: int) -> None:
        """Hand back what the owner sent (``sent`` frames) and this job did not consume,
        after the last frame this job sent (:data:`END`)."""
        if self._done.is_set():
            return
        reading = self.reading
        reading.stop()
        try:
            if self._done.is_set():
                return
            unread = [item for item in reading.drain(count=sent) if item is not EOF]
            with self._send_lock:
                self._sending = False
                self.link.send(END_FRAME, timeout_ms=DRAIN_TIMEOUT_MS)
            try:
                self.ref.call("relinquish", self.end, self.token, unread)
            except (ConnectionError, ReferenceError):
                pass
            self._finish()
        finally:
            reading.lock.release()

    def owner_silent(self) -> None:
        """The owner's process was given up as silent. It may live on and take back what
        it sent and this job did not consume, so nothing more is read here, not even what
        has arrived: reads and sends go through the hub, which says the owner is gone."""
        reading = self.reading
        reading.stop()   # wakes a blocked reader, which reads through the hub once done
        try:
            self._finish()
        finally:
            reading.lock.release()

    def _wake_reader(self) -> None:
        """The link's connection ended: a blocked reader looks at what is left."""
        self.reading.take_lock()
        self.reading.lock.release()

    def _finish(self) -> None:
        """Read and send through the hub from now on (the read lock is held)."""
        with _registry_lock:
            if _readers.get(_key(self.ref, self.end)) is self:
                del _readers[_key(self.ref, self.end)]
            _by_token.pop(self.token, None)
        self.reading.stopped = True
        with self._send_lock:
            self._sending = False
        self.link.close()
        self._done.set()

    def wait_done(self) -> None:
        self._done.wait()


class _LinkMailbox(Servant):
    """This job's address for "hand back what you have not read" from pipe owners."""

    def op_unlink(self, request: Any, token: int, sent: int) -> None:
        request.reply()
        with _registry_lock:
            reader = _by_token.get(token)
            if reader is None:  # asked before the link is ready here: done once it is
                _early_unlinks[token] = sent
                return
        _start_unlink(reader, sent)


def _start_unlink(reader: LinkedReader, sent: int) -> None:
    """Hand back what ``reader`` has not read, on a thread of its own (it waits for frames
    and the owner's answer: not on the hub's thread)."""
    threads.start(reader.unlink, sent, name="fiberlite-unlink")


_registry_lock = threading.Lock()
_readers: dict[tuple, LinkedReader] = {}
_by_token: dict[int, LinkedReader] = {}
_early_unlinks: dict[int, int] = {}  # token -> frames sent, for links asked back while being made
_reads: collections.Counter = collections.Counter()  # reads through the hub, per end
_next_ask: dict[tuple, int] = {}  # when to ask again for an end whose owner said no
_tokens = itertools.count(1)
_mailbox: tuple[str, ObjectRef] | None = None


def _key(ref: ObjectRef, end: int) -> tuple:
    return (ref.address, ref.oid, end)


def reader_of(ref: ObjectRef, end: int) -> LinkedReader | None:
    """This job's link for the end, if it has one."""
    return _readers.get((ref.address, ref.oid, end)) if _readers else None


def used_through_hub(ref: ObjectRef, slot: Any) -> None:
    """Count a use of a remote slot (a pipe's end read, a queue's get or put) through its
    hub; ask for a link once it is worth it."""
    key = (ref.address, ref.oid, slot)
    _reads[key] += 1
    count = _reads[key]
    if count >= _next_ask.get(key, LINK_AFTER):
        _next_ask[key] = count * 4  # asked now: if refused, later and more rarely
        _try_link(ref, slot)


def got_through_hub(ref: ObjectRef, slot: Any, reply: Any) -> Any:
    """What a read of ``slot`` through its hub returns: the item of a ``(ticket, item)``
    reply, whose receipt goes with this process's next request to the hub, or on its own
    soon after (:meth:`ObjectRef.confirm`). The hub lends the item until the receipt comes,
    and gives it to the next reader if this process's connection ends before."""
    if type(reply) is not tuple:
        return reply
    ticket, item = reply
    ref.confirm(slot, ticket)
    return item


def _mailbox_ref() -> ObjectRef:
    global _mailbox
    hub = get_hub()
    with _registry_lock:
        if _mailbox is None or _mailbox[0] != hub.address:
            _mailbox = (hub.address, hub.register(_LinkMailbox()))
        return _mailbox[1]


def _try_link(ref: ObjectRef, end: int) -> None:
    from ...config import get
    mailbox = _mailbox_ref()
    host = host_port(mailbox.address)[0]
    key = identity.key()
    try:
        link = links.listen(host, key, use_tls=bool(get("tls")), same_machine=same_machine(ref))
    except OSError:
        return
    token = next(_tokens)
    try:
        agreed = ref.call("link", end, link.address, mailbox, token)
    except BaseException:
        link.close()
        raise
    if not agreed or not link.accept(key) or not _owner_ready(link):
        link.close()  # a link half made is dropped by its owner when it notices
        with _registry_lock:
            _early_unlinks.pop(token, None)
        return
    reader = LinkedReader(ref, end, link, token)
    owner = ref.connection()

    def owner_lost() -> None:
        if owner.silent_for is not None:   # (an owner that ended: what arrived is still read)
            reader.owner_silent()
    owner.on_lost(owner_lost)
    with _registry_lock:
        _readers[_key(ref, end)] = reader
        _by_token[token] = reader
        asked = _early_unlinks.pop(token, None)
    if asked is not None:
        _start_unlink(reader, asked)


def _owner_ready(link: Link) -> bool:
    """Wait for the owner's :data:`READY_FRAME`: before it, the owner may still drop the
    link (the end got another reader meanwhile), and nothing may be sent over it."""
    deadline = time.monotonic() + DRAIN_TIMEOUT_MS / 1000
    while not link.lost and time.monotonic() < deadline:
        try:
            return link.recv(LOST_POLL_MS) == READY_FRAME
        except LinkTimeout:
            continue
        except LinkError:
            return False
    return False


UNLINK_AT_EXIT_SECONDS = 15.0


def unlink_all(timeout: float = UNLINK_AT_EXIT_SECONDS) -> None:
    """At exit: hand back what this job's links received and it did not read, so that
    it stays with the pipes and queues it was sent to, and let what it sent over them
    land (``timeout``: then give up)."""
    readers = list(_readers.values())
    if not readers:
        return
    threads.run_for(lambda: [unlink_own(r.ref, r.end) for r in readers], timeout,
                    name="fiberlite-unlink-at-exit")


exit_order.at_exit("links", unlink_all)


def unlink_own(ref: ObjectRef, end: Any) -> None:
    """End this job's link for the end (before ``fileno``/``wait``/``close``) and wait
    until what it had not read is back with the pipe's owner."""
    reader = reader_of(ref, end)
    if reader is None:
        return
    try:
        asked = ref.call("unlink", end, reader.token)
    except (ConnectionError, ReferenceError):
        asked = False  # the owner has gone
    if not asked:  # the owner has no link for it (any more): nothing more comes over it
        reader.unlink(reader.reading.received)
    reader.wait_done()
