"""A master job's entry into the tree its backend delivered:
``python -m fiberlite.runtime.tree.enter [--cwd DIR] SCRIPT [ARGS...]``.

``fiberlite run`` packs the working directory and hands it to the backend with the
master job (``JobSpec.tree``); the backend puts the archive's parts in the directory
named by ``FIBERLITE_TREE_PARTS`` (``part-0000``, ``part-0001``, ... in order: a
Kubernetes ConfigMap volume, a Docker archive) and its digest in
``FIBERLITE_TREE_DIGEST``. This checks the parts against the digest, unpacks them
(:mod:`.receive`), enters ``DIR`` inside the tree and replaces itself with
``python SCRIPT ARGS...``, whose own jobs then get the same tree from it.
"""
from __future__ import annotations

import os
import sys

from ...backends.base import TREE_DIGEST_ENV, TREE_PARTS_ENV


def _fail(message: str) -> "None":
    sys.stderr.write(f"fiberlite: {message}\n")
    sys.stderr.flush()
    os._exit(1)


def parts_of(directory: str) -> list[str]:
    names = sorted(n for n in os.listdir(directory) if n.startswith("part-"))
    return [os.path.join(directory, n) for n in names]


def main(argv: list[str]) -> None:
    cwd = "."
    if argv[:1] == ["--cwd"] and len(argv) > 1:
        cwd, argv = argv[1], argv[2:]
    if not argv:
        _fail("usage: python -m fiberlite.runtime.tree.enter [--cwd DIR] SCRIPT [ARGS...]")
    parts_dir, digest = os.environ.pop(TREE_PARTS_ENV, ""), os.environ.pop(TREE_DIGEST_ENV, "")
    if not parts_dir or not digest:
        _fail(f"{TREE_PARTS_ENV} and {TREE_DIGEST_ENV} name the working directory to enter; "
              "this command is started by `fiberlite run`, not by hand")
    import tempfile
    from . import TreeError
    from .claim import Claim
    from .receive import install
    try:
        parts = parts_of(parts_dir)
        if not parts:
            raise TreeError(f"no part of the working directory in {parts_dir}")
        claim = Claim.take(digest)  # held by the script this becomes
        try:
            fd, archive = tempfile.mkstemp(prefix=f"fiberlite-tree-{digest[:16]}.",
                                           suffix=".tar.gz")
            claim.own(archive)
            with os.fdopen(fd, "wb") as out:
                for part in parts:
                    with open(part, "rb") as fh:
                        out.write(fh.read())
            tree = install(archive, digest, claim)
        except BaseException:
            claim.release()
            raise
    except (OSError, TreeError) as exc:
        _fail(f"cannot enter the working directory of the run: {exc}")
    where = os.path.normpath(os.path.join(tree.root, cwd))
    if not (where == tree.root or where.startswith(tree.root + os.sep)):
        _fail(f"--cwd {cwd} leaves the working directory")
    os.chdir(where)
    os.execv(sys.executable, [sys.executable, *argv])


if __name__ == "__main__":
    main(sys.argv[1:])
