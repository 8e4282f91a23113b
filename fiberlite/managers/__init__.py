"""Managers: Python objects held by a server job and used from any job through proxies
(``multiprocessing.managers``). See :mod:`.managers` for the protocol."""
from .managers import (AcquirerProxy, Array, ArrayProxy, AutoProxy, BarrierProxy,
                       BaseDictProxy, BaseListProxy, BaseManager, BasePoolProxy, BaseProxy,
                       ConditionProxy, DictProxy, EventProxy, IteratorProxy, ListProxy,
                       MakeProxyType, Namespace, NamespaceProxy, PoolProxy, RebuildProxy,
                       RemoteTraceback, SyncManager, Token, Value, ValueProxy, public_methods)

__all__ = ["BaseManager", "SyncManager", "BaseProxy", "Token", "Namespace", "Value", "Array",
           "public_methods", "RebuildProxy", "MakeProxyType", "AutoProxy", "IteratorProxy",
           "AcquirerProxy", "ConditionProxy", "EventProxy", "BarrierProxy", "NamespaceProxy",
           "ValueProxy", "ArrayProxy", "BaseListProxy", "ListProxy", "BaseDictProxy",
           "DictProxy", "BasePoolProxy", "PoolProxy", "RemoteTraceback"]
