"""A manager's calls on connections of their own: one per calling thread, as the stdlib's.

A call through the hub crosses nng's threads on both sides and the server's hand-off to
the thread it runs on: five thread wake-ups a round trip. Here a calling thread writes
its request on a connection of its own and the server's thread for that connection runs
it and writes the reply: two wake-ups, the stdlib manager's cost.

Listening (:class:`CallListener`, in the manager's server): on TCP where the server's job
listens, and on a Linux abstract Unix socket, which callers on the same machine (same
kernel and network namespace, :func:`~fiberlite.runtime.machine.machine_id`) use
instead. Each connection gets a thread. It first runs the key handshake
(:func:`~fiberlite.wire.auth.check_on`, under a
:class:`~fiberlite.wire.gate.Gate`: a deadline, and a bound on connections that have not
proved the key): nothing is unpickled before. Then it answers requests in order with
``handle(request)``, until the caller closes the connection (its thread ended) or the
listener closes.

Calling (:func:`call`): the calling thread's connection to that server, made on first
use and closed when the thread ends. A connection that fails raises
:class:`ConnectionError`: the caller decides what that means (:mod:`.calls`).

Frames, both ways: ``u32 pickle length, u32 buffer count, u64 length per buffer``, the
pickle, then its out-of-band buffers, which travel without a copy into it. What is
pickled, and how, is the caller's business (:mod:`fiberlite.managers.calls`).
"""
from __future__ import annotations

import socket
import struct
import threading
import time
import weakref
from typing import Callable

from ..errors import AuthenticationError
from ..runtime.machine import machine_id
from ..wire import auth, unix
from ..wire.binding import bind_host
from ..wire.gate import Check, Gate

__all__ = ["CallListener", "call", "CallAddress", "Unreachable"]

HANDSHAKE_SECONDS = 10.0
CONNECT_SECONDS = 10.0
UNPROVEN_AT_ONCE = 64  # connections that have not proved the key yet, at most
READ_SIZE = 64 << 10  # bytes a receive takes in one system call, at most
_HEAD = struct.Struct("<II")

# where a server listens: (tcp host, tcp port, abstract name, machine id)
CallAddress = tuple
Parts = tuple  # (pickle, out-of-band buffers)


class Unreachable(ConnectionError):
    """No connection could be made to a server's call address from this process."""


# -- frames ----------------------------------------------------------------------------------------
class Framed:
    """A connected stream socket carrying frames.

    A receive takes what has arrived, up to :data:`READ_SIZE` bytes, in one system
    call: a small frame costs one. Its pickle is then a view of this connection's
    buffer, valid until the next receive (callers unpickle it at once); out-of-band
    buffers are always memory of their own."""

    __slots__ = ("sock", "_view", "_pos", "_end", "__weakref__")

    def __init__(self, sock: socket.socket) -> None:
        self.sock = sock
        self._view = memoryview(bytearray(READ_SIZE))
        self._pos = self._end = 0  # the bytes received and not read yet: [pos:end]

    def send(self, parts: Parts) -> None:
        """Send a pickle and its out-of-band buffers (``(data, buffers)``) as one frame."""
        data, buffers = parts
        if not buffers:
            self.sock.sendall(_HEAD.pack(len(data), 0) + data)
            return
        views = [memoryview(b).cast("B") for b in buffers]
        self.sock.sendall(_HEAD.pack(len(data), len(views))
                          + struct.pack(f"<{len(views)}Q", *map(len, views)) + data)
        for view in views:
            self.sock.sendall(view)

    def receive(self) -> Parts:
        """The ``(data, buffers)`` of the next frame (the buffers writable, as received
        arrays are); ``ConnectionError`` if the connection ends first."""
        if self._pos == self._end:
            self._pos = self._end = 0
        size, count = _HEAD.unpack(self._read(_HEAD.size))
        lengths = struct.unpack(f"<{count}Q", self._read(8 * count)) if count else ()
        data = self._read(size)
        return data, [_own(self._read(n)) for n in lengths]

    def _read(self, n: int) -> memoryview | bytearray:
        """The next ``n`` bytes: a view of the buffer, or memory of their own when they
        do not fit in it."""
        pos, end, view = self._pos, self._end, self._view
        if n <= len(view) - pos:
            while end - pos < n:
                got = self.sock.recv_into(view[end:])
                if not got:
                    raise ConnectionError("the connection ended")
                end += got
            self._pos, self._end = pos + n, end
            return view[pos:pos + n]
        out = bytearray(n)
        have = end - pos
        out[:have] = view[pos:end]
        self._pos = self._end = 0
        into = memoryview(out)
        while have < n:
            got = self.sock.recv_into(into[have:])
            if not got:
                raise ConnectionError("the connection ended")
            have += got
        return out

    def close(self) -> None:
        self.sock.close()


