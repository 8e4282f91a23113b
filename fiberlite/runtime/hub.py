"""The hub: this process's server for the shared objects it created.

Every Queue, Pipe, job channel (and later Pool, Manager) created in a process is a
*servant* registered in that process's hub. Other jobs reach it through an
:class:`ObjectRef` (address + object id) over an authenticated connection; the
owning process calls the servant directly, without a socket.
"""
from __future__ import annotations

import logging
import threading
from typing import Any, Callable

from . import exit_order, identity
from .dialed import RECEIPTS, close_all, connect, current, flush, send_receipts
from .limits import raise_open_file_limit
from .scheduler import Scheduler
from ..wire.client import Carrying, Client
from ..wire.codec import Payload
from ..wire.direct import DirectServer
from ..wire.nngio import SIGNAL_SLICE
from ..wire.server import Request, Server
from ..wire.tls import host_port

log = logging.getLogger(__name__)

LOCAL_PEER = 0  # the peer id of calls made by the hub's own process
# operations on how long a handle's servant is kept (fiberlite.runtime.handles), run by the hub
HOLD, RELEASE, PIN = "__hold__", "__release__", "__pin__"
_HOLD_OPS = frozenset({HOLD, RELEASE, PIN})
DIRECT = "__direct__"  # the hub's offer of direct calls (fiberlite.wire.direct), or None
EXIT_FLUSH_SECONDS = 30.0
# a receipt (ObjectRef.confirm) goes with the next call or cast to the servant's process,
# or on its own after this long
RECEIPT_SECONDS = 0.005


class Servant:
    """An object served by a hub; ``op_<method>(request, *args)`` answers requests.

    Handlers run on the hub's thread (remote calls) or the caller's (local calls):
    they must never block; to wait, keep the request and answer it later.

    Its ``watcher``, when set (the dashboard's), is called by :meth:`tell_watcher` after a
    change of its state that someone outside may want to show: it must return at once.
    """

    watcher: Callable[[], None] | None = None
    #: told of a lost peer after every other servant: it recovers what the peer held,
    #: which the others must first stop acquiring for it
    hears_loss_last = False

    def dispatch(self, request: Any, method: str, args: tuple) -> None:
        handler = getattr(self, "op_" + method, None)
        if handler is None:
            request.fail(AttributeError(f"{type(self).__name__} has no operation {method!r}"))
            return
        handler(request, *args)

    def peer_lost(self, peer: int) -> None:
        """The connection of ``peer`` ended: forget what it held or waited for."""

    def peer_silent(self, peer: int) -> None:
        """The connection of ``peer`` is about to end because nothing came on it for
        ``peer_timeout`` (:meth:`peer_lost` follows)."""

    def tell_watcher(self) -> None:
        """Tell the watcher, if any, that the servant's state changed."""
        if self.watcher is not None:
            self.watcher()


class LocalRequest:
    """A request made by the hub's own process; the caller waits on it.

    Most local requests are answered before the caller waits (a put, a non-blocking
    get): the lock the caller would sleep on is only made when it has to sleep.
    """

    __slots__ = ("_sleep", "_result")
    peer = LOCAL_PEER

    def __init__(self) -> None:
        self._sleep: threading.Lock | None = None
        self._result: tuple | None = None

    def _answer(self, result: tuple) -> None:
        self._result = result  # written before _sleep is read: see wait()
        sleep = self._sleep
        if sleep is not None:
            sleep.release()

    def reply(self, value: Any = None) -> None:
        self._answer((True, value))

    def fail(self, exc: BaseException) -> None:
        self._answer((False, exc))

    def outcome(self) -> tuple[bool, Any]:
        """Wait for the answer: ``(ok, value)`` (value: the error when not ok)."""
        if self._result is None:
            sleep = threading.Lock()
            sleep.acquire()
            self._sleep = sleep  # written before _result is read again: an answer
            if self._result is None:  # given in between either is seen here or releases
                if threading.current_thread() is threading.main_thread():
                    # a signal that came just before the sleep began ends no sleep: its
                    # handler (Ctrl-C's KeyboardInterrupt) runs at the next slice
                    while not sleep.acquire(timeout=SIGNAL_SLICE):
                        pass
                else:
                    sleep.acquire()
        return self._result

    def wait(self) -> Any:
        ok, value = self.outcome()
        if ok:
            return value
        # not kept here: the raised exception's traceback holds the caller's frames, and a
        # waiter list or timer may still hold this request
        self._result = (False, None)
        raise value


