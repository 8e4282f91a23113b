"""fiberlite: ``multiprocessing`` where every process is a job on a backend
(local processes, Docker containers, Kubernetes pods).

``import fiberlite as mp`` and use it as ``multiprocessing``; see
``fiberlite.get_context(backend)`` and ``fiberlite.init(**settings)``.
"""
from __future__ import annotations

__version__ = "0.1.0"

import os as _os
from typing import Any as _Any

if "FIBERLITE_JOB" in _os.environ:  # a job starting: what it never uses is not imported
    from .runtime.deferred import defer as _defer
    _defer("asyncio")

from . import config as _config
from . import observe as _observe
from .context import BaseContext, default_context
from .errors import AuthenticationError, BufferTooShort, ProcessError, TimeoutError
from .meta import meta
from .process import Process



def init(**settings: _Any) -> dict[str, _Any]:
    """Set settings in code (highest precedence); returns the resolved settings.
    ``dashboard=...`` starts the run's page now (see docs/dashboard.md)."""
    resolved = _config.init(**settings)
    if settings.get("dashboard") is not None:
        from .dashboard import start_if_asked
        start_if_asked()
    return resolved


def _start_page_if_asked() -> None:
    """Before the first object the run creates is noticed: start the page if the
    settings ask for one (the environment or the config file)."""
    if _config.get("dashboard") is not None:
        from .dashboard import start_if_asked
        start_if_asked()


_observe.before_first(_start_page_if_asked)


_context_names = [
    "current_process", "parent_process", "active_children", "cpu_count", "freeze_support",
    "set_executable", "set_forkserver_preload", "allow_connection_pickling", "get_logger",
    "log_to_stderr", "get_context", "get_start_method", "get_all_start_methods",
    "set_start_method", "Pipe", "Queue", "JoinableQueue", "SimpleQueue", "Lock", "RLock",
    "Condition", "Semaphore", "BoundedSemaphore", "Event", "Barrier", "Value", "Array",
    "RawValue", "RawArray", "Pool", "Manager", "Ring",
]
globals().update((name, getattr(default_context, name)) for name in _context_names)

__all__ = ["Process", "meta", "init", "BaseContext", "ProcessError", "TimeoutError",
           "AuthenticationError", "BufferTooShort", *_context_names]
