"""Which trees unpacked on this machine are still in use.

A job that unpacks a tree first *claims* it: a file ``fiberlite-tree-*.claim`` in the
temporary directory, locked (``flock``) for as long as the job lives, which lists the
paths the job made (the archive, the tree). The lock goes with the last process that
holds it open, however it ends (a kill included), and is kept across the ``exec`` of a
master's entry and by the workers a pool host forks. A claim that nobody holds is a
job that ended without removing its tree: :func:`sweep` (before each unpacking, and by
``fiberlite clean``) removes what it lists. In a container or pod this hardly matters
(the files go with it); on a machine that runs many jobs it does.
"""
from __future__ import annotations

import fcntl
import json
import os
import shutil
import tempfile

PREFIX = "fiberlite-tree-"
SUFFIX = ".claim"


class Claim:
    """A locked claim on the paths one job makes for a tree."""

    def __init__(self, fd: int, path: str) -> None:
        self.fd = fd
        self.path = path
        self.paths: list[str] = []

    @classmethod
    def take(cls, digest: str, directory: str | None = None) -> "Claim":
        """A new claim, locked before any sweeper can see it (made under a temporary name,
        locked, then renamed)."""
        directory = directory or tempfile.gettempdir()
        fd, temporary = tempfile.mkstemp(prefix=".claiming-", dir=directory)
        fcntl.flock(fd, fcntl.LOCK_EX)
        os.set_inheritable(fd, True)  # held on across the exec of a master's entry
        path = os.path.join(directory, f"{PREFIX}{digest[:16]}-{os.path.basename(temporary)[10:]}{SUFFIX}")
        os.rename(temporary, path)
        return cls(fd, path)

    def own(self, *paths: str) -> None:
        """Record ``paths`` as this job's (removed by :meth:`release` or a later sweep)."""
        self.paths.extend(p for p in paths if p not in self.paths)
        data = json.dumps(self.paths).encode()
        os.ftruncate(self.fd, 0)
        os.pwrite(self.fd, data, 0)

    def disown(self, path: str) -> None:
        if path in self.paths:
            self.paths.remove(path)
            self.own()

    def release(self) -> None:
        """Remove the paths, then the claim."""
        _remove(self.paths)
        _unlink(self.path)
        os.close(self.fd)


def sweep(directory: str | None = None) -> int:
    """Remove the trees of claims nobody holds any more; how many were removed."""
    directory = directory or tempfile.gettempdir()
    removed = 0
    try:
        names = os.listdir(directory)
    except OSError:
        return 0
    for name in names:
        if not (name.startswith(PREFIX) and name.endswith(SUFFIX)):
            continue
        path = os.path.join(directory, name)
        try:
            fd = os.open(path, os.O_RDWR)
        except OSError:
            continue
        try:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except OSError:
                continue  # its job is alive
            try:
                paths = json.loads(os.pread(fd, 1 << 20, 0) or b"[]")
            except ValueError:
                paths = []
            _remove([p for p in paths if isinstance(p, str) and
                     os.path.basename(p).startswith(PREFIX)])
            _unlink(path)
            removed += 1
        finally:
            os.close(fd)
    return removed


def _remove(paths: list[str]) -> None:
    for path in paths:
        if os.path.isdir(path) and not os.path.islink(path):
            shutil.rmtree(path, ignore_errors=True)
        else:
            _unlink(path)


def _unlink(path: str) -> None:
    try:
        os.unlink(path)
    except OSError:
        pass