class _Holds:
    """Why a servant created through a handle is kept (see :mod:`fiberlite.runtime.handles`)."""

    __slots__ = ("local", "jobs", "pinned")

    def __init__(self) -> None:
        self.local = 1       # handles alive in this process
        self.jobs: set[bytes] = set()  # tokens of jobs it was pickled for, not ended
        self.pinned = False  # pickled some other way: kept until this process exits

    def empty(self) -> bool:
        return not (self.local or self.jobs or self.pinned)


class Hub:
    """The per-process server and registry of servants."""

    def __init__(self, host: str) -> None:
        self.scheduler = Scheduler()
        self._objects: dict[int, Servant] = {}
        self._holds: dict[int, _Holds] = {}
        self._next_id = 1
        # reentrant: a handle's finalizer may run (garbage collection) while this
        # thread holds it
        self._lock = threading.RLock()
        from ..config import get
        self.server = Server(identity.key(), host, self._handle, self._peer_lost,
                             self.scheduler.call_soon, use_tls=get("tls"),
                             on_peer_silent=self._peer_silent)
        self.address = self.server.address
        self._use_tls = get("tls")
        self._direct: DirectServer | None = None

    def register(self, servant: Servant, held: bool = False) -> "ObjectRef":
        """Serve ``servant``; ``held``: until its holds end (one local handle to start
        with, see :mod:`fiberlite.runtime.handles`), else until :meth:`unregister`."""
        with self._lock:
            oid = self._next_id
            self._next_id += 1
            self._objects[oid] = servant
            if held:
                self._holds[oid] = _Holds()
        return ObjectRef(self.address, oid)

    def unregister(self, oid: int) -> None:
        with self._lock:
            self._objects.pop(oid, None)
            self._holds.pop(oid, None)

    def retain_local(self, oid: int) -> bool:
        """One more handle on ``oid`` in this process (False: ``oid`` is not held)."""
        with self._lock:
            holds = self._holds.get(oid)
            if holds is not None:
                holds.local += 1
            return holds is not None

    def release_local(self, oid: int) -> None:
        self._change_holds(oid, "local")

    def _change_holds(self, oid: int, what: str, token: bytes | None = None) -> None:
        with self._lock:
            holds = self._holds.get(oid)
            if holds is None:
                return
            if what == "local":
                holds.local -= 1
            elif what == HOLD:
                holds.jobs.add(token)  # type: ignore[arg-type]
            elif what == RELEASE:
                holds.jobs.discard(token)  # type: ignore[arg-type]
            else:
                holds.pinned = True
            if holds.empty():
                del self._holds[oid]
                del self._objects[oid]

    def servant(self, oid: int) -> Servant | None:
        return self._objects.get(oid)

    def _handle(self, request: Request, message: Any) -> None:
        if len(message) == 4:  # receipts carried by the request, handled before it
            self._receipts(request, message[3])
            message = message[:3]
        oid, method, args = message
        if method == RECEIPTS:
            self._receipts(request, args)
            return
        if method in _HOLD_OPS:
            self._change_holds(oid, method, *args)
            request.reply()
            return
        if method == DIRECT:
            request.reply(self._direct_offer(request.peer))
            return
        servant = self._objects.get(oid)
        if servant is None:
            request.fail(ReferenceError(f"object {oid} no longer exists in {self.address}"))
            return
        try:
            servant.dispatch(request, method, args)
        except Exception as exc:
            request.fail(exc)

    def _receipts(self, request: Request, receipts: tuple) -> None:
        """``(oid, slot, ticket)`` receipts of the peer of ``request``: its servants'
        ``op_received(request, slot, ticket)`` (which do not answer)."""
        for oid, slot, ticket in receipts:
            servant = self._objects.get(oid)
            if servant is not None:
                try:
                    servant.dispatch(request, "received", (slot, ticket))
                except Exception:
                    log.exception("receipt failed in %r", servant)

    def call_local(self, oid: int, method: str, args: tuple,
                   on_interrupt: Callable[[Callable[[], Any]], None] | None = None) -> Any:
        """Run ``method`` of servant ``oid`` for this process; ``on_interrupt``: as
        :meth:`~fiberlite.wire.client.Client.request`'s."""
        if method in _HOLD_OPS:
            return self._change_holds(oid, method, *args)
        servant = self._objects.get(oid)
        if servant is None:
            raise ReferenceError(f"object {oid} no longer exists in this process")
        request = LocalRequest()
        try:
            servant.dispatch(request, method, args)
        except Exception as exc:
            raise exc
        if on_interrupt is None:
            return request.wait()
        try:
            return request.wait()
        except BaseException:  # interrupted (Ctrl-C): the servant answers at once
            try:
                on_interrupt(request.outcome)
            except Exception:
                pass
            raise

    def _direct_offer(self, peer: int) -> tuple[str, bytes] | None:
        """Where the peer ``peer`` makes direct calls, and its ticket (None: with TLS, or
        when this process's direct calls were closed)."""
        if self._use_tls or not isinstance(peer, int) or peer == LOCAL_PEER:
            return None
        with self._lock:
            if self._direct is None:
                self._direct = DirectServer(identity.key(), host_port(self.address)[0], self._handle)
            direct = self._direct
        return direct.offer(peer)

    def _peer_lost(self, peer: int, event: str = "peer_lost") -> None:
        direct = self._direct
        if event == "peer_lost" and direct is not None and direct.end_peer(
                peer, lambda: self.scheduler.call_soon(lambda: self._tell(peer, event))):
            return  # told once its direct connections are closed, after their last request
        self._tell(peer, event)

    def _tell(self, peer: int, event: str) -> None:
        servants = sorted(self._objects.values(), key=lambda servant: servant.hears_loss_last)
        for servant in servants:
            try:
                getattr(servant, event)(peer)
            except Exception:
                log.exception("%s failed in %r", event, servant)

    def _peer_silent(self, peer: int) -> None:
        self._peer_lost(peer, "peer_silent")

    def close(self) -> None:
        self.server.close()
        if self._direct is not None:
            self._direct.close()
        self.scheduler.stop()


