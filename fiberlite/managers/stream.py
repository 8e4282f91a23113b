"""A manager's calls on connections of their own: one per calling thread, as the stdlib's.

A call through the hub crosses nng's threads on both sides and the server's hand-off to
the thread it runs on: five thread wake-ups a round trip. Here a calling thread writes
its request on a connection of its own and the server's thread for that connection runs
it and writes the reply: two wake-ups, the stdlib manager's cost.

Listening (:class:`CallListener`, in the manager's server): two listeners of the wire's
(:func:`fiberlite.wire.link.serve`), on TCP where the server's job listens, and on a
Linux abstract Unix name, which callers on the same machine (same kernel and network
namespace, :func:`~fiberlite.runtime.machine.machine_id`) use instead. Each connection
gets a thread, proves the key first (the wire's handshake, under its gate): nothing is
unpickled before. Then it answers requests in order with ``handle(request)``, until the
caller closes the connection (its thread ended) or the listener closes.

Calling (:func:`call`): the calling thread's connection to that server, made on first
use and closed when the thread ends. A connection that fails raises
:class:`ConnectionError`: the caller decides what that means (:mod:`.calls`).

Each request and reply is one frame of a :class:`~fiberlite.wire.link.StreamLink`
(:class:`Framed`): the pickle alone, or, with out-of-band buffers, their sizes, the pickle
and the buffers, which are sent without a copy into it. What is
pickled, and how, is the caller's business (:mod:`fiberlite.managers.calls`).
"""
from __future__ import annotations

import socket
import struct
import threading
import weakref
from typing import Callable

from ..errors import AuthenticationError
from ..runtime.machine import machine_id
from ..wire import link as links
from ..wire import tcp
from ..wire.link import LinkError, StreamLink
from ..wire.link.listener import ABSTRACT

__all__ = ["CallListener", "call", "CallAddress", "Unreachable"]

# where a server listens: (tcp host, tcp port, abstract name, machine id)
CallAddress = tuple
Parts = tuple  # (pickle, out-of-band buffers)


class Unreachable(ConnectionError):
    """No connection could be made to a server's call address from this process."""


# -- frames ----------------------------------------------------------------------------------------
PICKLE = 0x80  # how a pickle (protocol 2 and later) starts: a frame that is only one
WITH_BUFFERS = b"B"  # how a frame with out-of-band buffers starts, before its sizes
_COUNT = struct.Struct("<BI")  # that mark, how many buffers


class Framed:
    """A link carrying calls: each a pickle and its out-of-band buffers, as one frame of
    the link. A call without buffers (as nearly all) is its pickle alone; one with
    buffers starts with :data:`WITH_BUFFERS`, their count and the sizes of the pickle and
    of each buffer (``u64``), then the pickle and the buffers, sent without a copy.
    A receive sleeps at once (the peer runs Python before it answers: looking awake
    for the reply would only take a CPU from it)."""

    __slots__ = ("link", "__weakref__")

    def __init__(self, link: StreamLink) -> None:
        self.link = link
        link.awake = False

    def send(self, parts: Parts) -> None:
        """Send a pickle and its out-of-band buffers (``(data, buffers)``) as one frame."""
        data, buffers = parts
        if not buffers:
            sent = self.link.send(data, -1)
        else:
            views = [memoryview(b).cast("B") for b in buffers]
            head = _COUNT.pack(WITH_BUFFERS[0], len(views)) + struct.pack(
                f"<{len(views) + 1}Q", len(data), *map(len, views))
            sent = self.link.send((head, data, *views), -1)
        if not sent:
            raise ConnectionError("the connection ended")

    def receive(self) -> Parts:
        """The ``(data, buffers)`` of the next frame (the buffers writable, as received
        arrays are); ``ConnectionError`` if the connection ends first."""
        try:
            frame = self.link.recv()
        except LinkError as exc:
            raise ConnectionError(f"the connection ended ({type(exc).__name__})") from None
        if frame and frame[0] == PICKLE:  # (as nearly always)
            return frame, []
        if len(frame) < _COUNT.size or frame[0] != WITH_BUFFERS[0]:
            raise ConnectionError("the connection carried a frame that is not a call")
        count = _COUNT.unpack_from(frame)[1]
        size, *lengths = struct.unpack_from(f"<{count + 1}Q", frame, _COUNT.size)
        view = memoryview(frame)
        at = _COUNT.size + 8 * (count + 1)
        data = view[at:at + size]
        at += size
        buffers = []
        for n in lengths:  # a small frame is bytes: its buffers get memory of their own
            buffers.append(view[at:at + n] if type(frame) is bytearray else bytearray(view[at:at + n]))
            at += n
        return data, buffers

    def close(self) -> None:
        self.link.close()


