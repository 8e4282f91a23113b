"""Managers: Python objects held by a server job and used from any job through proxies.

``SyncManager().start()`` (or ``fiberlite.Manager()``) starts a job on the context's
backend. That job's hub serves a :class:`ManagerServer`, which holds every object
created through the manager by id and runs the methods that proxies ask for. A proxy
pickles to any job of the run and calls the server directly from there, over the
run's authenticated connections.

- Each calling thread gets its own thread in the server (as ``multiprocessing`` gives
  each its own connection), so blocking methods (``Queue.get``, ``Lock.acquire``,
  ``Event.wait``...) wait there without stopping anyone else, and ``RLock`` and
  ``Condition`` see one owner per calling thread.
- Objects are reference counted per job: an object is freed when every proxy of it
  has been released, or the jobs holding them have ended. A proxy pickled but never
  unpickled keeps its object until the manager shuts down.
- An exception raised by a method in the server is raised in the caller with its
  type, the server's traceback attached as ``__cause__``
  (:class:`~fiberlite.errors.RemoteTraceback`).

Differences from ``multiprocessing.managers``: the server listens on its job's hub
address with the run's key, so ``address`` must be None, ``authkey`` is ignored, and
``connect()`` / ``get_server()`` are not supported: a manager is reached only through
proxies, by jobs of the run that started it.
"""
from __future__ import annotations

import array
import atexit
import builtins
import collections
import itertools
import queue
import threading
import traceback
import weakref
from typing import Any, Callable, Mapping, Sequence

import pynng

from ..errors import ConnectionLost, ProcessError, RemoteTraceback
from ..process import Process, current_process
from ..runtime.finalizing import CastQueue
from ..runtime.hub import Servant, connect, get_hub, ObjectRef
from ..wire.codec import Payload

__all__ = ["BaseManager", "SyncManager", "BaseProxy", "Token", "Namespace", "Value",
           "Array", "AutoProxy", "MakeProxyType", "RebuildProxy", "ListProxy", "DictProxy",
           "NamespaceProxy", "ValueProxy", "ArrayProxy", "AcquirerProxy", "ConditionProxy",
           "EventProxy", "BarrierProxy", "IteratorProxy", "PoolProxy", "ManagerServer"]

# methods every shared object answers, whatever it exposes
_ALWAYS = ("#GETVALUE", "__repr__", "__str__")
_VIEWS = (type({}.keys()), type({}.values()), type({}.items()))


class Token:
    """Names one shared object: its type id, the server holding it and its id there."""

    __slots__ = ("typeid", "server", "id")

    def __init__(self, typeid: str, server: ObjectRef, id: int) -> None:
        self.typeid = typeid
        self.server = server
        self.id = id

    @property
    def address(self) -> str:
        return self.server.address

    def __reduce__(self):
        return (Token, (self.typeid, self.server, self.id))

    def __repr__(self) -> str:
        return f"Token(typeid={self.typeid!r}, address={self.address!r}, id={self.id})"


