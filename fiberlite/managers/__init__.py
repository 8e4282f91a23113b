"""Managers: Python objects held by a server job and used from any job through proxies
(``multiprocessing.managers``).

``SyncManager().start()`` (or ``fiberlite.Manager()``) starts a job on the context's
backend. That job's hub serves a :class:`~fiberlite.managers.server.ManagerServer`,
which holds every object created through the manager by id and runs the methods that
proxies ask for. A proxy pickles to any job of the run and calls the server directly
from there, over the run's authenticated connections.

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

Without an address, the server is served by its job's hub with the run's key and is
reached through proxies, by jobs of the run. With ``address=(host, port)``, it listens
there with ``authkey`` (default: the run's key) and any process that holds the key can
``connect()`` to it, inside the run or not (:mod:`.remote`); ``get_server()`` serves it
from the calling process instead of a job.

The modules, from the server out:

- :mod:`.server`: what runs in the manager's job: ``ManagerServer`` and its threads;
- :mod:`.calls`: ``Token`` and calling a server from any job, shared by the two below;
- :mod:`.proxies`: ``BaseProxy``, ``AutoProxy`` and the proxy types of ``SyncManager``;
- :mod:`.remote`: serving a manager at an address with its own key;
- :mod:`.manager`: ``BaseManager`` and ``SyncManager``, which start the server job.

``SharedMemoryManager`` is the standard library's: its blocks (``SharedMemory``,
``ShareableList``) are memory of one machine, and so is its server, a process of this
machine that unlinks them when it shuts down; jobs of this machine use them
(:mod:`fiberlite.shared_memory`).
"""
from multiprocessing.managers import SharedMemoryManager, SharedMemoryServer  # noqa: F401

from ..errors import RemoteTraceback
from .calls import NotExposedError, RemoteError, Token
from .manager import Array, BaseManager, Namespace, SyncManager, Value
from .proxies import (AcquirerProxy, ArrayProxy, AutoProxy, BarrierProxy, BaseDictProxy,
                      BaseListProxy, BasePoolProxy, BaseProxy, ConditionProxy, DictProxy,
                      EventProxy, IteratorProxy, ListProxy, MakeProxyType, NamespaceProxy,
                      PoolProxy, RebuildProxy, ValueProxy)
from .remote import Server
from .server import public_methods

__all__ = ["BaseManager", "SyncManager", "BaseProxy", "Token", "Namespace", "Value", "Array",
           "public_methods", "RebuildProxy", "MakeProxyType", "AutoProxy", "IteratorProxy",
           "AcquirerProxy", "ConditionProxy", "EventProxy", "BarrierProxy", "NamespaceProxy",
           "ValueProxy", "ArrayProxy", "BaseListProxy", "ListProxy", "BaseDictProxy",
           "DictProxy", "BasePoolProxy", "PoolProxy", "RemoteTraceback", "RemoteError",
           "NotExposedError", "Server", "SharedMemoryManager", "SharedMemoryServer"]
