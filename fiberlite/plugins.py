"""Backends by name, and the settings their packages declare.

A backend is built in, or registered by another package under the ``fiberlite.backends``
entry-point group as ``name = "package.module:BackendClass"``. Reading the entry points
is slow (every installed distribution is scanned), so it is done only when a name is not
built in.

A backend declares its own settings as ``SETTINGS``, a sequence of
:class:`fiberlite.config.Setting`, in the module its entry point names (for the built-in
ones, the subpackage's ``__init__``, which stays light: the backend class and what it
needs are imported only when first asked for). :mod:`fiberlite.config` collects them
through :func:`declared_settings`, importing those modules by name when settings are
first needed. This module imports nothing of fiberlite, so that the lowest modules can
use it.
"""
from __future__ import annotations

import importlib
import logging
from typing import Any

BUILTIN = {
    "local": "fiberlite.backends.local:LocalBackend",
    "docker": "fiberlite.backends.docker:DockerBackend",
    "kubernetes": "fiberlite.backends.kubernetes:KubernetesBackend",
    "slurm": "fiberlite.backends.slurm:SlurmBackend",
}
GROUP = "fiberlite.backends"

log = logging.getLogger("fiberlite")


def _entry_points() -> dict[str, str]:
    from importlib import metadata  # only when a name is not built in: it is slow to import
    try:
        eps = metadata.entry_points(group=GROUP)
    except Exception:
        return {}
    return {ep.name: ep.value for ep in eps}


def known_backends() -> dict[str, str]:
    """Backend names and the ``module:Class`` that implements each: the built-in ones
    first (an entry point of the same name does not replace one)."""
    found = dict(BUILTIN)
    for name, target in _entry_points().items():
        found.setdefault(name, target)
    return found


def backend_target(name: str) -> str | None:
    """The ``module:Class`` of backend ``name`` (entry points read only when not built in)."""
    return BUILTIN.get(name) or _entry_points().get(name)


def declared_settings(plugins: bool = False) -> list[tuple[str, tuple[Any, ...]]]:
    """``(backend name, the SETTINGS its module declares)`` for every built-in backend
    and, with ``plugins``, every backend of the entry points. A plugin whose module
    cannot be imported declares nothing (it is named in the log; using it as a backend
    reports the error)."""
    targets = known_backends() if plugins else dict(BUILTIN)
    found = []
    for name, target in targets.items():
        module_name = target.partition(":")[0]
        try:
            module = importlib.import_module(module_name)
        except Exception as exc:
            if name in BUILTIN:
                raise
            log.warning("the settings of backend %r cannot be read: importing %s failed: %s",
                        name, module_name, exc)
            continue
        found.append((name, tuple(getattr(module, "SETTINGS", ()))))
    return found
