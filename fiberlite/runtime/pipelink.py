"""Direct links between a job and the owner of a pipe or queue it uses.

A pipe or queue lives in the hub of the process that created it (its *owner*). Used
through the hub, each message to a job costs a request from the job and a reply, and
each message from it a hand-over by the hub's thread. Once a job has used a *slot* a
few times (read a pipe end, got from or put into a queue) and nobody else competes for
it, the slot is *linked*: the job listens on a PAIR socket of its own
(:class:`~fiberlite.wire.link.Link`), the owner dials it, and from then on the owner
forwards what is sent to the job as it is sent, and what the job sends comes straight
back. Each side's reading thread receives from the socket itself.

A link ends (*unlinks*) as soon as that stops being true: another process reads the
end or gets from the queue, the job closes the end or waits on it, the job leaves so
much unread that the link is full, or the job ends. The owner then stops forwarding
and asks the job to hand back what it received and did not consume, after a last
:data:`END` frame behind what the job sent; until that is back the slot's other
readers wait, so nothing is lost or read twice. The job acknowledges each item as it
consumes it (an :data:`ACK_FRAME` sent before its read returns), and the owner keeps a
copy of every forwarded item until then: if the job dies, or its link breaks, what it
was sent and had not consumed goes back to the front of the pipe or queue, for the next
reader. If the owner dies, the job reads what had arrived and then fails as it would
through the hub.

This module holds the job's side (:class:`LinkedReader`) and the owner's half of each
link (:class:`Forwarder`); :mod:`fiberlite.runtime.linkhost` holds the owner's servant side.
"""
from __future__ import annotations

import collections
import itertools
import threading
import time
from typing import Any, Callable

import pynng
from pynng._nng import lib

from . import exit_order, identity
from .hub import ObjectRef, Servant, get_hub
from ..wire import codec
from ..wire.codec import Payload
from ..wire.link import WRITER_RECEIVE_AHEAD, Link
from ..wire.tls import host_port

LINK_AFTER = 8  # reads through the hub before a job asks for a link (short-lived pipes never do)
DRAIN_TIMEOUT_MS = 30_000  # frames the owner sent before unlinking are on their way: wait for them
CANCEL_RETRY_SECONDS = 0.02
CANCEL_RETRY_MS = int(CANCEL_RETRY_SECONDS * 1000)
LOST_POLL_MS = 100  # waiting for what a peer sent, how often to look whether it has gone
LOST_WAIT_MS = 5_000  # how long a peer whose hub connection ended may keep its link

# frames on a link: one kind byte, then the payload's own bytes
_PICKLED, _RAW, _FRAMED, _EOF, _END = b"\x01", b"\x02", b"\x03", b"\x04", b"\x05"
READY_FRAME = b"\x06"  # the owner's first frame: the link is in use (not counted as sent)
ACK_FRAME = b"\x07"  # the reader consumed the oldest item it was sent (not counted as received)
ACK_DRAIN_AT = 256  # unacknowledged items after which the owner takes in the acks that arrived,
ACK_DRAIN_EVERY = 64  # every this many items forwarded
# at most this many items unacknowledged (then the link counts as full): their acks always
# fit in what the owner's socket takes in (WRITER_RECEIVE_AHEAD), so none waits on the way
ACK_LIMIT = WRITER_RECEIVE_AHEAD - 64
EOF_FRAME = _EOF
END_FRAME = _END  # the reader's last frame: it sends through the hub from now on


def item_frame(payload: Payload) -> Any:
    """The frame that carries ``payload`` over a link (bytes, or an nng message)."""
    if payload.buffers is None:
        return _RAW + payload.data
    if not payload.buffers:
        return _PICKLED + payload.data
    frame = codec.encode((payload,))  # out-of-band buffers: one copy into one message
    if isinstance(frame, bytes):
        return _FRAMED + frame
    lib.nng_msg_insert(frame._nng_msg, _FRAMED, 1)
    return frame


class _Marker:
    __slots__ = ("name",)

    def __init__(self, name: str) -> None:
        self.name = name

    def __repr__(self) -> str:
        return f"<link {self.name}>"


EOF = _Marker("EOF")  # the writers of the end are gone (sticky: every later read sees it)
END = _Marker("END")
RETRY = _Marker("RETRY")  # the answer to a read in the owner that is to read a link made meanwhile


