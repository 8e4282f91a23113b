"""Calls to a servant of another process over direct connections (:mod:`fiberlite.wire.direct`),
where the servant's hub offers them; through the hub's nng connection otherwise.

The shared primitives make their calls here: a call on a TCP link (:mod:`fiberlite.wire.link.tcp`) that
the calling thread writes and reads itself costs one TCP round trip and the two
sides' Python, where an nng request also crosses threads of nng's on both sides
(docs/performance.md, "Across machines"). The direct connection speaks for this process's nng
connection to the same hub, so the servant sees one caller whichever path a call took.

Order: requests on one connection are handled in the order they were sent. Before a
direct call, the one-way requests this process sent to that hub over nng (a queue's
puts) are waited for, so that what was sent before the call is seen before it.

One-way calls (:func:`post`: an event's ``set`` and ``clear``, a release that carries
its object back) are written and not waited for: every later call of this process to
the same hub, on any of its connections, is handled after them (the hub keeps it back
until then, :mod:`fiberlite.wire.direct`), and what this process sends anywhere else
waits until they are handled (:mod:`fiberlite.wire.oneway`), as does its exit.
"""
from __future__ import annotations

import collections
import os
import threading
from typing import Any, Callable

from . import exit_order, identity
from .dialed import connect
from .hub import DIRECT, ObjectRef, current_hub
from ..wire import oneway, tls
from ..wire.client import Client
from ..wire.direct import DirectConnection

UNAVAILABLE = "unavailable"


class _Channel:
    """The direct connections of this process to one hub: an idle one per thread that
    called, reused by any; and the count of its one-way calls, sent (``posted``) and
    known to be handled (``handled``)."""

    def __init__(self, client: Client, address: str, ticket: bytes) -> None:
        self.client = client
        self.address = address
        self.ticket = ticket
        self.alive = True
        self.posted = 0
        self.handled = 0
        self.doubtful: list[tuple[int, Any]] = []  # one-way calls that may not have gone
        self._idle: collections.deque[DirectConnection] = collections.deque()
        self._all: set[DirectConnection] = set()
        self._lock = threading.Lock()
        self.posting = threading.Lock()  # one-way calls are numbered in the order they go

    def answered(self, after: int) -> None:
        """A call made after the one-way call ``after`` was answered: that one and those
        before it are handled."""
        with self.posting:
            if after > self.handled:
                self.handled = after
            if self.handled >= self.posted:
                oneway.paid(self)

    def settle(self) -> None:
        """Return once every one-way call sent so far is handled (a call that waits for
        its turn); on a connection that fails, give up: the hub has recovered them."""
        after = self.posted
        if self.handled >= after:
            return
        try:
            conn = self.take()
        except (OSError, ConnectionError):
            self._give_up(after)
            return
        try:
            self.resend_doubtful(conn)
            conn.call(None, after)
        except (OSError, ValueError):
            self.discard(conn)
            self._give_up(after)
            return
        except BaseException:
            self.discard(conn)
            raise
        self.give_back(conn)
        self.answered(after)

    def _give_up(self, after: int) -> None:
        """Settling failed (the hub is going, and recovers what this process held there):
        owe nothing more for the calls up to ``after``."""
        with self.posting:
            if self.posted == after:
                oneway.paid(self)

    def resend_doubtful(self, conn: DirectConnection) -> None:
        """Send again the one-way calls whose send was interrupted (the hub drops those
        that came), before anything else on ``conn``."""
        while self.doubtful:
            number, message = self.doubtful[0]
            if not conn.post(message, number):
                raise ConnectionError("the direct connection was closed")
            del self.doubtful[0]

    def take(self) -> DirectConnection:
        try:
            return self._idle.pop()
        except IndexError:
            pass
        conn = DirectConnection(self.address, self.ticket, identity.key())
        with self._lock:
            if not self.alive:
                conn.close()
                raise ConnectionError("closed")
            self._all.add(conn)
        return conn

    def give_back(self, conn: DirectConnection) -> None:
        self._idle.append(conn)

    def discard(self, conn: DirectConnection) -> None:
        with self._lock:
            self._all.discard(conn)
        conn.close()

    def close(self) -> None:
        """(the nng connection ended) Every direct call under way fails."""
        with self._lock:
            self.alive = False
            conns, self._all = list(self._all), set()
        self._idle.clear()
        oneway.paid(self)  # (the hub recovers what this process held there)
        for conn in conns:
            conn.close()