# ---------------------------------------------------------------------------------------
# The server (runs in the manager's job)
# ---------------------------------------------------------------------------------------

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
    worker thread; the others are answered at once on the hub thread.
    """

    def __init__(self, registry: Mapping[str, tuple]) -> None:
        self._registry = dict(registry)
        self._lock = threading.Lock()
        self._ids = itertools.count(1)
        self._objects: dict[int, tuple[Any, tuple[str, ...], str]] = {}
        self._counts: dict[int, int] = {}          # references: held by jobs + in transit
        self._transit: collections.Counter = collections.Counter()  # pickled, not yet unpickled
        self._held: dict[int, collections.Counter] = {}  # peer -> object id -> references
        self._workers: dict[tuple[int, int], _Worker] = {}

    # -- operations answered on the hub thread ------------------------------------------------
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
            raise AttributeError(f"method {method!r} of {type(obj).__name__!r} object is not "
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
           initargs: tuple) -> None:
    """The manager job: serve the shared objects until the manager says stop.

    ``control`` is this job's end of a pipe served by the manager's process: the job
    sends its server's reference on it, then waits on it for "stop" (or EOF).
    """
    # The job is daemonic for its parent (terminated, not joined, at exit) but may start
    # jobs of its own, as a Pool held by the manager does.
    current_process()._daemonic = False
    if initializer is not None:
        initializer(*initargs)
    server = ManagerServer(registry)
    control.send(get_hub().register(server))
    try:
        control.recv()
    except EOFError:
        pass
    server.close()


# ---------------------------------------------------------------------------------------
# Proxies (any job)
# ---------------------------------------------------------------------------------------

_dead: set[str] = set()            # addresses of managers known to be gone
_watched: dict[str, Any] = {}      # address -> the connection watched for loss
_sending = threading.Lock()        # held while a cast is sent; taken to mark a manager dead
# reference changes asked for by finalizers, not sent to managers known to be gone
_pending = CastQueue("fiberlite-manager-refs", skip=lambda ref: ref.address in _dead,
                     guard=_sending)
_tls = threading.local()
_caller_ids = itertools.count(1)


def _gone(address: str, cause: BaseException | None = None) -> ConnectionLost:
    detail = f" ({cause})" if cause is not None else ""
    return ConnectionLost(f"the manager at {address} is no longer running: it was shut down "
                          f"or its job ended{detail}; its proxies cannot be used any more")


def _server_call(ref: ObjectRef, method: str, *args: Any) -> Any:
    """Call the manager server, turning a lost or refused connection into a clear error."""
    address = ref.address
    if address in _dead:
        raise _gone(address)
    try:
        if not ref.is_local:
            client = connect(address)
            if _watched.get(address) is not client:
                _watched[address] = client
                client.on_lost(lambda: _dead.add(address))
        return ref.call(method, *args)
    except (ConnectionError, pynng.NNGException) as exc:
        _dead.add(address)
        raise _gone(address, exc) from exc


class _CallerId:
    """Identifies the calling thread to servers; when the thread ends, they forget it."""

    __slots__ = ("value", "__weakref__")

    def __init__(self, value: int) -> None:
        self.value = value


def _caller(ref: ObjectRef) -> int:
    state = getattr(_tls, "state", None)
    if state is None:
        servers: dict[str, ObjectRef] = {}
        state = _tls.state = (_CallerId(next(_caller_ids)), servers)
        weakref.finalize(state[0], _forget_caller, state[0].value, servers).atexit = False
    caller, servers = state
    if ref.address not in servers:
        servers[ref.address] = ref
    return caller.value


def _forget_caller(caller: int, servers: dict) -> None:
    for ref in list(servers.values()):
        _pending.put(ref, "forget_caller", caller)


def _queue_decref(ref: ObjectRef, oid: int) -> None:
    _pending.put(ref, "decref", oid)  # from a finalizer


def _raise_remote(packed: Payload | None, tb: str, type_name: str, message: str) -> None:
    exc: BaseException
    try:
        exc = packed.unpack() if packed is not None else RuntimeError(f"{type_name}: {message}")
    except Exception:
        exc = RuntimeError(f"{type_name}: {message}")
    raise exc from RemoteTraceback("\n--- traceback in the manager job ---\n" + tb)


class BaseProxy:
    """A reference to a shared object; ``_callmethod`` runs one of its methods in the manager."""

    _exposed_: tuple[str, ...] | None = None
    _method_to_typeid_: dict[str, str] | None = None

    def __init__(self, token: Token, serializer: Any = None, manager: "BaseManager | None" = None,
                 authkey: bytes | None = None, exposed: Sequence[str] | None = None,
                 incref: bool = True, manager_owned: bool = False) -> None:
        self._token = token
        self._id = token.id
        self._server = token.server
        self._manager = manager
        self._exposed = tuple(exposed) if exposed is not None else None
        self._isauto = False
        _pending.start()
        if incref:  # unpickled: this job now holds a reference
            if self._server.address not in _dead:
                try:
                    self._server.cast("adopt", self._id)
                except Exception:
                    pass
        self._close = weakref.finalize(self, _queue_decref, self._server, self._id)
        self._close.atexit = False

    def _callmethod(self, methodname: str, args: tuple = (), kwds: Mapping[str, Any] = {}) -> Any:
        """Run ``methodname(*args, **kwds)`` on the shared object and return the result."""
        reply = _server_call(self._server, "invoke", _caller(self._server), self._id,
                             methodname, Payload.pack((tuple(args), dict(kwds))))
        return self._unpack(reply)

    def _unpack(self, reply: Payload) -> Any:
        kind, *rest = reply.unpack()
        if kind == "ok":
            return rest[0]
        if kind == "proxy":
            typeid, oid, exposed, proxytype = rest
            token = Token(typeid, self._server, oid)
            return (proxytype or AutoProxy)(token, manager=self._manager, exposed=exposed,
                                            incref=False)
        _raise_remote(*rest)

    def _getvalue(self) -> Any:
        """A copy of the shared object."""
        return self._callmethod("#GETVALUE")

    def __reduce__(self):
        # keep the object alive until the copy is unpickled (it adopts this reference)
        try:
            _server_call(self._server, "incref", self._id)
        except ConnectionLost:
            pass
        kwds = {"exposed": self._exposed} if self._isauto else {}
        factory = AutoProxy if self._isauto else type(self)
        return (RebuildProxy, (factory, self._token, None, kwds))

    def __deepcopy__(self, memo: dict) -> Any:
        return self._getvalue()

    def __repr__(self) -> str:
        return (f"<{type(self).__name__} object, typeid {self._token.typeid!r} "
                f"at {id(self):#x}>")

    def __str__(self) -> str:
        try:
            return self._callmethod("__repr__")
        except Exception:
            return repr(self)[:-1] + "; '__str__()' failed>"


def RebuildProxy(func: Callable, token: Token, serializer: Any, kwds: dict) -> BaseProxy:
    """Unpickle a proxy: it takes over the reference its pickling reserved."""
    kwds = dict(kwds)
    kwds.setdefault("incref", True)
    return func(token, serializer, **kwds)


def _method(name: str) -> Callable:
    def method(self, *args, **kwds):
        return self._callmethod(name, args, kwds)
    method.__name__ = name
    return method


_proxy_types: dict[tuple[str, tuple[str, ...]], type] = {}


def MakeProxyType(name: str, exposed: Sequence[str], _cache: dict | None = None) -> type:
    """A :class:`BaseProxy` subclass with one forwarding method per name in ``exposed``."""
    cache = _proxy_types if _cache is None else _cache
    exposed = tuple(exposed)
    key = (name, exposed)
    cls = cache.get(key)
    if cls is None:
        namespace = {meth: _method(meth) for meth in exposed}
        namespace["_exposed_"] = exposed
        cls = cache[key] = type(name, (BaseProxy,), namespace)
    return cls


def AutoProxy(token: Token, serializer: Any = None, manager: "BaseManager | None" = None,
              authkey: bytes | None = None, exposed: Sequence[str] | None = None,
              incref: bool = True, manager_owned: bool = False) -> BaseProxy:
    """A proxy forwarding every method the shared object exposes."""
    if exposed is None:
        exposed = _server_call(token.server, "exposed", token.id)
    cls = MakeProxyType(f"AutoProxy[{token.typeid}]", exposed)
    proxy = cls(token, manager=manager, exposed=exposed, incref=incref)
    proxy._isauto = True
    return proxy


class IteratorProxy(BaseProxy):
    _exposed_ = ("__next__", "send", "throw", "close")

    def __iter__(self):
        return self

    def __next__(self, *args: Any) -> Any:
        return self._callmethod("__next__", args)

    def send(self, *args: Any) -> Any:
        return self._callmethod("send", args)

    def throw(self, *args: Any) -> Any:
        return self._callmethod("throw", args)

    def close(self, *args: Any) -> Any:
        return self._callmethod("close", args)


class AcquirerProxy(BaseProxy):
    _exposed_ = ("acquire", "release")

    def acquire(self, blocking: bool = True, timeout: float | None = None) -> bool:
        return self._callmethod("acquire", (blocking,) if timeout is None else (blocking, timeout))

    def release(self) -> None:
        return self._callmethod("release")

    def __enter__(self) -> bool:
        return self._callmethod("acquire")

    def __exit__(self, *exc: Any) -> None:
        return self._callmethod("release")


class ConditionProxy(AcquirerProxy):
    _exposed_ = ("acquire", "release", "wait", "notify", "notify_all")

    def wait(self, timeout: float | None = None) -> bool:
        return self._callmethod("wait", (timeout,))

    def notify(self, n: int = 1) -> None:
        return self._callmethod("notify", (n,))

    def notify_all(self) -> None:
        return self._callmethod("notify_all")

    def wait_for(self, predicate: Callable[[], Any], timeout: float | None = None) -> Any:
        """Wait until ``predicate()`` is true (evaluated here, after each wake-up)."""
        import time
        deadline = None if timeout is None else time.monotonic() + timeout
        result = predicate()
        while not result:
            remaining = None
            if deadline is not None:
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    break
            self.wait(remaining)
            result = predicate()
        return result


class EventProxy(BaseProxy):
    _exposed_ = ("is_set", "set", "clear", "wait")

    def is_set(self) -> bool:
        return self._callmethod("is_set")

    def set(self) -> None:
        return self._callmethod("set")

    def clear(self) -> None:
        return self._callmethod("clear")

    def wait(self, timeout: float | None = None) -> bool:
        return self._callmethod("wait", (timeout,))


class BarrierProxy(BaseProxy):
    _exposed_ = ("__getattribute__", "wait", "abort", "reset")

    def wait(self, timeout: float | None = None) -> int:
        return self._callmethod("wait", (timeout,))

    def abort(self) -> None:
        return self._callmethod("abort")

    def reset(self) -> None:
        return self._callmethod("reset")

    parties = property(lambda self: self._callmethod("__getattribute__", ("parties",)))
    n_waiting = property(lambda self: self._callmethod("__getattribute__", ("n_waiting",)))
    broken = property(lambda self: self._callmethod("__getattribute__", ("broken",)))


class NamespaceProxy(BaseProxy):
    _exposed_ = ("__getattribute__", "__setattr__", "__delattr__")

    def __getattr__(self, name: str) -> Any:
        if name.startswith("_"):
            return object.__getattribute__(self, name)
        return object.__getattribute__(self, "_callmethod")("__getattribute__", (name,))

    def __setattr__(self, name: str, value: Any) -> None:
        if name.startswith("_"):
            object.__setattr__(self, name, value)
        else:
            object.__getattribute__(self, "_callmethod")("__setattr__", (name, value))

    def __delattr__(self, name: str) -> None:
        if name.startswith("_"):
            object.__delattr__(self, name)
        else:
            object.__getattribute__(self, "_callmethod")("__delattr__", (name,))


class ValueProxy(BaseProxy):
    _exposed_ = ("get", "set")

    def get(self) -> Any:
        return self._callmethod("get")

    def set(self, value: Any) -> None:
        return self._callmethod("set", (value,))

    value = property(get, set)


_LIST_METHODS = ("__add__", "__contains__", "__delitem__", "__getitem__", "__len__", "__mul__",
                 "__reversed__", "__rmul__", "__setitem__", "append", "count", "extend", "index",
                 "insert", "pop", "remove", "reverse", "sort", "__imul__")


BaseListProxy = MakeProxyType("BaseListProxy", _LIST_METHODS)


class ListProxy(BaseListProxy):
    """A shared list; iterating takes a snapshot of it."""

    def __iter__(self):
        return iter(self._getvalue())

    def __iadd__(self, value: Any) -> "ListProxy":
        self._callmethod("extend", (value,))
        return self

    def __imul__(self, value: int) -> "ListProxy":
        self._callmethod("__imul__", (value,))
        return self


BaseDictProxy = MakeProxyType("BaseDictProxy", (
    "__contains__", "__delitem__", "__getitem__", "__iter__", "__len__", "__setitem__",
    "clear", "copy", "get", "items", "keys", "pop", "popitem", "setdefault", "update",
    "values"))


class DictProxy(BaseDictProxy):
    """A shared dict; ``keys()``, ``values()`` and ``items()`` return lists."""

    _method_to_typeid_ = {"__iter__": "Iterator"}


ArrayProxy = MakeProxyType("ArrayProxy", ("__len__", "__getitem__", "__setitem__"))


BasePoolProxy = MakeProxyType("BasePoolProxy", (
    "apply", "apply_async", "close", "imap", "imap_unordered", "join", "map", "map_async",
    "starmap", "starmap_async", "terminate"))


class PoolProxy(BasePoolProxy):
    """A :class:`fiberlite.pool.Pool` running in the manager's job."""

    _method_to_typeid_ = {"apply_async": "AsyncResult", "map_async": "AsyncResult",
                          "starmap_async": "AsyncResult", "imap": "Iterator",
                          "imap_unordered": "Iterator"}

    def __enter__(self) -> "PoolProxy":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.terminate()


