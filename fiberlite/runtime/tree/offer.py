"""The creator's side: which directory travels with a job, packed once per process and
served to the jobs by the hub.

A job gets an *offer* in its preparation (:func:`offer_for`) when the working
directory is on (setting ``working_dir``) and its backend does not show it this
process's files (``Backend.shares_working_dir``). A process that runs in a tree it
received offers that tree's archive as it came; any other packs its working directory
the first time a job needs it (the limit is checked then, before any job is created)
and keeps the archive for every later job: the tree a run started with is what its
jobs get.

The offer names the tree's digest, size and root (the creator's path, so that the job
can move the creator's ``sys.path`` and working directory into its copy) and the id of
the :class:`TreeServant` that reads it out, a chunk per call, to proven peers only
(the hub's connections are authenticated).
"""
from __future__ import annotations

import logging
import os
import threading
from typing import Any

from ... import config
from ...backends.base import Backend
from ..hub import Servant, get_hub
from .receive import installed

log = logging.getLogger("fiberlite.tree")

CHUNK = 4 << 20  # bytes a job asks for per call


class TreeServant(Servant):
    """Reads out one tree's archive: ``read(offset)`` returns up to :data:`CHUNK` bytes."""

    def __init__(self, data: bytes | None = None, path: str | None = None) -> None:
        self._data = memoryview(data) if data is not None else None
        self._path = path

    def op_read(self, request: Any, offset: int) -> None:
        if not isinstance(offset, int) or offset < 0:
            request.fail(ValueError(f"bad offset {offset!r}"))
            return
        if self._data is not None:
            request.reply(bytes(self._data[offset:offset + CHUNK]))
            return
        fd = os.open(self._path, os.O_RDONLY)
        try:
            request.reply(os.pread(fd, CHUNK, offset))
        finally:
            os.close(fd)


def chosen_dir() -> str | None:
    """The working directory that travels (setting ``working_dir``), None when off."""
    value = config.get("working_dir")
    if value is False:
        return None
    return os.path.abspath(os.path.expanduser(value)) if value else os.getcwd()


_lock = threading.Lock()
_offers: dict[tuple[str, str], dict] = {}


def offer_for(backend: Backend, backend_name: str) -> dict | None:
    """The tree offer for a new job of ``backend``, or None when the job needs none."""
    root = chosen_dir()
    if root is None or backend.shares_working_dir():
        return None
    hub = get_hub(backend_name)
    with _lock:
        offer = _offers.get((root, hub.address))
        if offer is None:
            offer = _offers[(root, hub.address)] = _make_offer(root, hub)
    return offer


def _make_offer(root: str, hub: Any) -> dict:
    here = installed()
    if here is not None and os.path.realpath(root) == os.path.realpath(here.root):
        servant = TreeServant(path=here.archive)
        digest, size = here.digest, os.path.getsize(here.archive)
    else:
        from .pack import pack  # tarfile, gzip and the ignore rules: only where a tree is packed
        tree = pack(root, config.get("working_dir_limit"))
        log.info("jobs get a copy of %s: %d files, %d bytes packed", root, tree.files, len(tree.data))
        servant = TreeServant(data=tree.data)
        digest, size = tree.digest, len(tree.data)
    ref = hub.register(servant)
    return {"digest": digest, "size": size, "root": root, "oid": ref.oid}
