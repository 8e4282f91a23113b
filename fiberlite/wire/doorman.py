"""Connections reach an nng socket only after their peer has proved the run's key.

nng reads whole messages, of any announced size, from any connection it accepted, and
keeps connections that never speak: a peer without the key could make a process
allocate gigabytes, or hold thousands of descriptors, before :mod:`fiberlite.wire.auth`
ran as messages. So the listening side accepts plain stream sockets itself
(:class:`Doorman`: one thread, non-blocking sockets, a selector), admits each to a
:class:`~fiberlite.wire.gate.Gate` (a deadline and a bound), reads only the two
handshake steps of fixed, small size, and hands a connection to nng only once its peer
proved the key (:mod:`.handover`). The dialing side's half is :mod:`.dialer`.

Every nng call here is made under the owner's :class:`~fiberlite.wire.guard.CallGuard`.
"""
from __future__ import annotations

import collections
import logging
import selectors
import socket
import threading
import time
from typing import Callable

import pynng
from pynng._nng import ffi, lib

from . import auth
from .gate import Gate
from .guard import CallGuard
from .handover import SP_HEADER, adopt, listener_of

log = logging.getLogger(__name__)

HELLO_SIZE, PROOF_SIZE = auth.HELLO_SIZE, auth.PROOF_SIZE
BACKLOG = 4096              # the kernel caps it (somaxconn)
ACCEPTS_PER_TURN = 64       # connections accepted before the others are read again
# seconds a proven peer's connection may take to become an nng pipe once adopted (its
# peer adopts its end after the greeting; one that died meanwhile leaves no other sign)
HANDOVER_SECONDS = 60.0


def _not_the_handshake(data: bytes) -> str:
    """Why a connection's first bytes are not a HELLO, as the log says it."""
    if SP_HEADER.startswith(data[:len(SP_HEADER)]):
        return ("spoke nng before proving the key: a job of an older fiberlite, which "
                "dials with nng first (is its image built from this version?)")
    return "did not start the handshake"


# -- the listening side ------------------------------------------------------------------------
class _Visitor:
    """A connection that has not proved the key yet."""

    __slots__ = ("sock", "data", "client_nonce", "server_nonce")

    def __init__(self, sock: socket.socket) -> None:
        self.sock: socket.socket | None = sock
        self.data = b""
        self.client_nonce: bytes | None = None   # set once its HELLO came
        self.server_nonce = b""


