"""The local backend: every job a process of this machine (:mod:`.backend`); the
command line's view of local runs (:mod:`.runs`) and ``fiberlite run``'s master, a child
process of the command (:mod:`.master`); what the run's page measures of a job
(:mod:`.usage`). It has no settings of its own."""
from __future__ import annotations

from typing import TYPE_CHECKING

from ..base import lazy_exports

SETTINGS = ()
__all__ = ["LocalBackend"]
__getattr__ = lazy_exports(__name__, {"LocalBackend": ".backend"})

if TYPE_CHECKING:
    from .backend import LocalBackend
