"""The Docker backend: every job a container on a Docker engine.

- :mod:`.backend`: ``DockerBackend``, the seam's methods;
- :mod:`.api`: the engine connection and its errors;
- :mod:`.spec`: a ``JobSpec`` as container settings;
- :mod:`.network`: the host's address on a network, what a container uses;
- :mod:`.watch`: one event stream for every container of the run.

Its settings are declared here (``SETTINGS``); the rest is imported when first used.
"""
from __future__ import annotations

from typing import TYPE_CHECKING

from ...config import Setting, flag, text
from ..base import lazy_exports

SETTINGS = (
    Setting("docker_network", "host", text, "Docker network for job containers: host or a network name"),
    Setting("mount_working_dir", True, flag,
            "docker: bind-mount working_dir into job containers when the engine runs on this "
            "machine (false: send a copy, as to a remote engine)"),
)

__all__ = ["DockerBackend", "ContainerJob", "clean", "exit_code"]
__getattr__ = lazy_exports(__name__, {name: ".backend" for name in __all__})

if TYPE_CHECKING:
    from .backend import ContainerJob, DockerBackend, clean, exit_code