_hub: Hub | None = None
_hub_lock = threading.Lock()
_closed = False  # the hub was closed at exit: no other is started


def listen_host(backend: str | None = None) -> str:
    """The address jobs of ``backend`` (default: the configured one) use to reach this process:
    the ``listen_host`` setting, else what the backend says."""
    from .. import config
    from ..backends import get_backend
    return config.get("listen_host") or get_backend(backend or config.get("backend")).listen_host()


def get_hub(backend: str | None = None) -> Hub:
    """This process's hub, started on first use where jobs of ``backend`` (default: the
    configured one) can reach it. A hub already listening only on loopback cannot serve
    jobs of a backend that needs another address: that is a clear error."""
    global _hub
    hub = _hub
    if hub is None:
        with _hub_lock:
            if _hub is None:
                if _closed:
                    raise RuntimeError("this process has closed its connections to leave: "
                                       "it serves no more queues, pipes, locks or jobs")
                raise_open_file_limit()  # serving jobs costs descriptors
                _hub = Hub(listen_host(backend))
            hub = _hub
    elif backend is not None:
        _check_reachable(hub, backend)
    return hub


def _check_reachable(hub: Hub, backend: str) -> None:
    host = host_port(hub.address)[0]
    if host.startswith("127.") or host in ("localhost", "::1"):
        wanted = listen_host(backend)
        if not (wanted.startswith("127.") or wanted in ("localhost", "::1")):
            from ..errors import BackendError
            raise BackendError(
                f"this process already serves its queues and pipes on {host}, which jobs of the "
                f"{backend!r} backend cannot reach: make {backend!r} the configured backend "
                f"(FIBERLITE_BACKEND or fiberlite.init(backend=...)) or set listen_host before "
                f"creating any Queue, Pipe, lock or job")


def unregister(oid: int) -> None:
    """Forget the servant ``oid`` of this process's hub (nothing to do once the hub was
    closed at exit)."""
    hub = _hub
    if hub is not None:
        hub.unregister(oid)


def current_hub() -> Hub | None:
    return _hub


def shutdown() -> None:
    """Close this process's connections and server (at exit, after children are joined).

    Runs on the exiting thread and starts no thread: from Python 3.12 on, none can be
    started once the interpreter is finalizing, which it is when ``atexit`` hooks run."""
    global _hub, _closed
    # what this process sent lands before it exits; a peer that stopped answering
    # must not hold the exit up for ever
    flush(EXIT_FLUSH_SECONDS)
    close_all()
    with _hub_lock:
        hub, _hub, _closed = _hub, None, True
    if hub is not None:
        hub.close()


