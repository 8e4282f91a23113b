"""The listening side of the wire: an nng REP socket whose requests may be answered later.

Each request is received on its own REP context, so a handler can keep the request
(for example a blocked ``Queue.get``) and reply from any thread when it is ready.

A connection must complete :mod:`fiberlite.wire.auth` before any request from it is
decoded. On ``tcp://`` the :class:`~fiberlite.wire.doorman.Doorman` runs it before nng
ever sees the connection, so every pipe of the socket is a proven peer. With TLS
(nng's own listener) it runs as the first messages of each pipe, and anything else
from a pipe that has not passed it closes the pipe.

A connection on which nothing came for ``peer_timeout`` (:mod:`.liveness`; an idle
client probes) is closed as if its peer had closed it, after ``on_peer_silent``.
"""
from __future__ import annotations

import collections
import logging
import threading
from typing import Any, Callable

import pynng

from . import auth, codec, liveness, tcp, tls, tls_watch
from .binding import bind_host
from .doorman import BACKLOG, Doorman
from .guard import SocketGuard
from .nngio import Io, close_pipe

log = logging.getLogger(__name__)

PROBE_ANSWER = codec.encode((True, None))


class Request:
    """One request from a peer, to be answered exactly once with :meth:`reply` or :meth:`fail`."""

    __slots__ = ("_server", "_ctx", "peer")

    def __init__(self, server: "Server", ctx: pynng.Context, peer: int) -> None:
        self._server = server
        self._ctx = ctx
        self.peer = peer

    def reply(self, value: Any = None) -> None:
        self._server._answer(self, (True, value))

    def fail(self, exc: BaseException) -> None:
        self._server._answer(self, (False, exc))


class OneWayRequest:
    """A request sent with :data:`codec.NO_REPLY`: nothing is sent back; a failure is kept
    for the peer and reported by its next SYNC request (``Client.flush``)."""

    __slots__ = ("_server", "peer")

    def __init__(self, server: "Server", peer: int) -> None:
        self._server = server
        self.peer = peer

    def reply(self, value: Any = None) -> None:
        pass

    def fail(self, exc: BaseException) -> None:
        self._server._one_way_errors.setdefault(self.peer, exc)


