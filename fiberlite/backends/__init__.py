"""Backends by name: the built-in ones and any registered under the
``fiberlite.backends`` entry-point group by another package (the names: :mod:`fiberlite.plugins`)."""
from __future__ import annotations

import importlib
import threading

from ..errors import ConfigError
from ..plugins import backend_target, known_backends
from .base import Backend, Job, JobSpec, JobState, TreeArchive

__all__ = ["Backend", "Job", "JobSpec", "JobState", "TreeArchive", "get_backend", "known_backends",
           "close_all", "backend_target"]

_instances: dict[str, Backend] = {}
_lock = threading.Lock()


def get_backend(name: str) -> Backend:
    """The (shared) backend instance for ``name``."""
    backend = _instances.get(name)
    if backend is not None:
        return backend
    with _lock:
        if name not in _instances:
            target = backend_target(name)
            if target is None:
                raise ConfigError(f"unknown backend {name!r}; available: {', '.join(sorted(known_backends()))}")
            module_name, _, class_name = target.partition(":")
            cls = getattr(importlib.import_module(module_name), class_name)
            _instances[name] = cls()
        return _instances[name]


def close_all() -> None:
    """Close every backend this process has used (at exit, once its children are gone)."""
    with _lock:
        backends = list(_instances.values())
    for backend in backends:
        try:
            backend.close()
        except Exception:
            pass
