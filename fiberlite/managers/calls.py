"""Calling a manager's server from any job; what proxies and managers share.

A :class:`Token` names one shared object, and the server holding it by the random
identity that server took when it started: a port is reused, and a proxy of a manager
shut down must not reach the object with its id in a manager now listening there.
:func:`_server_call` sends a request to the server (:mod:`.server`) and turns a lost
connection, or a server that is not the one named, into a clear error; the calling
thread is named to the server by :func:`_caller`. Managers known to be gone are kept in
``_dead``, so that proxies (:mod:`.proxies`) fail at once and their reference changes,
queued by finalizers in ``_pending``, are not sent; :mod:`.manager` marks its server
gone when it shuts it down.
"""
from __future__ import annotations

import itertools
import threading
import weakref
from typing import Any


from ..errors import ConnectionLost, RemoteTraceback
from ..runtime.finalizing import CastQueue
from ..runtime.hub import ObjectRef
from ..wire.codec import Payload

__all__ = ["Token", "RemoteError", "NotExposedError"]


class RemoteError(Exception):
    """An error reported by a manager's server (``multiprocessing.managers.RemoteError``)."""

    def __str__(self) -> str:
        text = str(self.args[0]) if self.args else ""
        return "\n" + "-" * 75 + "\n" + text + "\n" + "-" * 75


class NotExposedError(RemoteError, AttributeError):
    """A proxy called a method its object does not expose."""


class Token:
    """Names one shared object: its type id, the server holding it, that server's
    identity (:attr:`ManagerServer.ident <.server.ManagerServer.ident>`) and its id there."""

    __slots__ = ("typeid", "server", "id", "ident")

    def __init__(self, typeid: str, server: ObjectRef, id: int, ident: str) -> None:
        self.typeid = typeid
        self.server = server
        self.id = id
        self.ident = ident

    @property
    def address(self) -> str:
        return self.server.address

    def __reduce__(self):
        return (Token, (self.typeid, self.server, self.id, self.ident))

    def __repr__(self) -> str:
        return f"Token(typeid={self.typeid!r}, address={self.address!r}, id={self.id})"


class OtherServer(Exception):
    """What a server answers a request naming another server's identity: that of a
    manager that listened at its address before it."""


_dead: set[str] = set()            # addresses of managers known to be gone
_watched: dict[str, Any] = {}      # address -> the connection watched for loss
_sending = threading.Lock()        # held while a cast is sent; taken to mark a manager dead
# reference changes asked for by finalizers, not sent to managers known to be gone
_pending = CastQueue("fiberlite-manager-refs", skip=lambda ref: ref.address in _dead,
                     guard=_sending)
_tls = threading.local()
_caller_ids = itertools.count(1)


def _gone(address: str, cause: object = None) -> ConnectionLost:
    """The error a call to the gone manager at ``address`` raises."""
    detail = f" ({cause})" if cause is not None else ""
    return ConnectionLost(f"the manager at {address} is no longer running: it was shut down "
                          f"or its job ended{detail}; its proxies cannot be used any more")


def _server_call(ref: ObjectRef, method: str, *args: Any) -> Any:
    """Call the manager server, turning a lost or refused connection, or a server that is
    not the one named (:class:`OtherServer`), into a clear error."""
    address = ref.address
    if address in _dead:
        raise _gone(address)
    try:
        if not ref.is_local:
            client = ref.connection()
            if _watched.get(address) is not client:
                _watched[address] = client
                client.on_lost(lambda: _dead.add(address))
        return ref.call(method, *args)
    except OtherServer:  # the manager listening at address now is a live one
        raise _gone(address, f"another manager now listens at {address} and does not hold "
                             "its objects") from None
    except ConnectionError as exc:
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


def _queue_decref(ref: ObjectRef, ident: str, oid: int) -> None:
    _pending.put(ref, "decref", ident, oid)  # from a finalizer


def _raise_remote(packed: Payload | None, tb: str, type_name: str, message: str) -> None:
    exc: BaseException
    try:
        exc = packed.unpack() if packed is not None else RuntimeError(f"{type_name}: {message}")
    except Exception:
        exc = RuntimeError(f"{type_name}: {message}")
    raise exc from RemoteTraceback("\n--- traceback in the manager job ---\n" + tb)
