"""The job's side: fetch the tree its creator offered, check it, unpack it, and move
the creator's ``sys.path`` and working directory into it.

Runs in the job's bootstrap after the key was proven and before anything of the
user's is unpickled (the process's target may live in the tree). The archive arrives
in chunks over the authenticated connection into a private temporary file, its
SHA-256 is compared with the offer's, and only then is it unpacked
(:mod:`.unpack`) into ``$TMPDIR/fiberlite-tree-<digest>``: the same path in every
container or pod of the run, so that paths a master computed inside its tree hold in
its jobs. Where that path is taken (jobs of one machine), a path of its own. The
archive stays next to the tree, for the job's own jobs, and both go when the job ends.
"""
from __future__ import annotations

import json
import os
import tempfile
from dataclasses import dataclass
from typing import Callable

from ...backends.base import TREE_ENV
from . import TreeError
from .claim import Claim, sweep

__all__ = ["TreeError", "Installed", "installed", "receive", "install", "relocate", "discard"]


@dataclass(frozen=True)
class Installed:
    """The tree this process runs in: where it is, its digest, its archive here."""

    root: str
    digest: str
    archive: str

    def to_env(self) -> str:
        return json.dumps({"root": self.root, "digest": self.digest, "archive": self.archive})


def installed() -> Installed | None:
    """The tree this process received, if any (:data:`TREE_ENV`, set where it was unpacked)."""
    text = os.environ.get(TREE_ENV)
    if not text:
        return None
    try:
        found = Installed(**json.loads(text))
    except (ValueError, TypeError):
        return None
    return found if os.path.isdir(found.root) and os.path.isfile(found.archive) else None


_mine: list[Claim] = []  # what this process unpacked: removed by discard()


def tree_dir(digest: str) -> str:
    return os.path.join(tempfile.gettempdir(), f"fiberlite-tree-{digest[:16]}")


def receive(offer: dict, read: Callable[[int], bytes]) -> Installed:
    """Fetch the offered tree with ``read(offset) -> bytes``, check and install it."""
    claim = Claim.take(offer["digest"])
    try:
        fd, archive = tempfile.mkstemp(prefix=f"fiberlite-tree-{offer['digest'][:16]}.",
                                       suffix=".tar.gz")
        claim.own(archive)
        with os.fdopen(fd, "wb") as out:
            offset = 0
            while offset < offer["size"]:
                chunk = read(offset)
                if not chunk:
                    raise TreeError(f"the working directory ended after {offset} of "
                                    f"{offer['size']} bytes")
                out.write(chunk)
                offset += len(chunk)
        return install(archive, offer["digest"], claim)
    except BaseException:
        claim.release()
        raise


def install(archive: str, digest: str, claim: Claim) -> Installed:
    """Check the archive at ``archive`` against ``digest``, unpack it and take it over
    (it moves next to the tree); what it makes is ``claim``'s. Sets :data:`TREE_ENV` for
    this process and its own."""
    from .unpack import extract, verify
    sweep()  # trees of jobs of this machine that died
    verify(archive, digest)
    target = tree_dir(digest)
    staging = tempfile.mkdtemp(prefix=os.path.basename(target) + ".")
    claim.own(staging)
    extract(archive, staging)
    root = _place(staging, target)
    kept = root + ".tar.gz"
    claim.own(root, kept)
    os.replace(archive, kept)
    claim.disown(archive)
    if root != staging:
        claim.disown(staging)
    tree = Installed(root, digest, kept)
    _mine.append(claim)
    os.environ[TREE_ENV] = tree.to_env()
    return tree


def _place(staging: str, target: str) -> str:
    """Move the unpacked tree to ``target`` if that is free (or an empty directory a
    container engine made for a working directory), else keep its own path."""
    try:
        os.rmdir(target)  # only when empty
    except OSError:
        pass
    try:
        os.rename(staging, target)
        return target
    except OSError:
        return staging


def relocate(prep: dict, offer: dict, tree: Installed) -> None:
    """Point the preparation's paths at the tree: the creator's working directory and
    ``sys.path`` entries inside its tree become the same places in the copy."""
    old = offer["root"].rstrip("/") or "/"

    def move(path: str) -> str:
        if path == old or path.startswith(old + "/"):
            return tree.root + path[len(old):]
        return path

    prep["sys_path"] = [move(p) if p else p for p in prep["sys_path"]]
    cwd = move(prep["cwd"])
    prep["cwd"] = cwd if cwd.startswith(tree.root) else tree.root
    settings = prep.get("settings")
    if settings is not None and settings.get("working_dir") is not False:
        settings["working_dir"] = tree.root  # what this job's own jobs get: the same tree


def fetch_for_job(prep: dict, address: str) -> None:
    """In a job's bootstrap: receive the tree ``prep`` offers from the hub at ``address``."""
    offer = prep.get("tree")
    if not offer:
        return
    from ..hub import ObjectRef
    ref = ObjectRef(address, offer["oid"])
    try:
        tree = receive(offer, lambda offset: ref.call("read", offset))
    except OSError as exc:
        raise TreeError(f"cannot write it to {tempfile.gettempdir()}: {exc.strerror or exc}; give "
                        "the job a writable temporary directory (TMPDIR; on Kubernetes an "
                        "emptyDir volume at /tmp)") from None
    relocate(prep, offer, tree)


def discard() -> None:
    """Remove the trees this process unpacked (at its end)."""
    while _mine:
        _mine.pop().release()