# ---------------------------------------------------------------------------------------
# Objects created in the server by SyncManager
# ---------------------------------------------------------------------------------------

class Namespace:
    """A bag of attributes."""

    def __init__(self, **kwds: Any) -> None:
        self.__dict__.update(kwds)

    def __repr__(self) -> str:
        items = [f"{k}={v!r}" for k, v in sorted(self.__dict__.items()) if not k.startswith("_")]
        return f"Namespace({', '.join(items)})"


class Value:
    """A single value with ``get``/``set`` (what ``SyncManager.Value`` holds)."""

    def __init__(self, typecode: Any, value: Any, lock: Any = True) -> None:
        self._typecode = typecode
        self._value = value

    def get(self) -> Any:
        return self._value

    def set(self, value: Any) -> None:
        self._value = value

    value = property(get, set)

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self._typecode!r}, {self._value!r})"


def Array(typecode: str, sequence: Any, lock: Any = True) -> array.array:
    """An ``array.array`` (what ``SyncManager.Array`` holds)."""
    return array.array(typecode, sequence)


def _make_pool(processes: int | None = None, initializer: Callable | None = None,
               initargs: tuple = (), maxtasksperchild: int | None = None) -> Any:
    from ..pool.pool import Pool
    return Pool(processes, initializer, initargs, maxtasksperchild)