def read_frame(frame: Any) -> Any:
    """The :class:`Payload` (or :data:`EOF`, :data:`END`) a link frame carries."""
    kind = frame[:1]
    if kind == _PICKLED or kind == _RAW:
        payload = Payload.__new__(Payload)
        payload.data = frame[1:]
        payload.buffers = [] if kind == _PICKLED else None
        return payload
    if kind == _FRAMED:
        return codec.decode(memoryview(frame)[1:])[0]
    if kind == _EOF:
        return EOF
    if kind == _END:
        return END
    raise ValueError(f"unknown link frame kind {bytes(kind)!r}")


class Unlinked(Exception):
    """The link is ending or has ended: read and send through the pipe's hub."""


class Reading:
    """The receiving half of a link, read by the receiving threads themselves, one at a
    time (:attr:`lock`); what is taken and not yet consumed waits in :attr:`pending`."""

    def __init__(self, link: Link, on_ack: Callable[[], None] | None = None,
                 keep_arrived: Callable[[], bool] | None = None) -> None:
        self.link = link
        self.lock = threading.Lock()
        self.pending: collections.deque = collections.deque()
        self.received = 0  # frames taken from the link
        self.stopped = False  # set (then the lock taken) to end the reading
        self._on_ack = on_ack  # (the owner's side) called for each ACK_FRAME
        # once the link is lost: whether what had arrived is still read (asked once)
        self._keep_arrived = keep_arrived
        self._arrived_kept: bool | None = None

    def next(self, timeout: float | None) -> Any:
        """The next item, left in :attr:`pending`; None after ``timeout`` (None: no limit).
        :class:`Unlinked` once stopped, or once the link is lost and drained. The lock is held."""
        if self.pending:
            return self.pending[0]
        item = self._receive(timeout)
        if item is not None:
            self.pending.append(item)
        return item

    def take(self, timeout: float | None) -> Any:
        """As :meth:`next`, but a :class:`Payload` is consumed (taken out of
        :attr:`pending`); a marker (:data:`EOF`, :data:`END`) stays for the next reader."""
        pending = self.pending
        if pending:
            item = pending[0]
            if type(item) is Payload:
                pending.popleft()
            return item
        item = self._receive(timeout)
        if item is not None and type(item) is not Payload:
            pending.append(item)
        return item

    def _receive(self, timeout: float | None) -> Any:
        """The next item from the link (None after ``timeout``)."""
        deadline = None if timeout is None else time.monotonic() + max(0.0, timeout)
        while True:
            if self.stopped:
                raise Unlinked
            lost = self.link.lost  # the peer has gone: what has arrived may still be read
            if lost and not self._read_arrived():
                raise Unlinked
            wait_ms = -1 if deadline is None else max(0, int((deadline - time.monotonic()) * 1000))
            try:
                frame = self.link.recv(0 if lost else wait_ms)
            except pynng.Timeout:
                if lost:
                    raise Unlinked from None
                return None
            except (pynng.Canceled, pynng.Closed):
                continue  # woken to look at the state again
            if not self._acknowledged(frame):
                self.received += 1
                return read_frame(frame)

    def _acknowledged(self, frame: Any) -> bool:
        """Whether ``frame`` is an :data:`ACK_FRAME` (then counted)."""
        if frame[:1] != ACK_FRAME:
            return False
        if self._on_ack is not None:
            self._on_ack()
        return True

    def _read_arrived(self) -> bool:
        if self._arrived_kept is None:
            self._arrived_kept = self._keep_arrived is None or self._keep_arrived()
        return self._arrived_kept

    def take_acks(self) -> None:
        """Count the acknowledgements that have arrived, if no other thread is reading
        (then it counts them); stops at the first other frame, left for the next read."""
        if self.pending or not self.lock.acquire(blocking=False):
            return
        try:
            while not self.stopped:
                frame = self.link.recv_nowait()
                if frame is None:
                    return
                if not self._acknowledged(frame):
                    self.received += 1
                    self.pending.append(read_frame(frame))
                    return
        finally:
            self.lock.release()

    def stop(self) -> None:
        """Make readers give up, and take the lock (woken if blocked on the link)."""
        self.stopped = True
        self.take_lock()

    def take_lock(self) -> None:
        while not self.lock.acquire(timeout=CANCEL_RETRY_SECONDS):
            self.link.cancel()

    def drain(self, until: Any = None, count: int | None = None) -> list:
        """Take the rest (lock held): up to ``count`` frames in all, or up to the item
        ``until``, or (neither) all that arrives until the peer's connection ends; the
        items, in order, without markers."""
        items = list(self.pending)
        self.pending.clear()
        finite = count is not None or until is not None
        deadline = time.monotonic() + (DRAIN_TIMEOUT_MS if finite else LOST_WAIT_MS) / 1000
        while (count is None or self.received < count) and (until is None or until not in items):
            lost = self.link.lost
            remaining = int((deadline - time.monotonic()) * 1000)
            if remaining <= 0 and not lost:
                break  # the peer neither sends nor goes: give up on it
            try:  # once lost, only what has arrived is left
                frame = self.link.recv(0 if lost else min(remaining, LOST_POLL_MS))
            except pynng.Timeout:
                if lost:
                    break
                continue
            except pynng.NNGException:
                break
            if not self._acknowledged(frame):
                self.received += 1
                items.append(read_frame(frame))
        return [item for item in items if not isinstance(item, _Marker)]


