"""Proxies: the objects through which any job uses a shared object.

:class:`BaseProxy` runs a method of its object in the manager's server (:mod:`.server`)
through :mod:`.calls`, keeps the object alive while it exists, and pickles to other jobs
of the run (:func:`RebuildProxy` unpickles it). :func:`MakeProxyType` and
:func:`AutoProxy` build proxies forwarding a list of methods; the concrete types below
are those :class:`~fiberlite.managers.manager.SyncManager` registers.
"""
from __future__ import annotations

import weakref
from typing import Any, Callable, Mapping, Sequence

from ..errors import ConnectionLost
from ..synchronize.condition import wait_until
from .calls import Token, _call, _dead, _pending, _queue_decref, _raise_remote, _server_call

__all__ = ["BaseProxy", "RebuildProxy", "MakeProxyType", "AutoProxy", "IteratorProxy",
           "AcquirerProxy", "ConditionProxy", "EventProxy", "BarrierProxy", "NamespaceProxy",
           "ValueProxy", "ArrayProxy", "BaseListProxy", "ListProxy", "BaseDictProxy",
           "DictProxy", "BasePoolProxy", "PoolProxy"]


class BaseProxy:
    """A reference to a shared object; ``_callmethod`` runs one of its methods in the manager."""

    _exposed_: tuple[str, ...] | None = None
    _method_to_typeid_: dict[str, str] | None = None

    def __init__(self, token: Token, serializer: Any = None, manager: Any = None,
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
                    self._server.cast("adopt", token.ident, self._id)
                except Exception:
                    pass
        self._close = weakref.finalize(self, _queue_decref, self._server, token.ident, self._id)
        self._close.atexit = False

    def _callmethod(self, methodname: str, args: tuple = (), kwds: Mapping[str, Any] = {}) -> Any:
        """Run ``methodname(*args, **kwds)`` on the shared object and return the result."""
        kind, *rest = _call(self._server, "invoke", self._token.ident, (self._id, methodname),
                            args if type(args) is tuple else tuple(args),
                            kwds if type(kwds) is dict else dict(kwds))
        if kind == "ok":
            return rest[0]
        if kind == "proxy":
            typeid, oid, exposed, proxytype, held = rest
            token = Token(typeid, self._server, oid, self._token.ident)
            return (proxytype or AutoProxy)(token, manager=self._manager, exposed=exposed,
                                            incref=not held)
        _raise_remote(*rest)

    def _getvalue(self) -> Any:
        """A copy of the shared object."""
        return self._callmethod("#GETVALUE")

    def __reduce__(self):
        # keep the object alive until the copy is unpickled (it adopts this reference)
        try:
            _server_call(self._server, "incref", self._token.ident, self._id)
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


def AutoProxy(token: Token, serializer: Any = None, manager: Any = None,
              authkey: bytes | None = None, exposed: Sequence[str] | None = None,
              incref: bool = True, manager_owned: bool = False) -> BaseProxy:
    """A proxy forwarding every method the shared object exposes."""
    if exposed is None:
        exposed = _server_call(token.server, "exposed", token.ident, token.id)
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
        return wait_until(self.wait, predicate, timeout)


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
    """A shared list; iterating reads one item at a time (``__getitem__``), so it sees
    items changed during the iteration, as the standard library's does."""

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
