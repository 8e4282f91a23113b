"""Calling a manager's server from any job; what proxies and managers share.

A :class:`Token` names one shared object, and the server holding it by the random
identity that server took when it started: a port is reused, and a proxy of a manager
shut down must not reach the object with its id in a manager now listening there. Its
:class:`ServerRef` says where the server is served (a hub, or an address of its own
with its own key) and where callers' own connections reach it (:mod:`.stream`).

:func:`_call` runs ``create`` and ``invoke`` on the calling thread's own connection,
when the server offers them and this process can reach them, else through the hub as
:func:`_server_call` sends every other request (reference counts, identity); both turn
a lost connection, or a server that is not the one named, into a clear error. Managers
known to be gone are kept in ``_dead``, so that proxies (:mod:`.proxies`) fail at once
and their reference changes, queued by finalizers in ``_pending``, are not sent;
:mod:`.manager` marks its server gone when it shuts it down.
"""
from __future__ import annotations

import itertools
import pickle
import threading
import weakref
from typing import Any

from ..errors import ConnectionLost
from ..failure import Failure
from ..runtime import identity
from ..runtime.finalizing import CastQueue
from ..runtime.dialed import connect
from ..runtime.hub import ObjectRef
from ..wire.client import Client
from ..wire.codec import PROTOCOL, Payload, dumps, dumps_quick, loads, plain
from . import serializers, stream
from .stream import Parts

__all__ = ["Token", "RemoteError", "NotExposedError", "ServerRef"]

OTHER_SERVER = "other-server"  # the answer to a call naming another server's identity


class RemoteError(Exception):
    """An error reported by a manager's server (``multiprocessing.managers.RemoteError``)."""

    def __str__(self) -> str:
        text = str(self.args[0]) if self.args else ""
        return "\n" + "-" * 75 + "\n" + text + "\n" + "-" * 75


class NotExposedError(RemoteError, AttributeError):
    """A proxy called a method its object does not expose."""


class ServerRef(ObjectRef):
    """A manager's server: where it is served (``address``, ``oid``), the key a peer
    must prove there (``key``; None: the run's), where callers' own connections reach
    it (``calls``, see :mod:`.stream`; None: through ``address`` only) and how values
    travel to it (``serializer``, see :mod:`.serializers`).

    Pickled, it carries the key, as a stdlib proxy handed to a child does: a job it is
    sent to can reach the manager without being told the key."""

    __slots__ = ("key", "calls", "serializer")

    def __init__(self, address: str, oid: int, key: bytes | None = None,
                 calls: stream.CallAddress | None = None, serializer: str = "pickle") -> None:
        super().__init__(address, oid)
        self.key = key
        self.calls = calls
        self.serializer = serializer

    def __reduce__(self):
        return (ServerRef, (self.address, self.oid, self.key, self.calls, self.serializer))

    def connection(self) -> Client:
        return connect(self.address, self.key)


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
_dead_why: dict[str, str] = {}     # ... and why, for those not shut down from here
_watched: dict[str, Any] = {}      # address -> the connection watched for loss
_sending = threading.Lock()        # held while a cast is sent; taken to mark a manager dead
# reference changes asked for by finalizers, not sent to managers known to be gone
_pending = CastQueue("fiberlite-manager-refs", skip=lambda ref: ref.address in _dead,
                     guard=_sending)
_tls = threading.local()
_pickle_dumps = pickle.dumps
_caller_ids = itertools.count(1)


def _gone(address: str, cause: object = None) -> ConnectionLost:
    """The error a call to the gone manager at ``address`` raises."""
    cause = _dead_why.get(address) if cause is None else cause
    detail = f" ({cause})" if cause is not None else ""
    return ConnectionLost(f"the manager at {address} is no longer running: it was shut down "
                          f"or its job ended{detail}; its proxies cannot be used any more")


_unreachable: set[Any] = set()  # call addresses this process cannot connect to


def encode_request(request: tuple) -> Parts:
    """A request on a caller's own connection (its items but the last are names and
    numbers, the last the call's values), pickled: plain values (as most arguments are)
    with the C pickler, others with cloudpickle."""
    if plain(request[-1], 3):
        return _pickle_dumps(request, PROTOCOL), []
    return dumps(request)


def encode_reply(reply: tuple) -> Parts:
    """A server's reply, pickled as :func:`encode_request` pickles a request."""
    return dumps_quick(reply, depth=4)


