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
"""
from __future__ import annotations

import collections
import os
import threading
from typing import Any

from . import identity
from .dialed import connect
from .hub import DIRECT, ObjectRef, current_hub
from ..wire import tls
from ..wire.client import Client
from ..wire.direct import DirectConnection

UNAVAILABLE = "unavailable"


class _Channel:
    """The direct connections of this process to one hub: an idle one per thread that
    called, reused by any."""

    def __init__(self, client: Client, address: str, ticket: bytes) -> None:
        self.client = client
        self.address = address
        self.ticket = ticket
        self.alive = True
        self._idle: collections.deque[DirectConnection] = collections.deque()
        self._all: set[DirectConnection] = set()
        self._lock = threading.Lock()

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
        for conn in conns:
            conn.close()


_channels: dict[str, Any] = {}  # address -> _Channel, or UNAVAILABLE
_lock = threading.Lock()


def _forget_all() -> None:
    """(a forked child) The parent's direct connections are not this process's."""
    global _lock
    _channels.clear()
    _lock = threading.Lock()


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


def call(ref: ObjectRef, method: str, *args: Any, interruptible: bool = False,
         interrupted: tuple | None = None) -> Any:
    """``ref.call(method, *args)`` (``ref.wait`` with ``interruptible``), directly where
    the servant's hub offers it. ``interrupted``: ``(method, *args)`` of the servant's
    call that withdraws this one, made on the same connection (so that it is handled
    after this one) when a signal's handler interrupts the wait; the interruption is
    raised after it."""
    hub = current_hub()
    channel = None if hub is not None and hub.address == ref.address else _channel(ref.address)
    if channel is None:
        return _through_hub(ref, method, args, interruptible, interrupted)
    client = channel.client
    if client.unsynced:  # what went before over nng is handled first
        client.flush()
    try:
        conn = channel.take()
    except (OSError, ConnectionError):
        channel.close()
        return _through_hub(ref, method, args, interruptible, interrupted)
    try:
        ok, value = conn.call((ref.oid, method, args))
    except (OSError, ValueError):
        channel.discard(conn)
        if not channel.alive:
            raise _lost(channel) from None
        raise
    except BaseException:
        # interrupted (Ctrl-C), before the request left, or after: a withdrawal is
        # harmless if the call never came, and handled after it if it did
        if interrupted is not None and not conn.broken:
            _withdraw(channel, conn, ref, interrupted)
        else:
            channel.discard(conn)  # (the answer, if any comes, is dropped with it)
        raise
    channel.give_back(conn)
    if ok:
        return value
    raise value


def _through_hub(ref: ObjectRef, method: str, args: tuple, interruptible: bool,
                 interrupted: tuple | None) -> Any:
    """The call through the hub's nng connection (or in this process, for its own hub)."""
    if not interruptible:
        return ref.call(method, *args)
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


def _withdraw(channel: _Channel, conn: DirectConnection, ref: ObjectRef, interrupted: tuple) -> None:
    """The call on ``conn`` was interrupted: withdraw it on the same connection and wait
    for the withdrawal's answer (the call's own, if any, is dropped); a connection that
    cannot be read to its end is closed."""
    try:
        conn.call((ref.oid, interrupted[0], tuple(interrupted[1:])))
    except BaseException:
        channel.discard(conn)
        return
    channel.give_back(conn)


def _lost(channel: _Channel) -> ConnectionError:
    from ..errors import ConnectionLost
    return ConnectionLost(f"connection to {channel.client.address} was lost "
                          f"({channel.client.lost_reason})")


__all__ = ["call"]
