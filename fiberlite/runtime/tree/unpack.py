"""Unpacking a received tree, after its digest was checked, without letting it write
anywhere but where it is unpacked.

Refused, before anything is written: absolute names, ``..`` anywhere in a name, a name
given twice, hard links, devices, pipes and anything but files, directories and
symlinks; a symlink whose target is absolute. Files and directories are written first
and symlinks last, so nothing is ever written through a symlink; then every symlink
must resolve inside the tree. A refused archive leaves nothing behind.
"""
from __future__ import annotations

import hashlib
import os
import posixpath
import shutil
import tarfile
from typing import BinaryIO, Iterable

from . import TreeError

READ_BLOCK = 1 << 20


def digest_of(chunks: Iterable[bytes]) -> str:
    sha = hashlib.sha256()
    for chunk in chunks:
        sha.update(chunk)
    return sha.hexdigest()


def file_chunks(fh: BinaryIO) -> Iterable[bytes]:
    while True:
        block = fh.read(READ_BLOCK)
        if not block:
            return
        yield block


def verify(path: str, digest: str) -> None:
    """TreeError unless the file at ``path`` has SHA-256 ``digest``."""
    with open(path, "rb") as fh:
        found = digest_of(file_chunks(fh))
    if found != digest:
        raise TreeError(f"the working directory received does not match its digest "
                        f"(sha256 {found[:16]}..., expected {digest[:16]}...)")


def _checked_name(member: tarfile.TarInfo) -> str:
    name = member.name
    if name.startswith("/") or "\\" in name or "\0" in name:
        raise TreeError(f"refused entry {name!r}: an absolute or malformed path")
    parts = [p for p in name.split("/") if p not in ("", ".")]
    if not parts or ".." in parts:
        raise TreeError(f"refused entry {name!r}: a path that leaves the tree")
    return "/".join(parts)


def _plan(tar: tarfile.TarFile) -> list[tuple[str, tarfile.TarInfo]]:
    """Every member with its checked name; TreeError for anything refused."""
    plan, seen = [], set()
    for member in tar:
        name = _checked_name(member)
        if name in seen:
            raise TreeError(f"refused entry {name!r}: given twice")
        seen.add(name)
        if member.issym():
            if member.linkname.startswith("/") or not member.linkname:
                raise TreeError(f"refused symlink {name!r} -> {member.linkname!r}: "
                                "an absolute target")
            resolved = posixpath.normpath(posixpath.join(posixpath.dirname(name), member.linkname))
            if resolved == ".." or resolved.startswith("../"):
                raise TreeError(f"refused symlink {name!r} -> {member.linkname!r}: "
                                "it leads out of the tree")
        elif not (member.isfile() or member.isdir()):
            raise TreeError(f"refused entry {name!r}: only files, directories and "
                            "symlinks travel")
        plan.append((name, member))
    return plan


def extract(archive: str, dest: str) -> None:
    """Unpack the gzipped tar at ``archive`` into the new, empty directory ``dest``."""
    try:
        _extract(archive, dest)
    except BaseException:
        shutil.rmtree(dest, ignore_errors=True)
        raise


def _extract(archive: str, dest: str) -> None:
    real_dest = os.path.realpath(dest)
    links: list[tuple[str, str]] = []
    try:
        with tarfile.open(archive, mode="r:gz") as tar:
            plan = _plan(tar)
            for name, member in plan:
                path = os.path.join(dest, name)
                if member.issym():
                    links.append((path, member.linkname))
                elif member.isdir():
                    os.makedirs(path, mode=0o755, exist_ok=True)
                    os.chmod(path, (member.mode & 0o777) | 0o700)
                else:
                    parent = os.path.dirname(path)
                    os.makedirs(parent, mode=0o755, exist_ok=True)
                    if os.path.realpath(parent) != os.path.join(real_dest, *name.split("/")[:-1]):
                        raise TreeError(f"refused entry {name!r}: its directory is not in the tree")
                    source = tar.extractfile(member)
                    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_NOFOLLOW", 0)
                    fd = os.open(path, flags, (member.mode & 0o777) | 0o600)
                    with os.fdopen(fd, "wb") as out:
                        shutil.copyfileobj(source, out, READ_BLOCK)
        for path, target in links:
            os.makedirs(os.path.dirname(path), exist_ok=True)
            os.symlink(target, path)
    except (tarfile.TarError, EOFError, OSError) as exc:
        if isinstance(exc, (FileExistsError, NotADirectoryError)):
            where = os.path.relpath(exc.filename2 or exc.filename or dest, dest)
            raise TreeError(f"refused entry {where!r}: a file, directory or link of that "
                            "name is there already") from None
        raise TreeError(f"cannot unpack the working directory: {exc}") from None
    for path, target in links:
        resolved = os.path.realpath(path)
        if not (resolved == real_dest or resolved.startswith(real_dest + os.sep)):
            raise TreeError(f"refused symlink {os.path.relpath(path, dest)!r} -> {target!r}: "
                            "it leads out of the tree")
