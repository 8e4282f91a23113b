"""The server side of a manager: what runs in the manager's job.

:func:`_serve` is the job's target: it registers a :class:`ManagerServer` with the job's
hub and serves until the manager (:mod:`.manager`) says stop. The server holds the shared
objects by id, counts the references jobs hold to them, and runs the calls of each
calling thread on a thread of its own (:class:`_Worker`). Its replies to ``create`` and
``invoke`` are ``("ok", value)``, ``("proxy", typeid, id, exposed, proxytype)`` for a new
shared object, or an error payload that :mod:`.calls` raises in the caller.

Each server has a random identity, drawn when it is started, which the tokens of its
objects carry: requests naming an object name the server too, so a proxy of a server
gone before this one, at the same address, never reaches an object here.
"""
from __future__ import annotations

import collections
import itertools
import queue
import secrets
import threading
import traceback
from typing import Any, Callable, Mapping, Sequence

from ..process import current_process
from ..runtime.hub import Servant, get_hub
from ..wire.codec import Payload
from .calls import NotExposedError, OtherServer

__all__ = ["ManagerServer", "public_methods"]

# methods every shared object answers, whatever it exposes
_ALWAYS = ("#GETVALUE", "__repr__", "__str__")
_VIEWS = (type({}.keys()), type({}.values()), type({}.items()))
# operations whose first argument is the identity of the server they are meant for;
# those of another server are refused, or dropped if they only change reference counts
_NAMED = frozenset({"create", "invoke", "incref", "exposed", "adopt", "decref"})
_DROPPED = frozenset({"adopt", "decref"})


def public_methods(obj: Any) -> tuple[str, ...]:
    """Names of the callable attributes of ``obj`` not starting with ``_``."""
    return tuple(name for name in dir(obj)
                 if not name.startswith("_") and callable(getattr(obj, name, None)))


class _Worker:
    """The server thread running the calls of one calling thread, in order."""

    def __init__(self, name: str) -> None:
        self.tasks: queue.SimpleQueue = queue.SimpleQueue()
        threading.Thread(target=self._loop, name=name, daemon=True).start()

    def _loop(self) -> None:
        while True:
            task = self.tasks.get()
            if task is None:
                return
            request, fn, args = task
            del task
            value = None
            try:
                value = fn(request.peer, *args)
            except BaseException as exc:  # a bug here must still answer the caller
                request.fail(exc)
            else:
                request.reply(value)
            del request, args, value


