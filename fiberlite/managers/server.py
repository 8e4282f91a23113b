"""The server side of a manager: what runs in the manager's job.

:func:`_serve` is the job's target: it registers a :class:`ManagerServer` with the job's
hub and serves until the manager (:mod:`.manager`) says stop. The server holds the shared
objects by id, counts the references jobs hold to them, and runs the calls of each
calling thread on a thread of its own: the thread of that caller's own connection
(:mod:`.stream`, :meth:`ManagerServer.serve_call`), or, for calls that come through the
hub (with ``tls``), a :class:`_Worker`. Its replies to ``create`` and ``invoke`` are
``("ok", value)``, ``("proxy", typeid, id, exposed, proxytype, held)`` for a new shared
object (``held``: already counted for the caller's job; else the caller's proxy adopts
it), or ``("error", failure)`` (a :class:`~fiberlite.failure.Failure`), which
:mod:`.calls` raises in the caller.

Each server has a random identity, drawn when it is started, which the tokens of its
objects carry: requests naming an object name the server too, so a proxy of a server
gone before this one, at the same address, never reaches an object here.

The job that serves it runs :func:`~fiberlite.managers.job.serve`.
"""
from __future__ import annotations

import collections
import itertools
import queue
import secrets
import threading
from typing import Any, Callable, Mapping, Sequence

from .. import config
from ..runtime import identity
from ..runtime.hub import Servant
from ..wire.codec import Payload
from ..failure import Failure
from . import serializers
from .calls import OTHER_SERVER, NotExposedError, OtherServer, Parts, decode, encode_reply
from .stream import CallListener

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

    def __init__(self, registry: Mapping[str, tuple], ident: str | None = None,
                 serializer: str = "pickle") -> None:
        self.ident = ident or secrets.token_hex(8)
        self.serializer = serializer  # how values travel (.serializers)
        self.calls: Any = None  # where callers' own connections reach it (.stream), if anywhere
        self.connections: Callable[[], int] = lambda: 0  # how many are served now
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
        """The server's identity, where callers' own connections reach it and its
        serializer: a client connecting by address learns them here."""
        request.reply((self.ident, self.calls, self.serializer))

    def op_create(self, request, caller: int, typeid: str, payload: Payload) -> None:
        self._submit(request, caller, self._packed, self._create, typeid, payload)

    def op_invoke(self, request, caller: int, oid: int, method: str, payload: Payload) -> None:
        self._submit(request, caller, self._packed, self._invoke, oid, method, payload)

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
        request.reply(len(self._workers) + self.connections())

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

    # -- calls on the callers' own connections (.stream) ----------------------------------------
    def open_calls(self, host: str, key: bytes | None) -> CallListener | None:
        """Let callers' threads reach this server on connections of their own at ``host``,
        proving ``key`` (None: the run's); not with ``tls`` (they are not encrypted):
        None then, and calls come through the hub."""
        if config.get("tls"):
            return None
        listener = CallListener(self.serve_call, host, identity.key() if key is None else key,
                                f"the manager {self.ident}")
        self.calls = listener.address
        self.connections = lambda: listener.connections
        return listener

    def serve_call(self, parts: Parts) -> Parts:
        """A ``create`` or ``invoke`` sent on a calling thread's own connection, run on
        that connection's thread: ``("create", ident, typeid, values)`` or ``("invoke",
        ident, oid, method, values)`` (``values``: the arguments and keywords as the
        serializer sends them), answered with the reply encoded
        (:func:`~.calls.encode_reply`). New shared objects are in transit to the caller's job,
        whose proxy adopts them."""
        try:
            op, ident, *args = decode(parts)
            if ident != self.ident:
                return encode_reply((OTHER_SERVER,))
            reply = self._run(None, self._invoke if op == "invoke" else self._create, *args)
        except BaseException as exc:  # (a request that cannot be unpickled here)
            reply = ("error", Failure.of(exc))
        try:
            return encode_reply(reply)
        except Exception as exc:  # a result that cannot be pickled
            return encode_reply(("error", Failure.of(exc)))

    # -- bookkeeping ------------------------------------------------------------------------------
    def _submit(self, request, caller: int, fn: Callable, *args: Any) -> None:
        key = (request.peer, caller)
        with self._lock:
            worker = self._workers.get(key)
            if worker is None:
                worker = self._workers[key] = _Worker(f"fiberlite-manager-{key[0]}-{key[1]}")
        worker.tasks.put((request, fn, args))

    def _store(self, obj: Any, typeid: str, exposed: Sequence[str] | None,
               peer: int | None) -> tuple:
        """Keep ``obj``, held by the job of hub peer ``peer`` (None: in transit to the
        caller's job, which adopts it)."""
        exposed = tuple(exposed) if exposed is not None else public_methods(obj)
        with self._lock:
            oid = next(self._ids)
            self._objects[oid] = (obj, exposed, typeid)
            self._counts[oid] = 1
            if peer is None:
                self._transit[oid] += 1
            else:
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

    # -- work done on the threads of callers ----------------------------------------------------
    @staticmethod
    def _run(peer: int | None, fn: Callable, *args: Any) -> tuple:
        """``fn(peer, *args)``'s reply, or the error it raised as a reply."""
        try:
            return fn(peer, *args)
        except BaseException as exc:
            return ("error", Failure.of(exc))

    def _packed(self, peer: int, fn: Callable, *args: Any) -> Payload:
        """:meth:`_run` for a call through the hub: its last argument is a Payload of
        its values, its reply a Payload."""
        *head, payload = args
        try:
            return Payload.pack(fn(peer, *head, payload.unpack()))
        except BaseException as exc:
            return Payload.pack(("error", Failure.of(exc)))

    def _create(self, peer: int | None, typeid: str, values: Any) -> tuple:
        entry = self._registry.get(typeid)
        if entry is None:
            raise KeyError(f"no type {typeid!r} is registered with this manager")
        factory, exposed, _method_to_typeid, proxytype = entry
        if factory is None:
            raise TypeError(f"type {typeid!r} is registered without a callable: "
                            "it is only returned by methods of other shared objects")
        args, kwds = serializers.loads(self.serializer, values)
        obj = factory(*args, **kwds)
        oid, exposed = self._store(obj, typeid, exposed, peer)
        return ("proxy", typeid, oid, exposed, None, peer is not None)

    def _invoke(self, peer: int | None, oid: int, method: str, values: Any) -> tuple:
        entry = self._objects.get(oid)
        if entry is None:
            raise ReferenceError(f"shared object {oid} no longer exists in the manager "
                                 "(every proxy of it was released)")
        obj, exposed, typeid = entry
        if method == "#GETVALUE":
            return ("ok", serializers.dumps(self.serializer, obj))
        if method not in exposed and method not in _ALWAYS:
            raise NotExposedError(f"method {method!r} of {type(obj).__name__!r} object is not "
                                  f"in exposed={exposed!r}")
        args, kwds = serializers.loads(self.serializer, values)
        result = getattr(obj, method)(*args, **kwds)
        method_to_typeid = self._registry[typeid][2] if typeid in self._registry else None
        if method_to_typeid and method in method_to_typeid:
            rtypeid = method_to_typeid[method]
            _factory, rexposed, _m2t, proxytype = self._registry[rtypeid]
            roid, rexposed = self._store(result, rtypeid, rexposed, peer)
            return ("proxy", rtypeid, roid, rexposed, proxytype, peer is not None)
        if isinstance(result, _VIEWS):
            result = list(result)
        return ("ok", serializers.dumps(self.serializer, result))

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