def _own(data: memoryview | bytearray) -> bytearray:
    return data if type(data) is bytearray else bytearray(data)


# -- the listening side ------------------------------------------------------------------------------
class CallListener:
    """Serves ``handle(request) -> reply`` (both :data:`Parts`) to peers that prove
    ``key``, a thread per connection; ``address`` tells callers where."""

    def __init__(self, handle: Callable[[Parts], Parts], host: str, key: bytes, name: str) -> None:
        self._handle = handle
        self._key = key
        self._name = name
        self._lock = threading.Lock()
        self._connections: set[socket.socket] = set()
        self._closed = False
        self._gate = Gate(HANDSHAKE_SECONDS, UNPROVEN_AT_ONCE, name)
        bind = bind_host(host).strip("[]")
        family = socket.AF_INET6 if ":" in bind else socket.AF_INET
        self._tcp = socket.create_server((bind, 0), family=family, backlog=128)
        try:
            self._local, abstract = unix.listen_abstract("manager", 128)
        except OSError:  # no abstract sockets here: TCP only
            self._local, abstract = None, None
        self.address: CallAddress = (host, self._tcp.getsockname()[1], abstract, machine_id())
        for listening in (self._tcp, self._local):
            if listening is not None:
                threading.Thread(target=self._accept, args=(listening,), daemon=True,
                                 name="fiberlite-manager-accept").start()

    @property
    def connections(self) -> int:
        """Connections proved and served now."""
        with self._lock:
            return len(self._connections)

    def _accept(self, listening: socket.socket) -> None:
        while True:
            try:
                sock, _ = listening.accept()
            except OSError:
                return  # closed
            if sock.family != socket.AF_UNIX:
                sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            check = Check(sock.fileno)
            self._gate.admit(check, check.cut)
            threading.Thread(target=self._serve, args=(sock, check), daemon=True,
                             name=f"{self._name}-connection").start()

    def _serve(self, sock: socket.socket, check: Check) -> None:
        with sock:
            proved = auth.check_on(sock, self._key, time.monotonic() + HANDSHAKE_SECONDS,
                                   lambda: self._gate.started(check))
            check.over()
            if not self._gate.passed(check) or not proved:
                return
            sock.settimeout(None)
            with self._lock:
                if self._closed:
                    return
                self._connections.add(sock)
            try:
                self._answer(sock)
            finally:
                with self._lock:
                    self._connections.discard(sock)

    def _answer(self, sock: socket.socket) -> None:
        handle = self._handle
        framed = Framed(sock)
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

    def close(self) -> None:
        """Stop listening and end every connection (a call under way fails for its caller)."""
        with self._lock:
            self._closed = True
            connections = list(self._connections)
        self._gate.close()
        for listening in (self._tcp, self._local):
            if listening is not None:
                _shut(listening)
                listening.close()
        for sock in connections:
            _shut(sock)


def _shut(sock: socket.socket) -> None:
    try:
        sock.shutdown(socket.SHUT_RDWR)  # wakes the thread blocked on it
    except OSError:
        pass


# -- the calling side --------------------------------------------------------------------------------
def _connect(address: CallAddress, key: bytes, peer: str) -> Framed:
    """A connection to the server at ``address``, which proved ``key``."""
    host, port, abstract, machine = address
    if abstract is not None and machine == machine_id():
        sock = unix.connect_abstract(abstract, CONNECT_SECONDS)
    else:
        sock = socket.create_connection((host.strip("[]"), port), timeout=CONNECT_SECONDS)
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    try:
        auth.prove_on(sock, key, peer, time.monotonic() + HANDSHAKE_SECONDS)
        sock.settimeout(None)
    except BaseException:
        sock.close()
        raise
    framed = Framed(sock)
    weakref.finalize(framed, sock.close)  # when its thread ends
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
        _shut(framed.sock)


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