_channels: dict[str, Any] = {}  # address -> _Channel, or UNAVAILABLE
_lock = threading.Lock()


def _forget_all() -> None:
    """(a forked child) The parent's direct connections are not this process's."""
    global _lock
    _channels.clear()
    _lock = threading.Lock()
    oneway.forget_all()


os.register_at_fork(after_in_child=_forget_all)


def _channel(address: str) -> _Channel | None:
    channel = _channels.get(address)
    if channel is UNAVAILABLE:
        return None
    if channel is not None and channel.alive:
        return channel
    if tls.is_tls(address):
        _channels[address] = UNAVAILABLE
        return None
    client = connect(address)
    with _lock:
        channel = _channels.get(address)
        if isinstance(channel, _Channel) and channel.alive and channel.client is client:
            return channel
        ok, offer = client.request((0, DIRECT, ()))
        if not ok or offer is None:
            _channels[address] = UNAVAILABLE
            return None
        channel = _channels[address] = _Channel(client, *offer)
    client.on_lost(channel.close)
    return channel


def _direct(ref: ObjectRef) -> _Channel | None:
    """The channel of ``ref``'s hub, once what this process sent elsewhere before is
    settled (None: through the hub's nng connection, or in this process)."""
    hub = current_hub()
    channel = None if hub is not None and hub.address == ref.address else _channel(ref.address)
    if oneway.unsettled and (len(oneway.unsettled) > 1 or channel not in oneway.unsettled):
        _settle_others(channel)
    if channel is not None and channel.client.unsynced:  # what went before over nng is handled first
        channel.client.flush()
    return channel


def _settle_others(channel: _Channel | None) -> None:
    for key, settle in list(oneway.unsettled.items()):
        if key is not channel:
            settle()


def call(ref: ObjectRef, method: str, *args: Any, interruptible: bool = False,
         interrupted: tuple | None = None,
         kept: Callable[[bool, Any], None] | None = None, receipts: tuple = ()) -> Any:
    """``ref.call(method, *args)`` (``ref.wait`` with ``interruptible``), directly where
    the servant's hub offers it. ``interrupted``: ``(method, *args)`` of the servant's
    call that withdraws this one, made on the same connection (so that it is handled
    after this one) when a signal's handler interrupts the wait; the interruption is
    raised after it. ``kept``: given the interrupted call's own answer ``(ok, value)``
    when one came before the withdrawal's (a queue's read hands back the item it was
    lent), else its answer is dropped. ``receipts``: handled before the call (on a direct
    connection; through the hub they go with its message anyway)."""
    channel = _direct(ref)
    if channel is None:
        return _through_hub(ref, method, args, interruptible, interrupted, kept)
    try:
        conn = channel.take()
    except (OSError, ConnectionError):
        channel.close()
        return _through_hub(ref, method, args, interruptible, interrupted, kept)
    after = channel.posted
    try:
        channel.resend_doubtful(conn)
        ok, value = conn.call((ref.oid, method, args, receipts) if receipts else (ref.oid, method, args),
                              after)
    except (OSError, ValueError):
        channel.discard(conn)
        if _gone(channel):
            raise _lost(channel) from None
        raise
    except BaseException:
        # interrupted (Ctrl-C), before the request left, or after: a withdrawal is
        # harmless if the call never came, and handled after it if it did
        if interrupted is not None and not conn.broken:
            _withdraw(channel, conn, ref, interrupted, kept)
        else:
            channel.discard(conn)  # (the answer, if any comes, is dropped with it)
        raise
    channel.give_back(conn)
    if after > channel.handled:
        channel.answered(after)
    if receipts:  # (handled before the call: the nng connection need not carry them too)
        channel.client.drop_riders(receipts)
    if ok:
        return value
    raise value