# -- the reading job's side ----------------------------------------------------------------
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
                self._acknowledge()
            return item

    def _acknowledge(self) -> None:
        """Tell the owner an item is consumed (before the read returns it): from now on
        it is not given back to the pipe or queue if this job dies."""
        with self._send_lock:
            while self._sending and not self.link.lost:
                if self.link.send(ACK_FRAME, CANCEL_RETRY_MS):
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
    threading.Thread(target=reader.unlink, args=(sent,), daemon=True,
                     name="fiberlite-unlink").start()


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
    from ..config import get
    mailbox = _mailbox_ref()
    host = host_port(mailbox.address)[0]
    key = identity.key()
    try:
        link = Link.listen(host, key, use_tls=bool(get("tls")))
    except pynng.NNGException:
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
        except pynng.Timeout:
            continue
        except pynng.NNGException:
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
    thread = threading.Thread(target=lambda: [unlink_own(r.ref, r.end) for r in readers],
                              daemon=True, name="fiberlite-unlink-at-exit")
    thread.start()
    thread.join(timeout)


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


# -- the owner's side ----------------------------------------------------------------------
LINKING, LINKED, UNLINKING = "linking", "linked", "unlinking"


class Forwarder:
    """The owner's half of a link: where messages for a linked end go."""

    __slots__ = ("reader_peer", "mailbox", "token", "state", "link", "sent", "reading",
                 "take_lock", "taken", "unacked")

    def __init__(self, reader_peer: int, mailbox: ObjectRef, token: int) -> None:
        self.reader_peer = reader_peer
        self.mailbox = mailbox
        self.token = token
        self.state = LINKING
        self.link: Link | None = None
        self.reading: Reading | None = None  # what the reader sends into the other end
        self.sent = 0
        self.take_lock = threading.Lock()  # held while what the reader sent is taken
        self.taken = False
        # the items forwarded and not yet consumed by the reader (its ACK_FRAMEs), oldest first
        self.unacked: collections.deque = collections.deque()

    def connected(self, link: Link) -> None:
        self.link = link
        self.reading = Reading(link, on_ack=self.unacked.popleft)
        self.state = LINKED

    def forward(self, frame: Any, item: Payload | None = None) -> bool:
        """Send a frame to the reader (``item``: the payload it carries, kept until the
        reader consumes it); False if the link is full or gone."""
        if self.link is None:
            return False
        if len(self.unacked) >= ACK_DRAIN_AT and self.reading is not None and (
                not self.sent % ACK_DRAIN_EVERY or len(self.unacked) >= ACK_LIMIT):
            self.reading.take_acks()
            if len(self.unacked) >= ACK_LIMIT:
                return False
        if item is not None:  # kept before it goes: its acknowledgement may come at once
            self.unacked.append(item)
        if not self.link.send(frame, timeout_ms=0):
            if item is not None:
                self.unacked.pop()
            return False
        self.sent += 1
        return True

    def ask_back(self) -> None:
        """Ask the reader for what it has not consumed (answered by ``relinquish``)."""
        self.mailbox.cast("unlink", self.token, self.sent)

    def take_sent(self, until_end: bool) -> list:
        """Stop reading what the reader sent and take it all: up to its :data:`END`
        (``until_end``), or what arrives until its connection is gone. The caller holds
        :attr:`take_lock`, and hands the items over before releasing it."""
        self.taken = True
        if self.reading is None:
            return []  # never linked
        self.reading.stop()
        try:
            return self.reading.drain(until=END if until_end else None)
        finally:
            self.reading.lock.release()

    def close(self) -> None:
        if self.link is not None:
            self.link.close()
