"""A Kubernetes API server double for testing through the official client.

See ``docs/kubernetes/double.md`` for what it proves and what it cannot.
"""

from .runner import ContainerStart, LocalRunner, LogBuffer, StartError
from .server import ApiServerDouble

__all__ = ["ApiServerDouble", "ContainerStart", "LocalRunner", "LogBuffer", "StartError"]
