"""Contexts: the ``multiprocessing`` namespace bound to one backend.

``fiberlite.get_context("docker")`` returns a context whose ``Process``, ``Pool``,
``Manager`` and ``Ring`` start their jobs on Docker; the module-level names of
``fiberlite`` belong to the default context, which uses the configured backend.
Start methods of ``multiprocessing`` (``spawn``, ``fork``, ``forkserver``) are
accepted and all mean the same here: a fresh job that receives the pickled target.
"""
from __future__ import annotations

import importlib
import multiprocessing.context
import os
import sys
import threading
from typing import Any

from . import config, errors, process
from .backends import backend_target, known_backends
from .runtime.launch_options import LaunchOptions

START_METHODS = ("spawn", "fork", "forkserver")


STDLIB_EXECUTOR_MODULE = "concurrent.futures.process"



_late_lock = threading.RLock()


def _late(module: str, name: str) -> Any:
    """``name`` of fiberlite's ``module``, imported on first use: one thread at a time
    imports the API's modules (two threads importing ``synchronize`` for the first time
    at once would find each other's half-made modules)."""
    with _late_lock:
        return getattr(importlib.import_module(module, __package__), name)

class BaseContext(multiprocessing.context.BaseContext):
    """The factories of ``multiprocessing``, starting jobs on ``backend``.

    A ``multiprocessing.context.BaseContext``, so that libraries that ask for one (PyTorch's
    ``DataLoader(multiprocessing_context=...)``) take it; every factory is fiberlite's own.
    """

    ProcessError = errors.ProcessError
    BufferTooShort = errors.BufferTooShort
    TimeoutError = errors.TimeoutError
    AuthenticationError = errors.AuthenticationError

    def __init__(self, backend: str | None = None) -> None:
        self._backend = backend
        if backend is None:
            self.Process = process.Process
        else:
            self.Process = type("Process", (process.Process,), {
                "launch_options": LaunchOptions(backend=backend), "__module__": process.__name__,
                "__qualname__": "Process", "__doc__": process.Process.__doc__})

    def __repr__(self) -> str:
        return f"<fiberlite context backend={self.backend!r}>"

    @property
    def backend(self) -> str:
        return self._backend or config.get("backend")

    def _serve(self) -> None:
        """Start this process's hub where this context's jobs can reach it."""
        if self._backend is not None:
            from .runtime.hub import get_hub
            get_hub(self._backend)

    # -- processes -----------------------------------------------------------------------
    current_process = staticmethod(process.current_process)
    parent_process = staticmethod(process.parent_process)
    active_children = staticmethod(process.active_children)

    def cpu_count(self) -> int:
        """CPUs of this machine (as ``multiprocessing.cpu_count``)."""
        count = os.cpu_count()
        if count is None:
            raise NotImplementedError("cannot determine number of cpus")
        return count

    def freeze_support(self) -> None:
        """Accepted for compatibility; jobs never re-run the main script."""

    def set_executable(self, executable: str) -> None:
        """Accepted for compatibility; jobs run the Python of their image."""

    def set_forkserver_preload(self, module_names: list[str]) -> None:
        """Accepted for compatibility."""

    def allow_connection_pickling(self) -> None:
        """Connections always pickle; nothing to do."""

    def get_logger(self):
        from .util import get_logger
        return get_logger()

    def log_to_stderr(self, level: int | None = None):
        from .util import log_to_stderr
        return log_to_stderr(level)

    # -- start methods and contexts -----------------------------------------------------------
    def get_context(self, method: str | None = None) -> "BaseContext":
        """The context for a backend name; start method names give this context."""
        if method is None or method in START_METHODS:
            return self
        if backend_target(method) is None:
            raise ValueError(f"cannot find context for {method!r}: use a backend "
                             f"({', '.join(sorted(known_backends()))}) or a start method "
                             f"({', '.join(START_METHODS)})")
        return BaseContext(method)

    def get_start_method(self, allow_none: bool = False) -> str:
        if sys._getframe(1).f_globals.get("__name__") == STDLIB_EXECUTOR_MODULE:
            # its first call on its context; its queues would travel as file descriptors
            raise TypeError("concurrent.futures.ProcessPoolExecutor cannot start its workers "
                            "on a fiberlite context: use fiberlite.futures.ProcessPoolExecutor"
                            "(max_workers, mp_context=...)")
        return "spawn"

    def get_all_start_methods(self) -> list[str]:
        return ["spawn"]

    def set_start_method(self, method: str | None, force: bool = False) -> None:
        """Start methods are accepted (all behave as spawn); a backend name selects that backend."""
        if method is None or method in START_METHODS:
            return
        if backend_target(method) is None:
            raise ValueError(f"cannot find context for {method!r}")
        config.init(backend=method)

    # -- communication ----------------------------------------------------------------------
    def Pipe(self, duplex: bool = True):
        self._serve()
        Pipe = _late(".connection.pipe", "Pipe")
        return Pipe(duplex)

    def Queue(self, maxsize: int = 0):
        self._serve()
        Queue = _late(".queues", "Queue")
        return Queue(maxsize, ctx=self)

    def JoinableQueue(self, maxsize: int = 0):
        self._serve()
        JoinableQueue = _late(".queues", "JoinableQueue")
        return JoinableQueue(maxsize, ctx=self)

    def SimpleQueue(self):
        self._serve()
        SimpleQueue = _late(".queues", "SimpleQueue")
        return SimpleQueue(ctx=self)

    # -- synchronization and shared memory ------------------------------------------------------
    def Lock(self):
        self._serve()
        Lock = _late(".synchronize", "Lock")
        return Lock(ctx=self)

    def RLock(self):
        self._serve()
        RLock = _late(".synchronize", "RLock")
        return RLock(ctx=self)

    def Condition(self, lock: Any = None):
        self._serve()
        Condition = _late(".synchronize", "Condition")
        return Condition(lock, ctx=self)

    def Semaphore(self, value: int = 1):
        self._serve()
        Semaphore = _late(".synchronize", "Semaphore")
        return Semaphore(value, ctx=self)

    def BoundedSemaphore(self, value: int = 1):
        self._serve()
        BoundedSemaphore = _late(".synchronize", "BoundedSemaphore")
        return BoundedSemaphore(value, ctx=self)

    def Event(self):
        self._serve()
        Event = _late(".synchronize", "Event")
        return Event(ctx=self)

    def Barrier(self, parties: int, action: Any = None, timeout: float | None = None):
        self._serve()
        Barrier = _late(".synchronize", "Barrier")
        return Barrier(parties, action, timeout, ctx=self)

    def Value(self, typecode_or_type: Any, *args: Any, lock: Any = True):
        self._serve()
        Value = _late(".sharedctypes", "Value")
        return Value(typecode_or_type, *args, lock=lock, ctx=self)

    def Array(self, typecode_or_type: Any, size_or_initializer: Any, *, lock: Any = True):
        self._serve()
        Array = _late(".sharedctypes", "Array")
        return Array(typecode_or_type, size_or_initializer, lock=lock, ctx=self)

    def RawValue(self, typecode_or_type: Any, *args: Any):
        RawValue = _late(".sharedctypes", "RawValue")
        return RawValue(typecode_or_type, *args)

    def RawArray(self, typecode_or_type: Any, size_or_initializer: Any):
        RawArray = _late(".sharedctypes", "RawArray")
        return RawArray(typecode_or_type, size_or_initializer)

    # -- jobs in numbers --------------------------------------------------------------------
    def Pool(self, processes: int | None = None, initializer: Any = None, initargs: tuple = (),
             maxtasksperchild: int | None = None):
        Pool = _late(".pool.master.pool", "Pool")
        return Pool(processes, initializer, initargs, maxtasksperchild, context=self)

    def Manager(self, address: Any = None, authkey: bytes | None = None):
        SyncManager = _late(".managers.manager", "SyncManager")
        manager = SyncManager(address, authkey, ctx=self)
        manager.start()
        return manager

    def Ring(self, processes: int, target: Any, args: tuple = (), kwargs: dict | None = None,
             initializer: Any = None, **options: Any):
        Ring = _late(".ring.parent", "Ring")
        return Ring(processes, target, args, kwargs, initializer, context=self, **options)


default_context = BaseContext()
