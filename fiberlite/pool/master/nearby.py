"""The master's end of the workers that share its machine: a Unix socket each.

A worker on the master's machine (a job of its own, or forked in a host of a small
pool: :data:`~.core.NEARBY_HOSTED_MAX`) sends its requests over a stream socket in
Linux's abstract namespace (:class:`~..job.upstream.NearbyUpstream`) instead of its nng
connection to the master's hub or its host, from its first request that waits for work
on (a job of its own only those that wait for work). A request and its answer are then
one system call each way, read and written by the threads that make them, where nng
adds threads of its own on both sides (in one run on the 2-core machine, a ping-pong of
small messages between two processes took 190-250 us over nng and 27 us over a socket
pair) and a host one more hop. Each connection proves the run's key before anything it
sends is unpickled: the socket's door is the one every listener of fiberlite has
(:class:`~fiberlite.wire.doorman.Doorman`: a deadline, a bound, nothing read but the
handshake), which hands the connections that proved it to the reading thread.

One thread reads every worker's socket and hands what it read to the
:class:`~.dispatch.Dispatcher`, requests for work of one turn together, as the host
relay does (:mod:`.relay`): the dispatcher's bookkeeping is the same whichever way a
request came. Answers are written by whichever thread makes them, without waiting: what
a full socket does not take now is written by the reading thread once it has room. A
connection that ends is the dispatcher's ``peer_lost``, as a hub connection's would be:
what the worker held goes back to the queue (for a hosted worker, once its host says
how it ended). A worker that is a job of its own also presents its hub connection
(``present``), so that the hub giving its job up as silent (a frozen job) loses the
worker too.
"""
from __future__ import annotations

import logging
import os
import pickle
import selectors
import socket
import threading
from typing import Any

from ...wire import unix
from ...wire.codec import PROTOCOL
from ...wire.doorman import Doorman
from ...wire.frames import FrameSocket, header, widen
from ...wire.waking import WakingSelector
from .dispatch import Dispatcher

log = logging.getLogger(__name__)

_DONTWAIT = socket.MSG_DONTWAIT | getattr(socket, "MSG_NOSIGNAL", 0)
PEERS_BELOW = 1 << 48  # a connection's peer number is below minus this: not a host's -wid


def available() -> bool:
    """Whether this system has abstract Unix sockets (Linux)."""
    return hasattr(socket, "AF_UNIX") and os.uname().sysname == "Linux"


class _Connection:
    """One worker's socket: frames in (the reading thread), answers out (any thread)."""

    __slots__ = ("frames", "peer", "lock", "backlog", "gone")

    def __init__(self, sock: socket.socket, peer: int) -> None:
        self.frames = FrameSocket(sock.detach())
        self.peer = peer  # a negative id: never one of the hub's connections
        self.lock = threading.Lock()
        self.backlog = bytearray()  # what the socket has not taken yet
        self.gone = False

    def fileno(self) -> int:
        return self.frames.fileno()

    def send(self, message: tuple) -> bool:
        """Write ``message`` or queue it; True when the reading thread is to write the
        queue once the socket has room (it was empty before)."""
        data = pickle.dumps(message, PROTOCOL)
        frame = header(len(data)) + data
        with self.lock:
            if self.gone:
                return False
            if not self.backlog:
                try:
                    sent = self.frames.sock.send(frame, _DONTWAIT)
                except (BlockingIOError, InterruptedError):
                    sent = 0
                except OSError:
                    return False  # it ended: the reading thread hears of it
                if sent == len(frame):
                    return False
                self.backlog += memoryview(frame)[sent:]
                return True
            self.backlog += frame
            return False

    def write_backlog(self) -> bool:
        """(the reading thread, the socket writable) Write what waits; True when all went."""
        with self.lock:
            try:
                sent = self.frames.sock.send(self.backlog, _DONTWAIT)
            except (BlockingIOError, InterruptedError):
                return False
            except OSError:
                self.backlog.clear()
                return True
            del self.backlog[:sent]
            return not self.backlog


class _NearbyRequest:
    """A nearby worker's request, answered on its socket (``seq`` 0: one-way)."""

    __slots__ = ("owner", "conn", "seq", "peer")

    def __init__(self, owner: "NearbyWorkers", conn: _Connection, seq: int) -> None:
        self.owner = owner
        self.conn = conn
        self.seq = seq
        self.peer = conn.peer

    def reply(self, value: Any = None) -> None:
        if self.seq:
            self.owner.send(self.conn, (self.seq, True, value))

    def fail(self, exc: BaseException) -> None:
        if self.seq:
            self.owner.send(self.conn, (self.seq, False, exc))


