"""Whether a large block of shared memory fits, and its memory given to it at once.

A ``Value`` or ``Array`` of the stdlib is zero-filled as it is made, so an array larger
than the machine's memory fails (or never finishes) then. A segment of the arena is a
memfd, whose pages come only when first written: without this, an array too large
would be made at once and its process killed by SIGBUS later, at a write, with what it
held lost. So a large segment is refused when it is larger than the memory this process
may still take, and otherwise given its pages as it is made (``posix_fallocate``).
"""
from __future__ import annotations

import errno
import os

from ...units import human_bytes

_MEMINFO = "/proc/meminfo"
_CGROUP_LIMITS = (  # (limit, usage, stat, the stat's reclaimable file cache): cgroup v2, then v1
    ("/sys/fs/cgroup/memory.max", "/sys/fs/cgroup/memory.current",
     "/sys/fs/cgroup/memory.stat", "inactive_file"),
    ("/sys/fs/cgroup/memory/memory.limit_in_bytes", "/sys/fs/cgroup/memory/memory.usage_in_bytes",
     "/sys/fs/cgroup/memory/memory.stat", "total_inactive_file"),
)


def _read_int(path: str) -> int | None:
    try:
        with open(path) as f:
            return int(f.read().strip())
    except (OSError, ValueError):  # (absent, or "max": no limit)
        return None


def _stat_field(path: str, name: str) -> int:
    try:
        with open(path) as f:
            for line in f:
                key, _, value = line.partition(" ")
                if key == name:
                    return int(value)
    except (OSError, ValueError):
        pass
    return 0


def _meminfo_available() -> int | None:
    """MemAvailable plus SwapFree, in bytes (None where there is no /proc/meminfo)."""
    try:
        with open(_MEMINFO) as f:
            fields = dict(line.split(":", 1) for line in f if ":" in line)
        return sum(int(fields[name].split()[0]) * 1024 for name in ("MemAvailable", "SwapFree")
                   if name in fields) or None
    except (OSError, ValueError):
        return None


def available() -> int | None:
    """Bytes of memory this process may still take: the machine's, within its control
    group's limit (a container's: the limit less what the group uses, but for the file
    cache it would give back first, as ``docker stats`` counts it); None where it cannot
    be told."""
    free = _meminfo_available()
    for limit_path, usage_path, stat_path, cache in _CGROUP_LIMITS:
        limit, usage = _read_int(limit_path), _read_int(usage_path)
        if limit is not None and usage is not None and limit < (1 << 60):
            usage -= _stat_field(stat_path, cache)  # (file cache the kernel takes back first)
            left = max(0, limit - usage)
            free = left if free is None else min(free, left)
            break
    return free


def too_large(size: int, free: int | None) -> MemoryError:
    about = f"about {human_bytes(free)} is available" if free is not None else "it is not available"
    return MemoryError(
        f"cannot allocate {human_bytes(size)} of shared memory for a Value or Array: {about} "
        "to this process. Make it smaller, or keep such data in a file (numpy.memmap) and "
        "share the file's name")


def check_room(size: int) -> None:
    """Refuse a segment of ``size`` bytes larger than the memory left (MemoryError)."""
    free = available()
    if free is not None and size > free:
        raise too_large(size, free)


def commit(fd: int, size: int) -> None:
    """Give the memfd ``fd`` its ``size`` bytes of memory now (MemoryError if it cannot)."""
    try:
        os.posix_fallocate(fd, 0, size)
    except OSError as exc:
        if exc.errno in (errno.EOPNOTSUPP, errno.ENOSYS, errno.EINVAL):
            return  # (a kernel that cannot: its pages come as they are written)
        raise too_large(size, available()) from exc
