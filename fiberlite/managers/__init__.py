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

Differences from ``multiprocessing.managers``: the server listens on its job's hub
address with the run's key, so ``address`` must be None, ``authkey`` is ignored, and
``connect()`` / ``get_server()`` are not supported: a manager is reached only through
proxies, by jobs of the run that started it.

The modules, from the server out:

- :mod:`.server`: what runs in the manager's job: ``ManagerServer`` and its threads;
- :mod:`.calls`: ``Token`` and calling a server from any job, shared by the two below;
- :mod:`.proxies`: ``BaseProxy``, ``AutoProxy`` and the proxy types of ``SyncManager``;
- :mod:`.manager`: ``BaseManager`` and ``SyncManager``, which start the server job.
"""
from ..errors import RemoteTraceback
from .calls import Token
from .manager import Array, BaseManager, Namespace, SyncManager, Value
from .proxies import (AcquirerProxy, ArrayProxy, AutoProxy, BarrierProxy, BaseDictProxy,
                      BaseListProxy, BasePoolProxy, BaseProxy, ConditionProxy, DictProxy,
                      EventProxy, IteratorProxy, ListProxy, MakeProxyType, NamespaceProxy,
                      PoolProxy, RebuildProxy, ValueProxy)
from .server import public_methods

__all__ = ["BaseManager", "SyncManager", "BaseProxy", "Token", "Namespace", "Value", "Array",
           "public_methods", "RebuildProxy", "MakeProxyType", "AutoProxy", "IteratorProxy",
           "AcquirerProxy", "ConditionProxy", "EventProxy", "BarrierProxy", "NamespaceProxy",
           "ValueProxy", "ArrayProxy", "BaseListProxy", "ListProxy", "BaseDictProxy",
           "DictProxy", "BasePoolProxy", "PoolProxy", "RemoteTraceback"]