class NearbyWorkers:
    """Listens for the pool's workers of this machine and serves their requests."""

    def __init__(self, dispatcher: Dispatcher, key: bytes) -> None:
        self.dispatcher = dispatcher
        self.key = key
        listening, self.address = unix.listen_abstract("pool", 128, blocking=False)
        self._selector = WakingSelector()
        self._proven: list[socket.socket] = []  # connections that proved the key, to serve
        self._writable: list[_Connection] = []  # connections with a backlog to watch
        self._lock = threading.Lock()
        self._peers = 0
        self._closed = False
        self._doorman = Doorman(listening, key, None, None, "the pool's socket",
                                hand_over=self._admit)
        self._thread = threading.Thread(target=self._serve, name="fiberlite-pool-nearby",
                                        daemon=True)
        self._thread.start()
        self._doorman.serve()

    # -- answers (any thread) -----------------------------------------------------------------
    def send(self, conn: _Connection, message: tuple) -> None:
        if conn.send(message):
            with self._lock:
                self._writable.append(conn)
            self._selector.wake()

    # -- the reading thread ----------------------------------------------------------------------
    def _serve(self) -> None:
        try:
            while not self._closed:
                nexts: list = []
                ready, woken = self._selector.select()
                if woken:
                    self._take_new()
                for key, events in ready:
                    if events & selectors.EVENT_WRITE and key.data.write_backlog():
                        self._selector.modify(key.fileobj, selectors.EVENT_READ, key.data)
                    if events & selectors.EVENT_READ:
                        self._read(key.data, nexts)
                if nexts:
                    self._handle_nexts(nexts)
        except Exception:
            if not self._closed:
                log.exception("the pool's nearby workers' thread failed")
        finally:
            self._close_all()

    def _take_new(self) -> None:
        """Serve the connections that proved the key, watch those with a backlog."""
        with self._lock:
            proven, self._proven = self._proven, []
            writable, self._writable = self._writable, []
        for sock in proven:
            self._peers += 1
            conn = _Connection(sock, -(PEERS_BELOW + self._peers))
            self._selector.register(conn, selectors.EVENT_READ, conn)
        for conn in writable:
            if not conn.gone:
                self._selector.modify(conn, selectors.EVENT_READ | selectors.EVENT_WRITE, conn)

    def _admit(self, sock: socket.socket) -> None:
        """(the doorman's thread) ``sock`` proved the key: the reading thread serves it."""
        sock.settimeout(None)
        widen(sock)
        with self._lock:
            if not self._closed:
                self._proven.append(sock)
                sock = None
        if sock is None:
            self._selector.wake()
        else:
            sock.close()

    def _read(self, conn: _Connection, nexts: list) -> None:
        try:
            frames = conn.frames.read_frames()
        except (EOFError, OSError):
            self._lost(conn, nexts)
            return
        for frame in frames:
            try:
                seq, method, args = pickle.loads(frame)
            except Exception as exc:
                log.warning("undecodable request from a pool worker: %s", exc)
                self._lost(conn, nexts)
                return
            request = _NearbyRequest(self, conn, seq)
            if method == "next":
                nexts.append((request, args))
                continue
            self._handle_nexts(nexts)
            try:
                self.dispatcher.dispatch(request, method, args)
            except Exception as exc:  # a bad request must not stop this thread
                log.exception("pool request %r failed", method)
                request.fail(exc)

    def _handle_nexts(self, nexts: list) -> None:
        """Requests for work read in order, handed to the dispatcher together."""
        if nexts:
            calls = nexts[:]
            nexts.clear()
            self.dispatcher.next_many(calls)

    def _lost(self, conn: _Connection, nexts: list) -> None:
        """``conn`` ended: what came before is handled first, then the worker is lost."""
        self._handle_nexts(nexts)
        with conn.lock:
            conn.gone = True
            conn.backlog.clear()
        try:
            self._selector.unregister(conn)
        except (KeyError, ValueError):
            pass
        conn.frames.close()
        self.dispatcher.peer_lost(conn.peer)

    # -- closing ----------------------------------------------------------------------------------
    def close(self) -> None:
        """Stop listening and serving (the pool is done)."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
        self._doorman.close()
        self._selector.wake()
        if threading.current_thread() is not self._thread:
            self._thread.join(timeout=5)

    def _close_all(self) -> None:
        with self._lock:
            self._closed = True
            proven, self._proven = self._proven, []
        for sock in proven:
            sock.close()
        for key in self._selector.keys():
            with key.data.lock:
                key.data.gone = True
            key.data.frames.close()
        self._selector.close()
        self._doorman.close()