def post(ref: ObjectRef, method: str, *args: Any) -> None:
    """``ref.call(method, *args)`` for a call whose answer says nothing (it cannot fail
    but with the connection): sent one-way where the servant's hub offers direct calls
    (see the module's doc), else made and waited for."""
    channel = _direct(ref)
    if channel is None:
        _through_hub(ref, method, args, False, None)
        return
    try:
        conn = channel.take()
    except (OSError, ConnectionError):
        channel.close()
        _through_hub(ref, method, args, False, None)
        return
    message = (ref.oid, method, args)
    with channel.posting:
        number = channel.posted + 1
        try:
            channel.resend_doubtful(conn)
            sent = conn.post(message, number)
        except (OSError, ValueError):
            sent = False
        except BaseException:  # interrupted: it went or not; sent again before anything else
            channel.posted = number
            channel.doubtful.append((number, message))
            oneway.owe(channel, channel.settle)
            channel.discard(conn)
            raise
        if sent:
            channel.posted = number
            oneway.owe(channel, channel.settle)
    if not sent:
        channel.discard(conn)
        if not channel.alive:
            raise _lost(channel)
        call(ref, method, *args)  # (on a connection of its own: the hub answers it)
        return
    channel.give_back(conn)


def _through_hub(ref: ObjectRef, method: str, args: tuple, interruptible: bool,
                 interrupted: tuple | None, kept: Callable[[bool, Any], None] | None = None) -> Any:
    """The call through the hub's nng connection (or in this process, for its own hub)."""
    if not interruptible:
        return ref.call(method, *args)
    if kept is not None and interrupted is not None:
        def withdraw(reply: Callable[[], Any]) -> None:
            ref.call(*interrupted)
            kept(*reply())
        return ref.wait(method, *args, on_interrupt=withdraw)
    try:
        return ref.wait(method, *args)  # Ctrl-C interrupts it
    except Exception:
        raise
    except BaseException:
        if interrupted is not None:
            try:
                ref.call(*interrupted)
            except Exception:
                pass
        raise


def _withdraw(channel: _Channel, conn: DirectConnection, ref: ObjectRef, interrupted: tuple,
              kept: Callable[[bool, Any], None] | None = None) -> None:
    """The call on ``conn`` was interrupted: withdraw it on the same connection and wait
    for the withdrawal's answer (the call's own, if it came, goes to ``kept``, else it is
    dropped); a connection that cannot be read to its end is closed."""
    call_seq = conn.seq
    try:
        replies = conn.replies(conn.request((ref.oid, interrupted[0], tuple(interrupted[1:]))))
    except BaseException:
        channel.discard(conn)
        return
    channel.give_back(conn)
    if kept is not None and call_seq in replies:
        try:
            kept(*replies[call_seq])
        except Exception:
            pass  # (a lost connection: the servant takes back what it lent)


LOSS_PATIENCE = 1.0  # seconds a broken direct connection waits for its hub's loss to be known


def _gone(channel: _Channel) -> bool:
    """Whether the hub's process is gone (or given up): a direct connection that broke is
    usually the end of that process seen a moment before its nng connection sees it."""
    if not channel.alive:
        return True
    lost = threading.Event()
    channel.client.on_lost(lost.set)  # (at once if it is lost already)
    return lost.wait(LOSS_PATIENCE)


def _lost(channel: _Channel) -> ConnectionError:
    from ..errors import ConnectionLost
    return ConnectionLost(f"connection to {channel.client.address} was lost "
                          f"({channel.client.lost_reason})")


exit_order.at_exit("links", oneway.settle)  # what a job's last calls did is seen once it has gone

__all__ = ["call", "post"]
