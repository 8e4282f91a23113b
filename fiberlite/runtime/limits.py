"""Operating-system limits a run meets head on: open files.

Every worker costs its master and its host a few descriptors. Like Ray, a process of
the run raises its soft open-file limit to the hard one when it starts serving; what
still does not fit is said in one clear error, with how to raise the limit.
"""
from __future__ import annotations

import os

try:
    import resource
except ImportError:  # not a POSIX system
    resource = None  # type: ignore[assignment]

RESERVED = 64  # descriptors kept for everything but workers (sockets, logs, pipes)


def raise_open_file_limit() -> tuple[int, int]:
    """Raise the soft ``RLIMIT_NOFILE`` to the hard one; return ``(soft, hard)`` after."""
    if resource is None:
        return (-1, -1)
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard != resource.RLIM_INFINITY and soft < hard:
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
            soft = hard
        except (ValueError, OSError):
            pass
    return soft, hard


def open_file_limit() -> int:
    """The soft open-file limit (a large number where there is none)."""
    if resource is None:
        return 1 << 20
    soft, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
    return (1 << 20) if soft == resource.RLIM_INFINITY else soft


def open_files() -> int:
    """Descriptors this process holds now."""
    try:
        return len(os.listdir("/proc/self/fd"))
    except OSError:
        return 0


def check_room(needed: int, what: str) -> None:
    """Raise ``OSError`` naming ``what`` if ``needed`` more descriptors do not fit."""
    limit = open_file_limit()
    used = open_files()
    if used + needed > limit:
        raise OSError(
            24, f"{what} needs about {needed} more open files, and this process holds {used} "
                f"of its limit of {limit}: raise the limit (e.g. `ulimit -n {_advice(used + needed)}` "
                f"in the shell that starts it, or LimitNOFILE= for a service), or start fewer "
                f"workers per job")


def _advice(total: int) -> int:
    advice = 1024
    while advice < total * 2:
        advice *= 2
    return advice
