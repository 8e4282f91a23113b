"""Modules that a job imports only once it uses them.

pynng imports ``asyncio`` for an async API that fiberlite does not use; ``asyncio`` and
what it pulls in (ssl, subprocess, ...) would cost every job 25-45 ms of its start.
In a job, ``asyncio`` is first a stand-in: ``import asyncio`` gives the stand-in, and
the first attribute read from it imports the real module, which then takes its place
in ``sys.modules`` and lends the stand-in its namespace, so either object works.
"""
from __future__ import annotations

import importlib
import sys
import threading
import types
from typing import Any

_lock = threading.RLock()


class DeferredModule(types.ModuleType):
    """Stands in ``sys.modules`` for a module until something is read from it."""

    def __getattr__(self, name: str) -> Any:   # only names not in this namespace yet
        return getattr(_load(self), name)


def _load(stand_in: DeferredModule) -> types.ModuleType:
    name = stand_in.__name__
    with _lock:
        if sys.modules.get(name) is stand_in:
            del sys.modules[name]
            try:
                real = importlib.import_module(name)
            except BaseException:
                sys.modules[name] = stand_in
                raise
            stand_in.__dict__.update(real.__dict__)
        return sys.modules.get(name) or importlib.import_module(name)


def defer(name: str) -> None:
    """Import ``name`` on first use from now on (nothing if it is imported already)."""
    with _lock:
        if name not in sys.modules:
            sys.modules[name] = DeferredModule(name)
