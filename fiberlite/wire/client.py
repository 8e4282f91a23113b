"""The dialing side of the wire: one authenticated REQ socket per remote address.

Each call borrows a REQ context, sends its request and waits for the reply on the
calling thread (no hand-off between threads). Automatic resend is disabled, so an
idle connection never replays a request. When the connection drops, or the server
stays silent for ``peer_timeout`` (:mod:`.liveness`: this client probes it when the
connection is idle), every waiting call fails with :class:`ConnectionLost` and the
client is discarded.
"""
from __future__ import annotations

import collections
import logging
import threading
from typing import Any, Callable

import pynng

from ..errors import AuthenticationError, ConnectionLost
from . import auth, codec, dialer, liveness, oneway, threads, tls
from .guard import SocketGuard
from .nngio import Io

log = logging.getLogger(__name__)

HANDSHAKE_TIMEOUT_MS = 10_000
CAST_WINDOW = 256  # one-way requests sent before a SYNC collects their failures
PROBE = codec.encode(None, codec.PING)


class Carrying:
    """A message that carries the riders kept when it is sent (:meth:`Client.ride`):
    ``build(riders)`` makes it (None: a one-way one with nothing to send); ``timed``: it is
    the riders' timer's own message."""

    __slots__ = ("build", "timed")

    def __init__(self, build: Callable[[tuple], Any], timed: bool = False) -> None:
        self.build = build
        self.timed = timed