# -- the listening side ------------------------------------------------------------------------------
class CallListener:
    """Serves ``handle(request) -> reply`` (both :data:`Parts`) to peers that prove
    ``key``, a thread per connection; ``address`` tells callers where."""

    def __init__(self, handle: Callable[[Parts], Parts], host: str, key: bytes, name: str) -> None:
        self._handle = handle
        self._tcp = links.serve("tcp", host, key, self._answer, name)
        try:
            self._local: links.Listener | None = links.serve("abstract", "manager", key, self._answer, name)
            abstract = self._local.address[len(ABSTRACT):]
        except OSError:  # no abstract sockets here: TCP only
            self._local, abstract = None, None
        self.address: CallAddress = (host, tcp.host_port(self._tcp.address)[1], abstract, machine_id())

    @property
    def connections(self) -> int:
        """Connections proved and served now."""
        return sum(listener.connections for listener in (self._tcp, self._local) if listener is not None)

    def _answer(self, sock: socket.socket) -> None:
        handle = self._handle
        framed = Framed(StreamLink.over(sock, "a manager's caller", None))
        try:
            while True:
                try:
                    request = framed.receive()
                except OSError:
                    return  # the caller's thread ended, or the listener closed
                reply = handle(request)
                del request
                try:
                    framed.send(reply)
                except OSError:
                    return
                del reply
        finally:
            framed.close()

    def close(self) -> None:
        """Stop listening and end every connection (a call under way fails for its caller)."""
        for listening in (self._tcp, self._local):
            if listening is not None:
                listening.close()


# -- the calling side --------------------------------------------------------------------------------
def _connect(address: CallAddress, key: bytes, peer: str) -> Framed:
    """A connection to the server at ``address``, which proved ``key``."""
    host, port, abstract, machine = address
    if abstract is not None and machine == machine_id():
        where = ABSTRACT + abstract
    else:
        where = tcp.address(host, port)
    try:
        link = links.dial(where, key)
    except AuthenticationError as exc:
        raise AuthenticationError(str(exc).replace(where, peer)) from None
    framed = Framed(link)
    weakref.finalize(framed, link.close)  # when its thread ends
    return framed


_open: dict[str, "weakref.WeakSet[Framed]"] = {}  # the connections to each server, by its name
_open_lock = threading.Lock()


def abandon(server: str) -> None:
    """The server named ``server`` is gone (its hub connection ended, or was given up as
    silent): every connection to it, on every thread, is shut down, so that a call
    waiting for a reply fails now instead of waiting for ever."""
    with _open_lock:
        connections = list(_open.pop(server, ()))
    for framed in connections:
        framed.close()


_local = threading.local()


def call(address: CallAddress, key: bytes, request: Parts, server: str) -> Parts:
    """Send ``request`` to the server at ``address`` (which must prove ``key``; errors
    call it "the manager at ``server``") on this thread's connection to it, and return
    the reply. :class:`Unreachable` if no
    connection can be made, :class:`~fiberlite.errors.AuthenticationError` if the server
    does not prove the key, ``ConnectionError`` if the connection ends; a connection
    that failed is not used again."""
    connections = getattr(_local, "connections", None)
    if connections is None:
        connections = _local.connections = {}
    slot = (address, key)
    connection = connections.get(slot)
    if connection is None:
        peer = f"the manager at {server}"
        try:
            connection = _connect(address, key, peer)
        except AuthenticationError:
            raise
        except OSError as exc:
            raise Unreachable(f"cannot connect to {peer}: {exc}") from None
        connections[slot] = connection
        with _open_lock:
            _open.setdefault(server, weakref.WeakSet()).add(connection)
    try:
        connection.send(request)
        return connection.receive()
    except BaseException:
        del connections[slot]  # mid-request (an interrupt too): never reused
        connection.close()
        raise