class ManagerServer(Servant):
    """Holds the shared objects by id and runs the methods proxies call on them.

    Operations that run user code (``create``, ``invoke``) go to the calling thread's
    worker thread; the others are answered at once on the hub thread. ``ident`` (random
    unless given) is the identity that requests naming objects must carry.
    """

    def __init__(self, registry: Mapping[str, tuple], ident: str | None = None) -> None:
        self.ident = ident or secrets.token_hex(8)
        self._registry = dict(registry)
        self._lock = threading.Lock()
        self._ids = itertools.count(1)
        self._objects: dict[int, tuple[Any, tuple[str, ...], str]] = {}
        self._counts: dict[int, int] = {}          # references: held by jobs + in transit
        self._transit: collections.Counter = collections.Counter()  # pickled, not yet unpickled
        self._held: dict[int, collections.Counter] = {}  # peer -> object id -> references
        self._workers: dict[tuple[int, int], _Worker] = {}
        self.stop_requested = threading.Event()  # a client called shutdown

    def dispatch(self, request, method: str, args: tuple) -> None:
        """Check the identity carried by a request naming objects, then handle it."""
        if method in _NAMED:
            ident, *rest = args
            if ident != self.ident:
                if method in _DROPPED:
                    request.reply()
                else:
                    request.fail(OtherServer(f"this manager server is not {ident!r}"))
                return
            args = tuple(rest)
        super().dispatch(request, method, args)

    # -- operations answered on the hub thread ------------------------------------------------
    def op_ident(self, request) -> None:
        """The server's identity: a client connecting by address learns it here."""
        request.reply(self.ident)

    def op_create(self, request, caller: int, typeid: str, payload: Payload) -> None:
        self._submit(request, caller, self._guarded, self._create, typeid, payload)

    def op_invoke(self, request, caller: int, oid: int, method: str, payload: Payload) -> None:
        self._submit(request, caller, self._guarded, self._invoke, oid, method, payload)

    def op_incref(self, request, oid: int) -> None:
        """A proxy is being pickled: keep its object until the copy is unpickled."""
        with self._lock:
            alive = oid in self._counts
            if alive:
                self._counts[oid] += 1
                self._transit[oid] += 1
        request.reply(alive)

    def op_adopt(self, request, oid: int) -> None:
        """A proxy was unpickled in the caller's job: that job now holds a reference."""
        with self._lock:
            if oid in self._counts:
                if self._transit[oid] > 0:
                    self._transit[oid] -= 1
                else:
                    self._counts[oid] += 1
                self._held.setdefault(request.peer, collections.Counter())[oid] += 1
        request.reply()

    def op_decref(self, request, oid: int) -> None:
        freed = []
        with self._lock:
            held = self._held.get(request.peer)
            if held is not None and held[oid] > 0:
                held[oid] -= 1
                freed = self._release(oid, 1)
        request.reply()
        self._dispose(freed)

    def op_forget_caller(self, request, caller: int) -> None:
        """The calling thread ended: its worker thread ends after its last call."""
        with self._lock:
            worker = self._workers.pop((request.peer, caller), None)
        if worker is not None:
            worker.tasks.put(None)
        request.reply()

    def op_exposed(self, request, oid: int) -> None:
        entry = self._objects.get(oid)
        if entry is None:
            request.fail(ReferenceError(f"shared object {oid} no longer exists in the manager"))
        else:
            request.reply(entry[1])

    def op_shutdown(self, request) -> None:
        """A client asks the server to stop (``serve_forever`` returns)."""
        self.stop_requested.set()
        request.reply()

    def op_count(self, request) -> None:
        request.reply(len(self._objects))

    def op_threads(self, request) -> None:
        request.reply(len(self._workers))

    def peer_lost(self, peer: int) -> None:
        freed = []
        with self._lock:
            workers = [w for key, w in self._workers.items() if key[0] == peer]
            self._workers = {k: w for k, w in self._workers.items() if k[0] != peer}
            for oid, n in (self._held.pop(peer, None) or {}).items():
                if n > 0:
                    freed += self._release(oid, n)
        for worker in workers:
            worker.tasks.put(None)
        self._dispose(freed)

    # -- bookkeeping ------------------------------------------------------------------------------
    def _submit(self, request, caller: int, fn: Callable, *args: Any) -> None:
        key = (request.peer, caller)
        with self._lock:
            worker = self._workers.get(key)
            if worker is None:
                worker = self._workers[key] = _Worker(f"fiberlite-manager-{key[0]}-{key[1]}")
        worker.tasks.put((request, fn, args))

    def _store(self, obj: Any, typeid: str, exposed: Sequence[str] | None, peer: int) -> tuple:
        exposed = tuple(exposed) if exposed is not None else public_methods(obj)
        with self._lock:
            oid = next(self._ids)
            self._objects[oid] = (obj, exposed, typeid)
            self._counts[oid] = 1
            self._held.setdefault(peer, collections.Counter())[oid] += 1
        return oid, exposed

    def _release(self, oid: int, n: int) -> list:
        """Drop ``n`` references (lock held); returns the freed entries."""
        count = self._counts.get(oid)
        if count is None:
            return []
        if count > n:
            self._counts[oid] = count - n
            return []
        del self._counts[oid]
        self._transit.pop(oid, None)
        return [self._objects.pop(oid)]

    @staticmethod
    def _dispose(entries: list) -> None:
        for obj, _exposed, typeid in entries:
            if typeid == "Pool" and hasattr(obj, "terminate"):
                threading.Thread(target=obj.terminate, daemon=True).start()

    # -- work done on the worker threads ---------------------------------------------------------
    def _guarded(self, peer: int, fn: Callable, *args: Any) -> Payload:
        try:
            reply = fn(peer, *args)
            return Payload.pack(reply)
        except BaseException as exc:
            return _error_payload(exc)

    def _create(self, peer: int, typeid: str, payload: Payload) -> tuple:
        entry = self._registry.get(typeid)
        if entry is None:
            raise KeyError(f"no type {typeid!r} is registered with this manager")
        factory, exposed, _method_to_typeid, proxytype = entry
        if factory is None:
            raise TypeError(f"type {typeid!r} is registered without a callable: "
                            "it is only returned by methods of other shared objects")
        args, kwds = payload.unpack()
        obj = factory(*args, **kwds)
        oid, exposed = self._store(obj, typeid, exposed, peer)
        return ("proxy", typeid, oid, exposed, None)

    def _invoke(self, peer: int, oid: int, method: str, payload: Payload) -> tuple:
        entry = self._objects.get(oid)
        if entry is None:
            raise ReferenceError(f"shared object {oid} no longer exists in the manager "
                                 "(every proxy of it was released)")
        obj, exposed, typeid = entry
        if method == "#GETVALUE":
            return ("ok", obj)
        if method not in exposed and method not in _ALWAYS:
            raise NotExposedError(f"method {method!r} of {type(obj).__name__!r} object is not "
                                  f"in exposed={exposed!r}")
        args, kwds = payload.unpack()
        result = getattr(obj, method)(*args, **kwds)
        method_to_typeid = self._registry[typeid][2] if typeid in self._registry else None
        if method_to_typeid and method in method_to_typeid:
            rtypeid = method_to_typeid[method]
            _factory, rexposed, _m2t, proxytype = self._registry[rtypeid]
            roid, rexposed = self._store(result, rtypeid, rexposed, peer)
            return ("proxy", rtypeid, roid, rexposed, proxytype)
        if isinstance(result, _VIEWS):
            result = list(result)
        return ("ok", result)

    def close(self) -> None:
        """Stop the pools the server holds (their jobs are this job's children)."""
        with self._lock:
            entries = list(self._objects.values())
            self._objects.clear()
            self._counts.clear()
        for obj, _exposed, typeid in entries:
            if typeid == "Pool" and hasattr(obj, "terminate"):
                try:
                    obj.terminate()
                except Exception:
                    pass


