"""Backends by name: the built-in ones and any registered under the
``fiberlite.backends`` entry-point group by another package."""
from __future__ import annotations

import importlib
import threading

from ..errors import ConfigError
from .base import Backend, Job, JobSpec, JobState, TreeArchive

__all__ = ["Backend", "Job", "JobSpec", "JobState", "TreeArchive", "get_backend", "known_backends",
           "close_all"]

_BUILTIN = {
    "local": "fiberlite.backends.local:LocalBackend",
    "docker": "fiberlite.backends.docker:DockerBackend",
    "kubernetes": "fiberlite.backends.kubernetes:KubernetesBackend",
    "slurm": "fiberlite.backends.slurm:SlurmBackend",
}
_instances: dict[str, Backend] = {}
_lock = threading.Lock()


def _entry_points() -> dict[str, str]:
    from importlib import metadata  # only when a name is not built in: it is slow to import
    try:
        eps = metadata.entry_points(group="fiberlite.backends")
    except Exception:
        return {}
    return {ep.name: ep.value for ep in eps}


def known_backends() -> dict[str, str]:
    """Backend names and the ``module:Class`` that implements each."""
    found = _entry_points()
    found.update(_BUILTIN)
    return found


def backend_target(name: str) -> str | None:
    """The ``module:Class`` of backend ``name`` (entry points read only when not built in)."""
    return _BUILTIN.get(name) or _entry_points().get(name)


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
