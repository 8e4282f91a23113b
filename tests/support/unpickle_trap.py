"""A pickle whose loading leaves a trace: proof that something was unpickled."""
from __future__ import annotations


class Trace:
    """Unpickling this creates a marker file at ``path``."""

    def __init__(self, path):
        self.path = path

    def __reduce__(self):
        return (open, (self.path, "w"))