def _error_payload(exc: BaseException) -> Payload:
    tb = "".join(traceback.format_exception(type(exc), exc, exc.__traceback__))
    try:
        packed = Payload.pack(exc)
    except Exception:
        packed = None
    return Payload.pack(("error", packed, tb, type(exc).__qualname__, str(exc)))


def _serve(registry: Mapping[str, tuple], control: Any, initializer: Callable | None,
           initargs: tuple, address: tuple[str, int] | None = None,
           authkey: bytes | None = None, ident: str | None = None) -> None:
    """The manager job: serve the shared objects (as the server ``ident``) until the
    manager says stop.

    ``control`` is this job's end of a pipe served by the manager's process: the job
    sends its server's reference on it (with ``address``: the address it listens at,
    with ``authkey``), then waits on it for "stop" (or EOF).
    """
    from .remote import AddressListener
    # The job is daemonic for its parent (terminated, not joined, at exit) but may start
    # jobs of its own, as a Pool held by the manager does.
    current_process()._daemonic = False
    if initializer is not None:
        initializer(*initargs)
    server = ManagerServer(registry, ident)
    listener = None
    if address is None:
        control.send(get_hub().register(server))
    else:
        try:
            listener = AddressListener(server, address, authkey)
        except OSError as exc:
            control.send(exc)
            return
        control.send(listener.address)
    try:
        control.recv()
    except EOFError:
        pass
    if listener is not None:
        listener.close()
    server.close()