class Server:
    """Listen on ``tcp://host:port`` (``tls+tcp://`` with ``use_tls``, see
    :mod:`fiberlite.wire.tls`) and hand authenticated requests to ``handler``.

    ``handler(request, message)`` runs on the receiving thread and must not block;
    ``on_peer_lost(peer)`` is called (via ``defer``) when a connection ends, after every
    request that came from it has been handed to ``handler``; ``on_peer_silent(peer)``
    before it (via ``defer`` too) when the connection ends because nothing came on it for
    ``peer_timeout``. ``defer(fn)`` runs ``fn`` soon, preferably on a thread of the
    caller's: nng's own threads call it.
    """

    def __init__(self, key: bytes, host: str, handler: Callable[[Request, Any], None],
                 on_peer_lost: Callable[[int], None], defer: Callable[[Callable[[], None]], None],
                 port: int = 0, use_tls: bool = False,
                 on_peer_silent: Callable[[int], None] | None = None) -> None:
        self._key = key
        self._handler = handler
        self._on_peer_lost = on_peer_lost
        self._on_peer_silent = on_peer_silent
        self._defer = defer
        self._idle: collections.deque[pynng.Context] = collections.deque()
        self._handshakes: dict[int, bytes | tuple[bytes, bytes]] = {}
        self._authenticated: set[int] = set()
        self._one_way_errors: dict[int, BaseException] = {}
        self._removed: collections.deque[int] = collections.deque()  # connections that ended
        self._receiving: Io | None = None  # the context the receiving thread waits on
        self._receiving_lock = threading.Lock()
        # liveness: peers heard since the last tick, and each connection's silent ticks
        self._heard: set[int] = set()
        self._quiet: dict[int, int] = {}
        self._pipes: dict[int, pynng.Pipe] = {}
        options = {"tls_config": tls.config(key, server=True)} if use_tls else {}
        self._sock = pynng.Rep0(recv_max_size=0, **options)
        self._sock.add_post_pipe_connect_cb(self._pipe_added)
        self._sock.add_post_pipe_remove_cb(self._pipe_removed)
        self._guard = SocketGuard(self._sock)
        self._door: Doorman | None = None
        self._unwatch: Callable[[], None] = lambda: None
        try:
            if use_tls:
                self._sock.listen(f"{tls.SCHEME}{bind_host(host)}:{port}")
                self.port = int(str(self._sock.listeners[0].local_address).rsplit(":", 1)[1])
                self.address = f"{tls.SCHEME}{host}:{self.port}"
                self._unwatch = tls_watch.watch(self, self._sock, self.port)
            else:
                listening, self.port = tcp.listen(host, BACKLOG, port)
                self.address = tcp.address(host, self.port)
                self._door = Doorman(listening, key, self._sock, self._guard, f"the server at {self.address}")
        except BaseException:
            self._guard.close()
            raise
        self._thread = threading.Thread(target=self._serve, name="fiberlite-server", daemon=True)
        self._thread.start()
        if self._door is not None:
            self._door.serve()
        liveness.watch(self)

    # -- receiving ---------------------------------------------------------------
    def _serve(self) -> None:
        guard = self._guard
        while True:
            try:
                ctx = self._idle.pop()
            except IndexError:
                try:
                    ctx = guard.open_context(Io)
                except pynng.Closed:
                    return
                if ctx is None:
                    return
            if not guard.enter():
                return
            try:
                frame, peer, pipe = self._receive(ctx)
            except pynng.Closed:
                return
            except pynng.Canceled:  # woken to report a connection that ended
                self._idle.append(ctx)
                continue
            except Exception:  # a context closed under us, or an nng internal error
                if guard.closing:
                    return
                log.exception("receive failed")
                continue
            finally:
                guard.leave()
            self._heard.add(peer)
            if peer in self._authenticated or (self._door is not None and peer >= 0):
                try:
                    flags = codec.flags_of(frame)
                    if flags & codec.PING:   # a probe: answered without a look inside
                        self._send(ctx, PROBE_ANSWER)
                        continue
                    message = codec.decode(frame)
                except Exception as exc:
                    log.warning("undecodable request from peer %s: %s", peer, exc)
                    self._drop(peer, pipe, ctx)
                    continue
                del frame
                if flags & codec.SYNC:  # every earlier request of this peer is handled
                    error = self._one_way_errors.pop(peer, None)
                    self._send(ctx, codec.encode((True, None) if error is None else (False, error)))
                    continue
                if flags & codec.NO_REPLY:
                    self._idle.append(ctx)  # nng drops the request when ctx receives again
                    request: Any = OneWayRequest(self, peer)
                else:
                    request = Request(self, ctx, peer)
                try:
                    self._handler(request, message)
                except Exception as exc:  # a handler bug must not stop the server
                    log.exception("request handler failed")
                    if flags & codec.NO_REPLY:
                        request.fail(exc)
            else:
                self._handshake(peer, pipe, ctx, bytes(frame))

    def _receive(self, ctx: Io):
        """The next request, once every connection that ended before it came is reported.

        nng reports a connection's end (on a thread of its own) as soon as it reads it,
        while the requests that came before it may still wait in this thread: a peer is
        reported lost only here, after them, so that nothing it sent before it went is
        handled after its loss."""
        while True:
            with self._receiving_lock:
                if not self._removed:
                    ctx.begin_recv()
                    self._receiving = ctx
                    break
            self._report_removed()
        try:
            return ctx.end_recv()
        finally:
            with self._receiving_lock:
                self._receiving = None

    def _report_removed(self) -> None:
        while self._removed:
            peer = self._removed.popleft()
            self._handshakes.pop(peer, None)
            self._one_way_errors.pop(peer, None)
            if peer in self._authenticated or self._door is not None:
                self._authenticated.discard(peer)
                self._defer(lambda peer=peer: self._on_peer_lost(peer))

    def _wake_receiver(self) -> None:
        """Make the receive under way return (``pynng.Canceled``) to report what ended."""
        if not self._guard.enter():
            return
        try:
            with self._receiving_lock:
                if self._receiving is not None:
                    self._receiving.cancel_recv()
        finally:
            self._guard.leave()

    def _handshake(self, peer: int, pipe, ctx: Io, data: bytes) -> None:
        if peer < 0:
            self._idle.append(ctx)
            return
        state = self._handshakes.get(peer)
        if state is None:
            client_nonce = auth.parse_hello(data)
            if client_nonce is None:
                return self._drop(peer, pipe, ctx)
            server_nonce = auth.new_nonce()
            self._handshakes[peer] = (client_nonce, server_nonce)
            self._send(ctx, auth.challenge(self._key, client_nonce, server_nonce))
        else:
            client_nonce, server_nonce = state
            del self._handshakes[peer]
            if not auth.check_proof(self._key, data, client_nonce, server_nonce):
                log.warning("peer %s failed authentication; connection closed", peer)
                return self._drop(peer, pipe, ctx)
            self._authenticated.add(peer)
            self._send(ctx, auth.WELCOME)

    def _drop(self, peer: int, pipe, ctx: Io) -> None:
        if peer >= 0:
            self._handshakes.pop(peer, None)
            if self._guard.enter():
                try:
                    close_pipe(pipe)
                finally:
                    self._guard.leave()
        self._idle.append(ctx)

    def _pipe_added(self, pipe: pynng.Pipe) -> None:
        # (nng's thread) watched from now on
        self._pipes[pipe.id] = pipe
        self._quiet[pipe.id] = 0

    def _pipe_removed(self, pipe: pynng.Pipe) -> None:
        # (nng's thread) reported by the receiving thread, after what came before it
        self._pipes.pop(pipe.id, None)
        self._quiet.pop(pipe.id, None)
        self._removed.append(pipe.id)
        self._defer(self._wake_receiver)

    # -- liveness (the liveness thread's) ------------------------------------------------------
    def liveness_tick(self, counted: bool, timeout: float) -> bool:
        """One tick of :mod:`.liveness`: close each connection on which nothing came for
        ``TICKS`` counted ticks in a row."""
        if self._guard.closing:
            return False
        heard, self._heard = self._heard, set()
        quiet = self._quiet
        for peer, ticks in list(quiet.items()):
            if peer in heard:
                if ticks:
                    quiet[peer] = 0
            elif counted:
                if ticks + 1 >= liveness.TICKS:
                    self._give_up(peer, timeout)
                elif peer in quiet:
                    quiet[peer] = ticks + 1
        return True

    def _give_up(self, peer: int, timeout: float) -> None:
        """Nothing came from ``peer`` for ``timeout`` seconds: close its connection."""
        self._quiet.pop(peer, None)
        pipe = self._pipes.get(peer)
        if pipe is None:   # it ended meanwhile
            return
        log.warning("%s: connection %d sent nothing for %g s and is closed: its machine is gone, "
                    "cut off or frozen?", self.address, peer, timeout)
        if self._on_peer_silent is not None:
            self._defer(lambda: self._on_peer_silent(peer))
        if self._guard.enter():
            try:
                close_pipe(pipe.pipe)
            finally:
                self._guard.leave()

    # -- answering -----------------------------------------------------------------
    def _answer(self, request: Request, value: tuple) -> None:
        ctx = request._ctx
        if ctx is None:
            raise RuntimeError("request answered twice")
        request._ctx = None
        try:
            frame = codec.encode(value)
        except Exception as exc:
            frame = codec.encode((False, TypeError(f"reply could not be pickled: {exc}")))
        self._send(ctx, frame)

    def _send(self, ctx: Io, frame) -> None:
        # the replying thread does not wait for nng to finish sending; the context
        # receives again (its own aio) and is taken last by the receiving loop
        if not self._guard.enter():
            return
        try:
            ctx.send_frame(frame, wait=False)
        except pynng.Closed:
            return
        except pynng.NNGException as exc:
            log.debug("reply not sent: %s", exc)
        finally:
            self._guard.leave()
        self._idle.appendleft(ctx)

    def close(self) -> None:
        """Stop serving: calls under way on other threads end at once, and the socket
        closes as soon as none is inside nng any more."""
        if not self._guard.close():
            return
        liveness.unwatch(self)
        self._unwatch()
        if self._door is not None:
            self._door.close()
        if threading.current_thread() is not self._thread:
            self._thread.join(timeout=5)

