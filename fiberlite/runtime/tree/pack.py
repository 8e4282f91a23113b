"""Packing a working directory: which files go (:mod:`.ignore`), the size limit, and
the archive, a gzipped tar that is the same bytes for the same files.

The archive holds regular files (with their executable bit), directories and symlinks
whose target stays inside the tree, each with owner 0 and time 0 in sorted order: its
SHA-256 names the tree, so an unchanged tree has an unchanged name. Symlinks leading
out of the tree, sockets, pipes and devices stay behind (the first are logged).
"""
from __future__ import annotations

import gzip
import hashlib
import io
import logging
import os
import stat
import tarfile
import zlib
from dataclasses import dataclass, field

from ...errors import ConfigError
from ...units import human_bytes
from .ignore import Rules, is_environment

log = logging.getLogger("fiberlite.tree")

COMPRESS_LEVEL = 3  # a fifth of level 9's time for nearly all of its gain on source code
SAMPLE = 64 << 10  # bytes read from each large file to guess whether the tree compresses
WORTH_COMPRESSING = 0.15  # the share of the size that compression must save, else it is not done
LARGEST_NAMED = 5  # files named by the error of a tree over the limit


@dataclass
class Entry:
    rel: str  # path inside the tree, "/"-separated
    path: str  # path on this machine
    kind: str  # "file", "dir" or "link"
    size: int = 0
    mode: int = 0o644
    target: str = ""  # a link's target, as written


@dataclass
class Scan:
    root: str
    entries: list[Entry] = field(default_factory=list)
    skipped_links: list[str] = field(default_factory=list)

    @property
    def size(self) -> int:
        return sum(e.size for e in self.entries)

    def largest(self, count: int = LARGEST_NAMED) -> list[Entry]:
        files = [e for e in self.entries if e.kind == "file"]
        return sorted(files, key=lambda e: (-e.size, e.rel))[:count]


@dataclass(frozen=True)
class PackedTree:
    """A packed working directory: ``digest`` is the SHA-256 (hex) of ``data``."""

    root: str
    digest: str
    data: bytes
    files: int
    size: int  # bytes of the files before compression


def _inside(path: str, root: str) -> bool:
    return path == root or path.startswith(root.rstrip("/") + "/")


def scan(root: str) -> Scan:
    """The entries of the tree at ``root`` that travel, in archive order."""
    root = os.path.abspath(root)
    real_root = os.path.realpath(root)
    found = Scan(root)
    pending: list[tuple[str, Rules]] = [("", Rules().enter("", root))]
    while pending:
        base, rules = pending.pop()
        directory = os.path.join(root, base) if base else root
        try:
            names = sorted(os.listdir(directory))
        except OSError as exc:
            raise ConfigError(f"cannot read {directory} of the working directory: "
                              f"{exc.strerror or exc}; exclude it in .fiberliteignore") from None
        subdirs = []
        for name in names:
            rel = f"{base}/{name}" if base else name
            path = os.path.join(directory, name)
            try:
                info = os.lstat(path)
            except OSError:
                continue  # removed meanwhile
            if stat.S_ISLNK(info.st_mode):
                entry = _link(rel, path, real_root, rules)
                if entry is None:
                    if not rules.ignored(rel, False):
                        found.skipped_links.append(rel)
                    continue
                found.entries.append(entry)
            elif stat.S_ISDIR(info.st_mode):
                if rules.ignored(rel, True) or is_environment(path):
                    continue
                found.entries.append(Entry(rel, path, "dir", mode=0o755))
                subdirs.append(rel)
            elif stat.S_ISREG(info.st_mode):
                if rules.ignored(rel, False):
                    continue
                mode = 0o755 if info.st_mode & 0o111 else 0o644
                found.entries.append(Entry(rel, path, "file", info.st_size, mode))
        for rel in reversed(subdirs):
            pending.append((rel, rules.enter(rel, os.path.join(root, rel))))
    found.entries.sort(key=lambda e: e.rel)
    if found.skipped_links:
        log.warning("the working directory's symlinks that lead out of it stay behind: %s",
                    ", ".join(found.skipped_links[:10]))
    return found