exit_order.at_exit("sockets", shutdown)


class ObjectRef:
    """A picklable reference to a servant: where it lives and its id there."""

    __slots__ = ("address", "oid")

    def __init__(self, address: str, oid: int) -> None:
        self.address = address
        self.oid = oid

    def __reduce__(self):
        return (ObjectRef, (self.address, self.oid))

    def __repr__(self) -> str:
        return f"<ObjectRef {self.oid}@{self.address}>"

    @property
    def is_local(self) -> bool:
        hub = _hub
        return hub is not None and hub.address == self.address

    def connection(self) -> Client:
        """The connection to the servant's process (for a servant of another process)."""
        return connect(self.address)

    def cast(self, method: str, *args: Any) -> None:
        """Like :meth:`call` for operations that never wait, without waiting for the reply."""
        hub = _hub
        if hub is not None and hub.address == self.address:
            hub.call_local(self.oid, method, _owned(args))
        else:
            client = self.connection()
            client.cast(_envelope(self.oid, method, args))

    def call(self, method: str, *args: Any) -> Any:
        """Run ``method`` on the servant and return its reply (or raise its error)."""
        return self._call(method, args, False)

    def wait(self, method: str, *args: Any,
             on_interrupt: Callable[[Callable[[], Any]], None] | None = None) -> Any:
        """As :meth:`call`, for a method whose reply may take long (a lock's acquire, a
        queue's get): Ctrl-C interrupts the wait (KeyboardInterrupt) as it would a wait
        of this process. The call is abandoned, or handed to ``on_interrupt`` (see
        :meth:`~fiberlite.wire.client.Client.request`)."""
        return self._call(method, args, True, on_interrupt)

    def _call(self, method: str, args: tuple, interruptible: bool,
              on_interrupt: Callable[[Callable[[], Any]], None] | None = None) -> Any:
        hub = _hub
        if hub is not None and hub.address == self.address:
            return hub.call_local(self.oid, method, _owned(args), on_interrupt)
        client = self.connection()
        ok, value = client.request(_envelope(self.oid, method, args), interruptible,
                                   on_interrupt)
        if ok:
            return value
        raise value

    def confirm(self, slot: Any, ticket: int) -> None:
        """Send the servant (of another process) a receipt for what it lent this process
        with ``ticket`` (``op_received(request, slot, ticket)``): with the next call or cast
        to that process, or on its own after :data:`RECEIPT_SECONDS`. The item was lent to
        this process's connection: if that has ended, the servant has taken it back already
        (or is gone), and there is nothing to send."""
        client = current(self.address)
        if client is None:
            return
        if client.ride((self.oid, slot, ticket)):
            get_hub().scheduler.call_later(RECEIPT_SECONDS, lambda: send_receipts(client))


def _envelope(oid: int, method: str, args: tuple) -> Carrying:
    """A request, with the receipts waiting to go to its process when it is sent."""
    return Carrying(lambda receipts: (oid, method, args, receipts) if receipts else (oid, method, args))


def _owned(args: tuple) -> tuple:
    """``args`` of a call to a servant of this process: a remote call is encoded (copied)
    when it is sent, a local one is handed over as it is, so payloads that view the
    caller's memory are copied here (``send(array)`` then ``array[:] = 0`` is safe)."""
    for arg in args:
        if type(arg) is Payload and arg.buffers:
            return tuple(a.owned() if type(a) is Payload else a for a in args)
    return args


class LockedServant(Servant):
    """A servant whose operations run under one lock, replying after releasing it; its
    watcher is told after each operation or expiry that may have changed its state."""

    def __init__(self) -> None:
        import threading as _threading
        self._lock = _threading.Lock()
        self._scheduler = get_hub().scheduler

    def run_actions(self, actions) -> None:
        for action in actions:
            action()
        self.tell_watcher()

    def schedule_expiry(self, timeout: float, waiter, waiters, error) -> Any:
        """Answer ``waiter`` with ``error()`` (or False for a poll) after ``timeout`` seconds."""
        def expire() -> None:
            with self._lock:
                if waiter.done:
                    return
                waiter.finish()
                try:
                    waiters.remove(waiter)
                except ValueError:
                    pass
            if error is None:
                waiter.request.reply(False)
            else:
                waiter.request.fail(error())
            self.run_actions(())
        return self._scheduler.call_later(timeout, expire)