def decode(parts: Parts) -> Any:
    return loads(*parts)


def _call(ref: ObjectRef, op: str, ident: str, head: tuple, args: tuple, kwds: dict) -> tuple:
    """The reply to ``create`` (``head``: the type id) or ``invoke`` (``head``: object id,
    method) of ``args`` and ``kwds`` on the manager server ``ref`` (of identity
    ``ident``), its value as the serializer gives it back."""
    serializer = getattr(ref, "serializer", "pickle")
    if serializer == "pickle":  # (the values as they are: the common case, kept short)
        return _send(ref, op, ident, head, (args, kwds))
    reply = _send(ref, op, ident, head, serializers.dumps(serializer, (args, kwds)))
    if reply[0] == "ok":
        return ("ok", serializers.loads(serializer, reply[1]))
    return reply


def _send(ref: ObjectRef, op: str, ident: str, head: tuple, values: Any) -> tuple:
    """A call's request, sent on this thread's own connection when the server offers one
    this process can reach, else through the hub, to the server thread of this thread's
    calls; its reply."""
    calls = getattr(ref, "calls", None)
    if calls is not None and calls not in _unreachable and not ref.is_local:
        address = ref.address
        if address in _dead:
            raise _gone(address)
        if address not in _watched:
            _watch(ref)
        try:
            reply = decode(stream.call(calls, ref.key or identity.key(),
                                       encode_request((op, ident, *head, values)), address))
        except stream.Unreachable:  # (a firewall, a NAT): the hub's address may be reachable
            _unreachable.add(calls)
        except ConnectionError as exc:
            raise _lost_call(ref, ident, exc) from exc
        else:
            if reply == (OTHER_SERVER,):
                raise _gone(address, _OTHER.format(address=address))
            return reply
    return _server_call(ref, op, ident, _caller(ref), *head, Payload.pack(values)).unpack()


_OTHER = "another manager now listens at {address} and does not hold its objects"


def _lost_call(ref: ObjectRef, ident: str, cause: Exception) -> ConnectionLost:
    """The error for a call whose own connection ended: the server is gone, or another
    one listens at its address now (asked through the hub), or only that connection broke."""
    now, _calls, _serializer = _server_call(ref, "ident")  # raises if nothing answers there
    if now != ident:
        return _gone(ref.address, _OTHER.format(address=ref.address))
    return ConnectionLost(f"the connection to the manager at {ref.address} ended during a call "
                          f"({cause}); the call may or may not have run")


def _server_call(ref: ObjectRef, method: str, *args: Any) -> Any:
    """Call the manager server, turning a lost or refused connection, or a server that is
    not the one named (:class:`OtherServer`), into a clear error."""
    address = ref.address
    if address in _dead:
        raise _gone(address)
    try:
        if not ref.is_local:
            _watch(ref)
        return ref.call(method, *args)
    except OtherServer:  # the manager listening at address now is a live one
        raise _gone(address, _OTHER.format(address=address)) from None
    except ConnectionError as exc:
        _mark_dead(address, str(exc))
        raise _gone(address, exc) from exc


def _watch(ref: ObjectRef) -> None:
    """Learn when the manager at ``ref``'s address is gone (from its hub connection)."""
    address = ref.address
    try:
        client = ref.connection()
    except ConnectionError:   # (its calls' own connections say what they can)
        return
    if _watched.get(address) is not client:
        _watched[address] = client
        client.on_lost(lambda: _manager_lost(address, client))


def _manager_lost(address: str, client: Any) -> None:
    """The hub connection to the manager at ``address`` ended, or was given up because the
    manager stayed silent: the manager is gone, and calls waiting on their own
    connections to it (which would wait for ever on a silent one) fail now. Their error
    says why (its silence, or that its job exited), unless it was shut down from here."""
    _mark_dead(address, client.lost_reason)
    stream.abandon(address)


def _mark_dead(address: str, why: str) -> None:
    """The manager at ``address`` is gone, ``why`` as its later calls' errors say (a
    manager shut down from here is dead already, and keeps no reason)."""
    if address not in _dead:
        _dead_why[address] = why
        _dead.add(address)


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


def _raise_remote(failure: Failure) -> None:
    """Raise the exception a method raised in the server (a :class:`RemoteError` naming
    it when it cannot be unpickled here), its traceback there as the cause."""
    raise failure.rebuild(lambda f: RemoteError(f"{f.type_name}: {f.message}"))