class Client:
    """An authenticated connection to a :class:`~fiberlite.wire.server.Server`."""

    def __init__(self, address: str, key: bytes, connect_timeout: float = 10.0) -> None:
        self.address = address
        self._idle: collections.deque[pynng.Context] = collections.deque()
        self._lost_callbacks: list[Callable[[], None]] = []
        self._lock = threading.Lock()
        self._unsynced = 0  # one-way requests sent since the last SYNC
        self._riders: list = []  # see ride()
        self._riders_timed = False
        self._sending = threading.Lock()  # taking the riders and sending what carries them
        self.alive = False
        self._ended = False  # the connection ended (perhaps before it was alive)
        # liveness (see fiberlite.wire.liveness): set by calls, read by the liveness thread
        self._sent = self._heard = False
        self._quiet = 0  # ticks in a row in which nothing came back
        self._probe: Io | None = None
        self._probing = False
        self.silent_for: float | None = None  # given up after this many silent seconds
        self.out_of_touch = False  # it ended while this end heard nothing, or was frozen
        self._closed_why: str | None = None
        options = {"tls_config": tls.config(key, server=False)} if tls.is_tls(address) else {}
        self._sock = pynng.Req0(recv_max_size=0, resend_time=-1, **options)
        self._sock.reconnect_time_min = 60_000
        self._sock.reconnect_time_max = 60_000
        self._sock.add_post_pipe_remove_cb(self._pipe_removed)
        self._guard = SocketGuard(self._sock)
        try:
            if tls.is_tls(address):
                self._dial(address, connect_timeout)
                self._authenticate(key)
            else:   # proved on a plain connection, then handed to nng
                dialer.dial(self._sock, self._guard, address, key, connect_timeout)
            with self._lock:   # its end may have come before it was alive: then it is lost
                self.alive = not self._ended
            if not self.alive:
                raise ConnectionError(f"connection to {address} ended as it was made")
        except BaseException:
            self._guard.close()
            raise
        liveness.watch(self)

    def _dial(self, address: str, timeout: float) -> None:
        """Connect once: a refused connection means nothing listens there (any more)."""
        try:
            self._sock.dial(address, block=True)
        except pynng.ConnectionRefused:
            raise ConnectionRefusedError(
                f"nothing listens at {address} (has the job that owns it exited?)") from None
        except pynng.CryptoError:
            raise AuthenticationError(
                f"{address} refused TLS with this process's key (is it another run's job?)") from None
        except pynng.NNGException as exc:
            raise ConnectionError(f"cannot connect to {address}: {exc}") from None

    def _authenticate(self, key: bytes) -> None:
        # a call like the others: a loss meanwhile must not close the socket while the
        # handshake's context is being closed (see guard)
        if not self._guard.enter():
            raise ConnectionError(f"connection to {self.address} was closed during the handshake")
        try:
            self._handshake(key)
        finally:
            self._guard.leave()

    def _handshake(self, key: bytes) -> None:
        ctx = self._guard.open_context(pynng.Socket.new_context)
        if ctx is None:
            raise ConnectionError(f"connection to {self.address} was closed during the handshake")
        ctx.recv_timeout = HANDSHAKE_TIMEOUT_MS
        ctx.send_timeout = HANDSHAKE_TIMEOUT_MS  # a peer that went away mid-handshake
        try:
            auth.prove(key, ctx.send, ctx.recv, self.address)
        except (pynng.Timeout, pynng.Closed):
            raise AuthenticationError(
                f"{self.address} refused the handshake: this process does not hold the run's key") from None
        except pynng.NNGException as exc:
            raise ConnectionError(f"connection to {self.address} failed during the handshake: {exc}") from None
        finally:
            self._guard.discard(ctx)

    def on_lost(self, callback: Callable[[], None]) -> None:
        """Call ``callback`` once when the connection drops (immediately if it has)."""
        with self._lock:
            if self.alive:
                self._lost_callbacks.append(callback)
                return
        callback()

    def _pipe_removed(self, pipe) -> None:
        with self._lock:
            self._ended = True
            if not self.alive:
                return
            self.alive = False
            # the other end may have given this one up for its silence: it had heard
            # nothing for most of a timeout, or this process was frozen until now
            self.out_of_touch = (self.silent_for is not None or liveness.behind()
                                 or self._quiet >= liveness.TICKS - 1)
            callbacks, self._lost_callbacks = self._lost_callbacks, []
        # waking the waiting calls is not allowed inside nng's callback
        threads.start(self._after_loss, callbacks, name="fiberlite-connection-lost")

    def _after_loss(self, callbacks) -> None:
        liveness.unwatch(self)
        self._guard.close()  # every call under way fails; the socket closes when none is
        for callback in callbacks:
            try:
                callback()
            except Exception:
                pass

    def _lost_error(self) -> ConnectionLost:
        return ConnectionLost(f"connection to {self.address} was lost ({self.lost_reason})")

    @property
    def lost_reason(self) -> str:
        """Why the connection is lost, as an error message says it."""
        if self._closed_why is not None:
            return self._closed_why
        if self.silent_for is not None:
            return liveness.silence(self.silent_for)
        return "the job serving it has exited?"

    def _enter(self) -> None:
        if not self._guard.enter():
            raise self._lost_error()

    def _leave(self) -> None:
        self._guard.leave()

    def _context(self) -> pynng.Context:
        try:
            return self._idle.pop()
        except IndexError:
            pass
        try:
            ctx = self._guard.open_context(Io)
        except pynng.NNGException:  # the socket closed meanwhile
            ctx = None
        if ctx is None:
            raise self._lost_error()
        return ctx

    def _receive(self, ctx: pynng.Context, timeout_ms: int = -1, interruptible: bool = False,
                 keep: bool = False, resumed: bool = False) -> Any:
        """The decoded reply on ``ctx`` (the caller has entered); ``TimeoutError`` when
        none came within ``timeout_ms`` (-1: wait for ever). ``interruptible``: a signal's
        handler runs while it waits (:meth:`~fiberlite.wire.nngio.TimedAio.wait`);
        ``keep``: an interruption of the wait itself leaves the receive under way, which
        ``resumed`` then waits for again (:meth:`request`)."""
        try:
            if not resumed:
                ctx.begin_recv(timeout_ms)
            frame, _, _ = ctx.end_recv(interruptible)
        except pynng.Timeout:
            self._guard.discard(ctx)  # a request left unanswered must not be reused
            raise TimeoutError(f"{self.address} did not answer within {timeout_ms} ms") from None
        except pynng.NNGException:
            self._guard.discard(ctx)
            raise self._lost_error() from None
        except BaseException:
            if not (keep and ctx.recv_interrupted()):  # (else the reply is collected later)
                self._guard.discard(ctx)  # an interrupted call leaves the context mid-request
            raise
        self._heard = True
        self._idle.append(ctx)
        return codec.decode(frame)

    def request(self, message: Any, interruptible: bool = False,
                on_interrupt: Callable[[Callable[[], Any]], None] | None = None) -> Any:
        """Send ``message`` and return the decoded reply ``(ok, value)``.

        ``interruptible`` (a reply that may take long: a wait): Ctrl-C interrupts the wait
        in the main thread. The request is then abandoned, or, with ``on_interrupt``, that
        is called with a function that waits for the reply (the servant is to be asked to
        answer at once first), and the interruption is raised after it."""
        if oneway.unsettled:
            oneway.settle()  # (what this process's one-way calls did is seen first)
        if on_interrupt is None:
            return self._call(message, interruptible=interruptible)
        self._enter()
        try:
            ctx = self._send(message)
            try:
                return self._receive(ctx, -1, interruptible, keep=True)
            except Exception:
                raise
            except BaseException:
                if not ctx.recv_interrupted():
                    raise  # (interrupted elsewhere: the request is abandoned)
                read: list = []
                try:
                    on_interrupt(lambda: read.append(ctx) or self._receive(ctx, resumed=True))
                except Exception:
                    pass  # (a lost connection: the servant takes back what it lent)
                if not read:
                    self._guard.discard(ctx)
                raise
        finally:
            self._leave()

    def _dispatch(self, frame: Any) -> pynng.Context:
        """Send ``frame`` on a free context and return it (the caller has entered)."""
        ctx = self._context()
        try:
            # a reply (or the connection's loss) is awaited anyway; a one-way request
            # needs nothing more than nng taking the message
            ctx.send_frame(frame, wait=False)
        except pynng.NNGException:
            self._guard.discard(ctx)
            raise self._lost_error() from None
        self._sent = True
        return ctx

    def _send(self, message: Any, flags: int = 0) -> pynng.Context:
        """Encode ``message`` and send it (:meth:`_dispatch`). A :class:`Carrying` one takes
        the riders kept until now, and is sent before any message built after it: a
        message that leaves later cannot overtake the riders (a receipt) it did not carry."""
        if type(message) is not Carrying:
            return self._dispatch(codec.encode(message, flags))
        with self._sending:
            built = message.build(self.take_riders(message.timed))
            return None if built is None else self._dispatch(codec.encode(built, flags))

    def _call(self, message: Any, timeout_ms: int = -1, interruptible: bool = False,
              flags: int = 0) -> Any:
        self._enter()
        try:
            return self._receive(self._send(message, flags), timeout_ms, interruptible)
        finally:
            self._leave()

    def begin(self, message: Any) -> pynng.Context:
        """Send ``message`` now and return a handle; :meth:`finish` waits for its reply.

        Lets one thread keep a request in flight while it works (the Pool's workers
        ask for their next batch this way). Each handle must be finished exactly once.
        """
        if oneway.unsettled:
            oneway.settle()
        self._enter()
        try:
            return self._send(message)
        finally:
            self._leave()

    def finish(self, ctx: pynng.Context) -> Any:
        """The decoded reply ``(ok, value)`` to the request :meth:`begin` sent on ``ctx``."""
        self._enter()
        try:
            return self._receive(ctx)
        finally:
            self._leave()

    def cast(self, message: Any, collect: bool = True) -> None:
        """Send ``message`` without waiting: the server handles it and sends no reply.

        A failure it reports is raised by the next :meth:`flush` (made every
        ``CAST_WINDOW`` casts; ``collect=False``: a message whose failure is not worth
        it). Requests on one connection are handled in the order they were sent, so a
        later call sees this one's effect.
        """
        if oneway.unsettled:
            oneway.settle()
        self._enter()
        try:
            # no reply will come: the context's next send simply starts a new request;
            # other calls take it last, once nng has finished sending from it
            ctx = self._send(message, codec.NO_REPLY)
            if ctx is None:  # (a Carrying message with nothing to carry)
                return
            self._idle.appendleft(ctx)
            with self._lock:
                self._unsynced += collect
                due = self._unsynced >= CAST_WINDOW
        finally:
            self._leave()
        if due:
            self.flush()

    # -- riders: small notices carried by the next message the caller builds --------------
    def ride(self, rider: Any) -> bool:
        """Keep ``rider`` for the next :meth:`take_riders`. True: no timer is set for the
        riders kept (the caller sets one, to send them on their own if no message leaves
        soon; it calls ``take_riders(timed=True)``)."""
        with self._lock:
            self._riders.append(rider)
            if self._riders_timed:
                return False
            self._riders_timed = True
            return True

    def peek_riders(self) -> tuple:
        """The riders kept so far, still kept (another path may carry a copy)."""
        return tuple(self._riders) if self._riders else ()

    def drop_riders(self, delivered: tuple) -> None:
        """Riders that :meth:`peek_riders` gave and another path delivered (its answer
        came: they were handled) are no longer kept."""
        if not delivered or not self._riders:
            return
        gone = {id(rider) for rider in delivered}  # (the same objects, alive in ``delivered``)
        with self._lock:
            self._riders = [rider for rider in self._riders if id(rider) not in gone]

    def take_riders(self, timed: bool = False) -> tuple:
        """The riders kept so far (to go with a message about to be sent), now forgotten."""
        if not (self._riders or timed):
            return ()
        with self._lock:
            if timed:
                self._riders_timed = False
            riders, self._riders = tuple(self._riders), []
        return riders

    @property
    def unsynced(self) -> int:
        """One-way requests sent since the last :meth:`flush` (not known to be handled)."""
        return self._unsynced

    def flush(self, timeout: float | None = None) -> None:
        """Wait until every one-way request sent so far has been handled; raise the
        first failure one of them reported (``TimeoutError`` after ``timeout`` seconds)."""
        with self._lock:
            if not self._unsynced:
                return
            self._unsynced = 0
        timeout_ms = -1 if timeout is None else max(1, int(timeout * 1000))
        ok, value = self._call(None, timeout_ms, flags=codec.SYNC)
        if not ok:
            raise value

    # -- liveness (the liveness thread's) ------------------------------------------------------
    def liveness_tick(self, counted: bool, timeout: float) -> bool:
        """One tick of :mod:`.liveness`: give the server up after ``TICKS`` counted ticks
        in a row with nothing back, else probe it unless requests went and replies came."""
        if not self.alive:
            return False
        heard, sent = self._heard, self._sent
        self._heard = self._sent = False
        answered = self._probing and self._probe_answered()
        if heard or answered:
            self._quiet = 0
        elif counted:
            self._quiet += 1
            if self._quiet >= liveness.TICKS:
                self._give_up(timeout)
                return False
        if not (heard and sent) and not self._probing:
            self._send_probe()
        return True

    def _send_probe(self) -> None:
        if not self._guard.enter():
            return
        try:
            if self._probe is None:
                self._probe = self._guard.open_context(Io)
                if self._probe is None:
                    return
            self._probe.send_frame(PROBE, wait=False)
            self._probe.begin_recv()
            self._probing = True
        except pynng.NNGException:   # closing: the connection's end is reported anyway
            pass
        finally:
            self._guard.leave()

    def _probe_answered(self) -> bool:
        if not self._guard.enter():
            return False
        try:
            if not self._probe.recv_finished():
                return False
            self._probing = False
            self._probe.end_recv()
            return True
        except pynng.NNGException:
            return False
        finally:
            self._guard.leave()

    def _give_up(self, timeout: float) -> None:
        """The server has been silent for ``timeout`` seconds: the connection is lost."""
        self.silent_for = timeout
        log.warning("%s answered nothing for %g s: the connection to it is given up",
                    self.address, timeout)
        self._pipe_removed(None)

    def close(self, why: str | None = None) -> None:
        """Close the connection (calls still under way in other threads fail, saying
        ``why`` when given)."""
        with self._lock:
            self.alive = False
            self._lost_callbacks = []
            self._closed_why = why
        liveness.unwatch(self)
        self._guard.close()