def _link(rel: str, path: str, real_root: str, rules: Rules) -> Entry | None:
    """A symlink that stays inside the tree (None for one that leads out or dangles)."""
    target = os.readlink(path)
    resolved = os.path.realpath(path)
    if os.path.isabs(target) or not _inside(resolved, real_root) or not os.path.exists(resolved):
        return None
    if rules.ignored(rel, os.path.isdir(resolved)):
        return None
    return Entry(rel, path, "link", target=target)


def too_large_message(found: Scan, limit: int) -> str:
    largest = ", ".join(f"{e.rel} {human_bytes(e.size)}" for e in found.largest())
    ignore = os.path.join(found.root, ".fiberliteignore")
    return (f"the working directory {found.root} holds {human_bytes(found.size)} to send "
            f"with the run, over the limit of {human_bytes(limit)} (setting "
            f"working_dir_limit); largest: {largest}; exclude them in {ignore} (gitignore "
            "syntax), bake them into the image, or put them on a volume (--volume); or run "
            "with --no-working-dir (setting working_dir=off)")


def check(found: Scan, limit: int) -> None:
    """ConfigError naming the largest files when the tree is over ``limit`` bytes."""
    if found.size > limit:
        raise ConfigError(too_large_message(found, limit))


def compresses(found: Scan) -> bool:
    """Whether compressing the tree saves enough to pay for its time: the start of each
    large file is compressed as a sample (data, models and archives often do not
    compress, and deflating them costs half a second per 20 MiB for nothing)."""
    total = found.size
    if not total:
        return True
    large = [e for e in found.entries if e.kind == "file" and e.size > SAMPLE]
    saved = (total - sum(e.size for e in large)) * 0.6  # source code: about a third is left
    for entry in large:
        try:
            with open(entry.path, "rb") as fh:
                sample = fh.read(SAMPLE)
        except OSError:
            continue
        if sample:
            kept = len(zlib.compress(sample, 1)) / len(sample)
            saved += entry.size * max(0.0, 1.0 - kept)
    return saved >= WORTH_COMPRESSING * total


def archive(found: Scan) -> bytes:
    """The tree as a gzipped tar, the same bytes for the same entries (stored without
    compression when it would not pay, see :func:`compresses`)."""
    raw = io.BytesIO()
    level = COMPRESS_LEVEL if compresses(found) else 0
    with gzip.GzipFile(fileobj=raw, mode="wb", compresslevel=level, mtime=0) as zipped:
        with tarfile.open(fileobj=zipped, mode="w|", format=tarfile.PAX_FORMAT) as tar:
            for entry in found.entries:
                info = tarfile.TarInfo(entry.rel)
                info.mtime, info.uid, info.gid, info.uname, info.gname = 0, 0, 0, "", ""
                info.mode = entry.mode
                if entry.kind == "dir":
                    info.type = tarfile.DIRTYPE
                    tar.addfile(info)
                elif entry.kind == "link":
                    info.type, info.linkname, info.mode = tarfile.SYMTYPE, entry.target, 0o777
                    tar.addfile(info)
                else:
                    _add_file(tar, info, entry)
    return raw.getvalue()


def _add_file(tar: tarfile.TarFile, info: tarfile.TarInfo, entry: Entry) -> None:
    try:
        with open(entry.path, "rb") as fh:
            size = os.fstat(fh.fileno()).st_size
            info.size = size
            tar.addfile(info, fh)
    except OSError as exc:
        raise ConfigError(f"cannot read {entry.path} of the working directory: "
                          f"{exc.strerror or exc}; exclude it in .fiberliteignore") from None


def pack(root: str, limit: int) -> PackedTree:
    """Scan, check against ``limit`` (ConfigError first, before anything is read) and
    archive the working directory at ``root``."""
    found = scan(root)
    check(found, limit)
    data = archive(found)
    return PackedTree(found.root, hashlib.sha256(data).hexdigest(), data,
                      sum(e.kind == "file" for e in found.entries), found.size)
