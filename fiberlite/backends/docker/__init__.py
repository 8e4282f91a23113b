"""The Docker backend: every job a container on a Docker engine.

- :mod:`.backend`: ``DockerBackend``, the seam's methods;
- :mod:`.api`: the engine connection and its errors;
- :mod:`.spec`: a ``JobSpec`` as container settings;
- :mod:`.watch`: one event stream for every container of the run.
"""
from .backend import ContainerJob, DockerBackend, clean, exit_code

__all__ = ["DockerBackend", "ContainerJob", "clean", "exit_code"]
