"""Managers: the objects that start a server job and create shared objects in it.

:meth:`BaseManager.start` runs :func:`~fiberlite.managers.job.serve` as a job and
keeps that job's end of a control pipe; ``register`` adds the types a manager can create
and the proxy type (:mod:`.proxies`) each one returns. :class:`SyncManager` registers the
types of ``multiprocessing.managers.SyncManager``, including the :class:`Namespace`,
:class:`Value` and :func:`Array` defined here, which live in the server.
"""
from __future__ import annotations

import array
import builtins
import queue
import secrets
import threading
import weakref
from dataclasses import dataclass
from typing import Any, Callable, Mapping, Sequence

from .. import observe
from ..errors import ProcessError
from ..process import Process
from ..runtime import exit_order
from ..runtime.hub import ObjectRef
from .calls import ServerRef, Token, _call, _dead, _raise_remote, _sending, _server_call, _watched
from .job import serve
from .proxies import (AcquirerProxy, ArrayProxy, AutoProxy, BarrierProxy, BaseProxy,
                      ConditionProxy, DictProxy, EventProxy, IteratorProxy, ListProxy,
                      NamespaceProxy, PoolProxy, ValueProxy)
from . import serializers
from .remote import SERVER_OID, Server, check_address, check_authkey, url_of

__all__ = ["BaseManager", "SyncManager", "Namespace", "Value", "Array"]


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
    from ..pool.master.pool import Pool
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


@dataclass(frozen=True)
class ManagerView:
    """What a started manager shows the run's page (:meth:`BaseManager.view`)."""

    name: str  # its server job's process name
    job: str | None  # the job's name, as ``fiberlite ps`` shows it
    state: str  # ``initial``, ``started`` or ``shutdown``
    alive: bool


class BaseManager:
    """Starts a server job holding shared objects; ``register`` adds the types it can create."""

    _registry: dict[str, tuple] = {}

    def __init__(self, address: Any = None, authkey: bytes | None = None,
                 serializer: str = "pickle", ctx: Any = None, *,
                 shutdown_timeout: float = 5.0) -> None:
        self._serializer = serializers.check(serializer)
        # with an address, the server listens there and checks authkey (default: the
        # run's key); without, it is reached through its job's hub with the run's key
        self._address = check_address(address) if address is not None else None
        self._authkey = check_authkey(authkey)
        self._ctx = ctx
        self._shutdown_timeout = shutdown_timeout
        self._state = _State()
        self._process: Any = None
        self._server: ObjectRef | None = None
        self._ident: str | None = None  # the server's identity, which its tokens carry
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
        ident = secrets.token_hex(8)
        process = (Process if self._ctx is None else self._ctx.Process)(
            target=serve, daemon=True, args=(self._registry, job_end, initializer,
                                              tuple(initargs), self._address, self._authkey,
                                              ident, self._serializer))
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
        if isinstance(server, tuple) and process.exitcode is None:
            where, calls = server
            if isinstance(where, ObjectRef):  # served by its job's hub
                server = ServerRef(where.address, where.oid, None, calls, self._serializer)
                with _sending:  # its job's port may be one a manager shut down here had
                    _dead.discard(server.address)
            else:  # listening at an address
                self._address = where
                server = self._server_ref(calls)
        if not isinstance(server, ObjectRef) or process.exitcode is not None:
            control.close()
            process.join(self._shutdown_timeout)
            if process.is_alive():
                process.kill()
                process.join()
            if isinstance(server, OSError):
                raise server
            raise ProcessError(f"the manager job {process.name} exited with code "
                               f"{process.exitcode} before it was ready (see its output)")
        self._process, self._server, self._ident = process, server, ident
        self._state.value = _State.STARTED
        self._finalizer = weakref.finalize(self, _stop, process, server, control, self._state,
                                           self._shutdown_timeout)
        self._finalizer.atexit = False  # _shutdown_all runs first, before jobs are joined
        _managers.add(self)
        observe.notice("manager", self)

    def _page_view(self) -> ManagerView:
        """Its server job and state now, for the run's page (:func:`fiberlite.observe.view_of`)."""
        process = self._process
        launch = process.launch if process is not None else None
        return ManagerView(name=getattr(process, "name", "?"),
                           job=launch.job.spec.name if launch is not None else None,
                           state=self._state.value, alive=bool(process and process.is_alive()))

    def shutdown(self) -> None:
        """Stop the server job and wait for it; its proxies raise ``ConnectionError`` after."""
        if self._finalizer is not None:
            self._finalizer()

    def join(self, timeout: float | None = None) -> None:
        """Wait for the server job to end."""
        if self._process is not None:
            self._process.join(timeout)

    def connect(self) -> None:
        """Use the manager serving at this manager's address (started elsewhere, by
        ``start()`` or ``get_server().serve_forever()``), proving its ``authkey``."""
        if self._address is None:
            raise ValueError("connect() needs the manager's address: "
                             "BaseManager(address=(host, port), authkey=...)")
        # fails here on a wrong key or nothing listening
        self._ident, calls, serializer = _server_call(self._server_ref(), "ident")
        if serializer != self._serializer:
            raise ValueError(f"the manager at {url_of(self._address)} uses serializer "
                             f"{serializer!r}; make this one with serializer={serializer!r}")
        self._server = self._server_ref(calls)
        self._state.value = _State.STARTED

    def get_server(self) -> Server:
        """A server for this manager's types at its address, run in this process by
        ``serve_forever()``."""
        if self._address is None:
            raise ValueError("get_server() needs an address to listen at: "
                             "BaseManager(address=(host, port), authkey=...)")
        if self._state.value != _State.INITIAL:
            raise ProcessError("the manager has already been started or connected")
        return Server(self._registry, self._address, self._authkey, self._serializer)

    def _server_ref(self, calls: Any = None) -> ServerRef:
        """The server listening at this manager's address (``calls``: where callers' own
        connections reach it)."""
        url = url_of(self._address)
        with _sending:  # a manager at an address that was shut down may be back
            _dead.discard(url)
        return ServerRef(url, SERVER_OID, self._authkey, calls, self._serializer)

    @property
    def address(self) -> Any:
        """``(host, port)`` for a manager given an address (with the port it listens
        on once started), else its job's hub address once started."""
        if self._address is not None:
            return self._address
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
        kind, *rest = _call(server, "create", self._ident, (typeid,), args, kwds)
        if kind != "proxy":
            _raise_remote(*rest)
        typeid, oid, exposed, _, held = rest
        proxytype = self._registry[typeid][3]
        return proxytype(Token(typeid, server, oid, self._ident), manager=self, exposed=exposed,
                         incref=not held)

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


exit_order.at_exit("managers", _shutdown_all)


observe.provides_view(BaseManager, BaseManager._page_view)