# ---------------------------------------------------------------------------------------
# Managers (the process that starts them)
# ---------------------------------------------------------------------------------------

class _State:
    INITIAL, STARTED, SHUTDOWN = "initial", "started", "shutdown"

    def __init__(self) -> None:
        self.value = _State.INITIAL


_managers: "weakref.WeakSet[BaseManager]" = weakref.WeakSet()  # started, maybe running


def _stop(process: Any, server: ObjectRef, control: Any, state: _State, timeout: float) -> None:
    """Tell the server job to stop, then make sure it is gone."""
    if state.value != _State.STARTED:
        return
    state.value = _State.SHUTDOWN
    with _sending:  # from now on proxies fail at once, and no decref is sent
        _dead.add(server.address)
    client = _watched.get(server.address)
    try:
        if client is not None and client.alive:
            client.flush()  # collect the replies to what was sent, before the job goes
    except Exception:
        pass
    # Stop through the pipe served here, not a request to the job: the job's connection
    # must not close under a request that is still being sent.
    try:
        control.send("stop")
        control.close()
    except Exception:
        pass
    if process.is_alive():
        process.join(timeout)
    if process.is_alive():
        process.terminate()
        process.join(timeout)
    if process.is_alive():
        process.kill()
        process.join()


class BaseManager:
    """Starts a server job holding shared objects; ``register`` adds the types it can create."""

    _registry: dict[str, tuple] = {}

    def __init__(self, address: Any = None, authkey: bytes | None = None,
                 serializer: str = "pickle", ctx: Any = None, *,
                 shutdown_timeout: float = 5.0) -> None:
        if address is not None:
            raise ValueError(
                "fiberlite managers listen on their job's own address, chosen by the backend; "
                "pass address=None and hand proxies to other jobs (connecting to a manager "
                "by address is not supported)")
        if serializer != "pickle":
            raise ValueError(f"unsupported serializer {serializer!r}: only 'pickle' is available")
        self._ctx = ctx
        self._authkey = authkey  # accepted for compatibility; connections use the run's key
        self._shutdown_timeout = shutdown_timeout
        self._state = _State()
        self._process: Any = None
        self._server: ObjectRef | None = None
        self._finalizer: Any = None

    # -- life cycle ----------------------------------------------------------------------------------
    def start(self, initializer: Callable[..., Any] | None = None, initargs: tuple = ()) -> None:
        """Start the server job (running ``initializer(*initargs)`` there first)."""
        if self._state.value == _State.STARTED:
            raise ProcessError("Already started server")
        if self._state.value == _State.SHUTDOWN:
            raise ProcessError("Manager has shut down")
        if initializer is not None and not callable(initializer):
            raise TypeError("initializer must be a callable")
        from ..connection.pipe import Pipe
        control, job_end = Pipe()
        process = (Process if self._ctx is None else self._ctx.Process)(target=_serve, args=(self._registry, job_end, initializer,
                                                         tuple(initargs)), daemon=True)
        process.name = f"{type(self).__name__}-{':'.join(str(i) for i in process._identity)}"
        process.start()
        job_end.close()
        server = None
        try:
            while not control.poll(0.1):
                if process.exitcode is not None:
                    break
            if process.exitcode is None or control.poll(0):
                server = control.recv()
        except EOFError:
            pass
        if not isinstance(server, ObjectRef) or process.exitcode is not None:
            control.close()
            process.join(self._shutdown_timeout)
            if process.is_alive():
                process.kill()
                process.join()
            raise ProcessError(f"the manager job {process.name} exited with code "
                               f"{process.exitcode} before it was ready (see its output)")
        self._process, self._server = process, server
        self._state.value = _State.STARTED
        self._finalizer = weakref.finalize(self, _stop, process, server, control, self._state,
                                           self._shutdown_timeout)
        self._finalizer.atexit = False  # _shutdown_all runs first, before jobs are joined
        _managers.add(self)

    def shutdown(self) -> None:
        """Stop the server job and wait for it; its proxies raise ``ConnectionError`` after."""
        if self._finalizer is not None:
            self._finalizer()

    def join(self, timeout: float | None = None) -> None:
        """Wait for the server job to end."""
        if self._process is not None:
            self._process.join(timeout)

    def connect(self) -> None:
        """Not supported: a fiberlite manager is used only through proxies of the run."""
        raise NotImplementedError(
            "fiberlite managers cannot be connected to by address; start() the manager and "
            "pass its proxies (they pickle) to the jobs that need them")

    def get_server(self) -> None:
        """Not supported: the server always runs as a job (use start())."""
        raise NotImplementedError("fiberlite managers run their server as a job: use start()")

    @property
    def address(self) -> str | None:
        """The address of the server job's hub, once started."""
        return self._server.address if self._server is not None else None

    def __enter__(self) -> "BaseManager":
        if self._state.value == _State.INITIAL:
            self.start()
        if self._state.value != _State.STARTED:
            raise ProcessError("Manager has shut down" if self._state.value == _State.SHUTDOWN
                               else "Unable to start server")
        return self

    def __exit__(self, *exc: Any) -> None:
        self.shutdown()

    def __reduce__(self):
        raise TypeError(f"a {type(self).__name__} cannot be pickled; pass its proxies to other "
                        "jobs instead")

    # -- creating shared objects --------------------------------------------------------------------
    def _create(self, typeid: str, args: tuple, kwds: dict) -> BaseProxy:
        if self._state.value != _State.STARTED:
            raise ProcessError("Manager has shut down" if self._state.value == _State.SHUTDOWN
                               else "Manager is not started: call start() or use it in a with block")
        server = self._server
        reply = _server_call(server, "create", _caller(server), typeid, Payload.pack((args, kwds)))
        kind, *rest = reply.unpack()
        if kind != "proxy":
            _raise_remote(*rest)
        typeid, oid, exposed, _ = rest
        proxytype = self._registry[typeid][3]
        return proxytype(Token(typeid, server, oid), manager=self, exposed=exposed, incref=False)

    def _number_of_objects(self) -> int:
        """How many shared objects the server holds."""
        return _server_call(self._server, "count")

    def _number_of_threads(self) -> int:
        """How many calling threads the server keeps a thread for."""
        return _server_call(self._server, "threads")

    @classmethod
    def register(cls, typeid: str, callable: Callable[..., Any] | None = None,
                 proxytype: Any = None, exposed: Sequence[str] | None = None,
                 method_to_typeid: Mapping[str, str] | None = None,
                 create_method: bool = True) -> None:
        """Make ``typeid`` a type this manager can create: ``callable(*args, **kwds)`` builds
        the object in the server, ``proxytype`` (default: :func:`AutoProxy`) is returned."""
        if not isinstance(typeid, str):
            raise TypeError(f"typeid must be a str, not {type(typeid).__name__}")
        if callable is not None and not builtins.callable(callable):
            raise TypeError(f"register({typeid!r}): callable must create the shared object "
                            f"(a class or function), got {callable!r}")
        if proxytype is not None and proxytype is not AutoProxy and not (
                isinstance(proxytype, type) and issubclass(proxytype, BaseProxy)):
            raise TypeError(f"register({typeid!r}): proxytype must be a BaseProxy subclass, "
                            f"got {proxytype!r}")
        if "_registry" not in cls.__dict__:
            cls._registry = dict(cls._registry)
        proxytype = proxytype or AutoProxy
        exposed = exposed if exposed is not None else getattr(proxytype, "_exposed_", None)
        if exposed is not None:
            exposed = tuple(exposed)
            if not all(isinstance(name, str) for name in exposed):
                raise TypeError(f"register({typeid!r}): exposed must be a sequence of method names")
        method_to_typeid = (method_to_typeid if method_to_typeid is not None
                            else getattr(proxytype, "_method_to_typeid_", None))
        if method_to_typeid is not None:
            method_to_typeid = dict(method_to_typeid)
            if not all(isinstance(k, str) and isinstance(v, str)
                       for k, v in method_to_typeid.items()):
                raise TypeError(f"register({typeid!r}): method_to_typeid must map names to typeids")
        cls._registry[typeid] = (callable, exposed, method_to_typeid, proxytype)
        if create_method:
            def create(self, *args: Any, **kwds: Any) -> BaseProxy:
                return self._create(typeid, args, kwds)
            create.__name__ = typeid
            create.__qualname__ = f"{cls.__name__}.{typeid}"
            create.__doc__ = f"Create a shared {typeid!r} in the manager and return its proxy."
            setattr(cls, typeid, create)


