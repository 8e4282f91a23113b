"""The local backend: every job a process of this machine (:mod:`.backend`); the
command line's view of local runs (:mod:`.runs`)."""
from .backend import LocalBackend

__all__ = ["LocalBackend"]
