"""``SharedMemory`` and ``ShareableList`` for jobs on one machine
(``multiprocessing.shared_memory``).

A block lives in this machine's ``/dev/shm`` and is reached by name: it pickles to a
job, and a job attaches to it there, only if that job runs on the same machine and
shares its memory (local jobs do; a container needs ``--ipc=host``; pods never do).
A job that cannot see the block gets a :class:`SharedMemoryUnreachable` error naming it
and saying so, not a bare ``FileNotFoundError``.

Unlike the standard library in a spawned child, a job that attaches to a block does
not unlink it when it exits: the block belongs to the process that created it, which
calls ``unlink()`` as usual.
"""
from __future__ import annotations

import socket
from multiprocessing import resource_tracker, shared_memory as _stdlib
from typing import Any, Iterable

__all__ = ["SharedMemory", "ShareableList", "SharedMemoryUnreachable"]


class SharedMemoryUnreachable(FileNotFoundError):
    """A job cannot see a shared memory block: it runs on another machine or in
    another IPC namespace than the block's creator."""


def _forget(name: str) -> None:
    """This process attached to ``name`` but does not own it: its exit must not
    unlink it (the standard library's tracker would)."""
    try:
        resource_tracker.unregister(name, "shared_memory")
    except Exception:
        pass


class SharedMemory(_stdlib.SharedMemory):
    """``multiprocessing.shared_memory.SharedMemory``, usable from the jobs of a run
    that share this machine's memory."""

    def __init__(self, name: str | None = None, create: bool = False, size: int = 0,
                 host: str | None = None) -> None:
        try:
            super().__init__(name, create, size)
        except FileNotFoundError:
            if create:
                raise
            where = f" made on {host}" if host else ""
            raise SharedMemoryUnreachable(
                f"shared memory block {name!r}{where} does not exist on {socket.gethostname()}: "
                "shared memory reaches only jobs on the machine that made it, sharing its "
                "memory (local jobs; a container run with --ipc=host), and only until it is "
                "unlinked. Use a Queue, Pipe or Array for jobs elsewhere.") from None
        self._host = host or socket.gethostname()
        if not create:
            _forget(self._name)

    def __reduce__(self):
        return (type(self), (self.name, False, self.size, self._host))


class ShareableList(_stdlib.ShareableList):
    """``multiprocessing.shared_memory.ShareableList`` on a :class:`SharedMemory`."""

    def __init__(self, sequence: Iterable[Any] | None = None, *, name: str | None = None) -> None:
        if sequence is None and name is not None:
            SharedMemory(name).close()  # a clear error if the block is out of reach
        super().__init__(sequence, name=name)
        if sequence is None and name is not None:
            _forget(self.shm._name)