class SyncManager(BaseManager):
    """A manager of dict, list, Namespace, queues, locks, Value, Array and Pool."""


SyncManager.register("Queue", queue.Queue)
SyncManager.register("JoinableQueue", queue.Queue)
SyncManager.register("Event", threading.Event, EventProxy)
SyncManager.register("Lock", threading.Lock, AcquirerProxy)
SyncManager.register("RLock", threading.RLock, AcquirerProxy)
SyncManager.register("Semaphore", threading.Semaphore, AcquirerProxy)
SyncManager.register("BoundedSemaphore", threading.BoundedSemaphore, AcquirerProxy)
SyncManager.register("Condition", threading.Condition, ConditionProxy)
SyncManager.register("Barrier", threading.Barrier, BarrierProxy)
SyncManager.register("Pool", _make_pool, PoolProxy)
SyncManager.register("list", list, ListProxy)
SyncManager.register("dict", dict, DictProxy)
SyncManager.register("Value", Value, ValueProxy)
SyncManager.register("Array", Array, ArrayProxy)
SyncManager.register("Namespace", Namespace, NamespaceProxy)
SyncManager.register("Iterator", proxytype=IteratorProxy, create_method=False)
SyncManager.register("AsyncResult", create_method=False)


def _shutdown_all() -> None:
    """At exit, stop the managers still running (before their jobs would be terminated)."""
    for manager in list(_managers):
        try:
            manager.shutdown()
        except Exception:
            pass


atexit.register(_shutdown_all)