class Doorman:
    """Accepts on ``listening`` (a non-blocking stream socket), checks each peer, and
    adopts those that prove ``key`` into the nng socket ``nng`` (``guard`` its
    :class:`CallGuard`), or, without ``nng``, hands their plain (blocking) connections
    to ``hand_over``.

    ``timeout``/``limit``: the gate's deadline and bound (settings ``auth_timeout`` and
    ``auth_pending_limit`` when None). ``on_failed(why)`` hears of each peer that failed
    the handshake (not of those the gate cut off). :meth:`serve` runs the door on a
    thread of its own; :meth:`admit_one` on the caller's, until one peer is in.
    """

    def __init__(self, listening: socket.socket, key: bytes, nng: pynng.Socket | None,
                 guard: CallGuard | None, where: str, timeout: float | None = None,
                 limit: int | None = None, on_failed: Callable[[str], None] | None = None,
                 hand_over: Callable[[socket.socket], None] | None = None) -> None:
        if timeout is None or limit is None:
            from .. import config
            timeout = config.get("auth_timeout") if timeout is None else timeout
            limit = config.get("auth_pending_limit") if limit is None else limit
        listening.setblocking(False)
        self._listening: socket.socket | None = listening
        self._key = key
        self._nng = nng
        self._nng_socket = nng.socket if nng is not None else None
        self._guard = guard
        self._hand_over = hand_over
        self.where = where
        self._on_failed = on_failed
        self.gate = Gate(timeout, limit, where)
        self._lock = threading.Lock()
        self._closed = False
        self._running = False
        self._shut_down = False
        self._paused = False   # not taking connections: every waiting one is under way
        self.failed = 0        # connections that failed the handshake
        self._thread: threading.Thread | None = None
        self._selector = selectors.DefaultSelector()
        self._wake_r, self._wake_w = socket.socketpair()
        self._wake_r.setblocking(False)
        self._wake_w.setblocking(False)
        self._cut: collections.deque[_Visitor] = collections.deque()
        self._to_close: collections.deque[int] = collections.deque()   # listener ids
        self._handing: dict[int, float] = {}    # listener id -> when its pipe is due
        self._piped: dict[int, int] = {}        # pipe id -> the listener that made it
        self._live: set[int] = set()            # listeners whose connection is a pipe
        self.first_pipe: int | None = None      # the id of the first pipe made
        self._selector.register(listening, selectors.EVENT_READ, None)
        self._selector.register(self._wake_r, selectors.EVENT_READ, self._wake_r)
        if nng is not None:
            nng.add_post_pipe_connect_cb(self._pipe_added)
            nng.add_post_pipe_remove_cb(self._pipe_removed)

    # -- running ------------------------------------------------------------------------
    def serve(self) -> None:
        """Run the door on a thread of its own until :meth:`close`."""
        self._running = True
        self._thread = threading.Thread(target=self._run, args=(None,), name="fiberlite-doorman",
                                        daemon=True)
        self._thread.start()

    def admit_one(self, timeout: float) -> str | None:
        """On the calling thread: wait until a peer has proved the key and its
        connection is an nng pipe (None), or until the first peer fails the handshake,
        ``timeout`` seconds pass or :meth:`close` is called (why not). The door then
        closes: no other connection is taken."""
        failed: list[str] = []
        self._on_failed = failed.append
        self._run(lambda: self.first_pipe is not None or bool(failed), time.monotonic() + timeout)
        if self.first_pipe is not None:
            return None
        return failed[0] if failed else ("closed" if self._closed else "no peer proved the key in time")

    def close(self) -> None:
        """Stop (any thread; the owner closes the nng socket, which closes what it adopted)."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
            idle = not self._running
        if idle:   # no thread runs the door: nothing else will shut it
            self._shut()
            return
        self._wake()
        thread = self._thread
        if thread is not None and thread is not threading.current_thread():
            thread.join(5)

    def abandon(self) -> None:
        """(a forked child) Close this process's copies of the door's descriptors without
        touching its thread, which is the parent's."""
        self._closed = self._shut_down = True
        listening, self._listening = self._listening, None
        for sock in (listening, self._wake_r, self._wake_w):
            if sock is not None:
                sock.close()
        self._selector.close()

    def _wake(self) -> None:
        try:
            self._wake_w.send(b"x")
        except OSError:   # full (a wake-up is pending anyway) or closed
            pass

    def _run(self, done: Callable[[], bool] | None, until: float | None = None) -> None:
        with self._lock:
            if self._closed or self._shut_down:
                return
            self._running = True
        try:
            while not self._closed and not (done is not None and done()):
                now = time.monotonic()
                if until is not None and now >= until:
                    return
                due = [t for t in (until, self._next_handover()) if t is not None]
                wait = max(0.0, min(due) - now) if due else None
                if self._paused and self.gate.has_room():
                    self._pause(False)
                for key, _ in self._selector.select(wait):
                    if key.data is None:
                        self._accept()
                    elif key.data is self._wake_r:
                        self._woken()
                    else:
                        self._read(key.data)
                self._expire_handovers()
        except Exception:
            log.exception("%s: the door failed; no more connections are taken", self.where)
        finally:
            self._shut()

    def _shut(self) -> None:
        """Stop listening and close what has not proved the key (once)."""
        with self._lock:
            if self._shut_down:
                return
            self._shut_down = True
            self._running = False
        self.gate.close()
        listening, self._listening = self._listening, None
        if listening is not None:
            listening.close()
        for key in list(self._selector.get_map().values()):
            if isinstance(key.data, _Visitor):
                sock, key.data.sock = key.data.sock, None
                if sock is not None:
                    sock.close()
        self._selector.close()
        self._wake_r.close()
        self._wake_w.close()

    # -- connections not proved yet ----------------------------------------------------------
    def _accept(self) -> None:
        for _ in range(ACCEPTS_PER_TURN):
            if not self.gate.has_room():   # every waiting peer is under way: the others wait
                self._pause(True)          # in the kernel's queue until one is done
                return
            try:
                sock, _ = self._listening.accept()
            except (BlockingIOError, InterruptedError):
                return
            except OSError as exc:   # out of descriptors, or the peer reset already
                log.warning("%s: accept failed: %s", self.where, exc)
                return
            sock.setblocking(False)
            visitor = _Visitor(sock)
            self._selector.register(sock, selectors.EVENT_READ, visitor)
            self.gate.admit(visitor, lambda v=visitor: self._cut_off(v))
            while self._cut:   # the one it made room for is closed before the next comes
                self._drop(self._cut.popleft())
            # a client sends its HELLO as soon as it is connected: read it now, so that it
            # counts as started before the connections accepted after it make room
            self._read(visitor)

    def _pause(self, paused: bool) -> None:
        """Stop (or resume) taking connections from the listening socket."""
        if paused != self._paused and self._listening is not None:
            self._paused = paused
            if paused:
                self._selector.unregister(self._listening)
            else:
                self._selector.register(self._listening, selectors.EVENT_READ, None)

    def _cut_off(self, visitor: _Visitor) -> None:
        """(the gate's, any thread) End ``visitor``: the door's thread does it."""
        self._cut.append(visitor)
        self._wake()

    def _woken(self) -> None:
        try:
            while self._wake_r.recv(4096):
                pass
        except OSError:
            pass
        while self._cut:
            self._drop(self._cut.popleft())
        while self._to_close:
            self._close_listener(self._to_close.popleft())

    def _drop(self, visitor: _Visitor) -> None:
        sock, visitor.sock = visitor.sock, None
        if sock is None:
            return
        self.gate.forget(visitor)
        self._selector.unregister(sock)
        sock.close()

    def _fail(self, visitor: _Visitor, why: str) -> None:
        self.failed += 1
        level = logging.WARNING if self.failed in (1, 100, 10_000) else logging.DEBUG
        log.log(level, "%s: closed a connection that %s (%d so far)", self.where, why, self.failed)
        self._drop(visitor)
        if self._on_failed is not None:
            self._on_failed(why)

    def _read(self, visitor: _Visitor) -> None:
        sock = visitor.sock
        if sock is None:
            return
        need = (HELLO_SIZE if visitor.client_nonce is None else PROOF_SIZE) - len(visitor.data)
        try:
            chunk = sock.recv(need)
        except (BlockingIOError, InterruptedError):
            return
        except OSError:
            chunk = b""
        if not chunk:   # hung up or reset before proving anything
            self._drop(visitor)
            if visitor.client_nonce is not None and self._on_failed is not None:
                self._on_failed("hung up during the handshake")   # (a client that refused our proof)
            return
        visitor.data += chunk
        step = auth.HELLO if visitor.client_nonce is None else auth.PROOF
        if not visitor.data.startswith(step[:len(visitor.data)]):   # not the handshake: say so now
            return self._fail(visitor, _not_the_handshake(visitor.data) if step is auth.HELLO
                              else "does not hold the run's key")
        if len(chunk) < need:
            return
        data, visitor.data = visitor.data, b""
        if visitor.client_nonce is None:
            self._hello(visitor, data)
        else:
            self._proof(visitor, data)

    def _hello(self, visitor: _Visitor, data: bytes) -> None:
        client_nonce = auth.parse_hello(data)
        if client_nonce is None:
            return self._fail(visitor, "did not start the handshake")
        self.gate.started(visitor)
        visitor.client_nonce = client_nonce
        visitor.server_nonce = auth.new_nonce()
        if not self._send(visitor, auth.challenge(self._key, client_nonce, visitor.server_nonce)):
            self._drop(visitor)

    def _proof(self, visitor: _Visitor, data: bytes) -> None:
        if not auth.check_proof(self._key, data, visitor.client_nonce, visitor.server_nonce):
            return self._fail(visitor, "does not hold the run's key")
        sock = visitor.sock
        if not self.gate.passed(visitor):   # cut off meanwhile: it is being dropped
            return
        visitor.sock = None
        self._selector.unregister(sock)
        try:
            sock.send(auth.WELCOME)   # a few bytes on a connection that has sent nothing back yet
        except OSError:
            sock.close()
            return
        sock.setblocking(True)
        if self._hand_over is not None:
            self._hand_over(sock)
            return
        listener = adopt(self._guard, self._nng_socket, sock)
        if listener is not None:
            lid = lib.nng_listener_id(listener)
            with self._lock:
                if lid not in self._live:   # (its pipe may be up already)
                    self._handing[lid] = time.monotonic() + HANDOVER_SECONDS

    @staticmethod
    def _send(visitor: _Visitor, data: bytes) -> bool:
        try:
            return visitor.sock.send(data) == len(data)   # small: fits a fresh connection's buffer
        except OSError:
            return False

    # -- adopted connections --------------------------------------------------------------------
    def _pipe_added(self, pipe: pynng.Pipe) -> None:
        """(nng's thread) An adopted connection became a pipe."""
        lid = listener_of(pipe)
        with self._lock:
            self._handing.pop(lid, None)
            self._piped[pipe.id] = lid
            self._live.add(lid)
            first = self.first_pipe is None
            if first:
                self.first_pipe = pipe.id
        if first:   # (admit_one waits for it)
            self._wake()

    def _pipe_removed(self, pipe: pynng.Pipe) -> None:
        """(nng's thread) A connection ended: its listener is closed on the door's thread."""
        with self._lock:
            lid = self._piped.pop(pipe.id, None)
            self._live.discard(lid)
        if lid is not None:
            self._to_close.append(lid)
            self._wake()

    def _next_handover(self) -> float | None:
        with self._lock:
            return min(self._handing.values(), default=None)

    def _expire_handovers(self) -> None:
        now = time.monotonic()
        with self._lock:
            late = [lid for lid, deadline in self._handing.items() if deadline <= now]
        for lid in late:
            log.info("%s: an adopted connection did not become a pipe in time; closed", self.where)
            self._close_listener(lid)

    def _close_listener(self, lid: int) -> None:
        with self._lock:
            self._handing.pop(lid, None)
        if self._guard.enter():   # else the socket's close closes it
            try:
                listener = ffi.new("nng_listener *")
                listener[0].id = lid
                lib.nng_listener_close(listener[0])
            finally:
                self._guard.leave()
