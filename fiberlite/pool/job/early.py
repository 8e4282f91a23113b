"""A pool host's fork template, forked by the host's job as it starts.

A host needs its template (:mod:`.template`) before it can fork any worker. Started by the
host once it runs, the template is a second interpreter that imports fiberlite after the
host did: two starts one after the other, the second on every worker's path. A job that
the master marked as a pool host forks its template in its bootstrap instead, before it
dials its parent: it has one thread and no nng socket then, so the fork is safe, and the
template inherits what the job imported and waits for the host's preparation while the
host connects to its master.
"""
from __future__ import annotations

import os
import socket
import sys
import threading
import traceback

from ...wire import unix
from . import template, worker  # noqa: F401  (imported once, before the fork, for both)


class ForkedTemplate:
    """The host's handle on a template it forked (what it needs of a ``Popen``)."""

    def __init__(self, pid: int) -> None:
        self.pid = pid

    def wait(self) -> int | None:
        """Wait until the template ends; its exit code (None if it was reaped already)."""
        try:
            _, status = os.waitpid(self.pid, 0)
        except ChildProcessError:
            return None
        return os.waitstatus_to_exitcode(status)


_forked: tuple[socket.socket, ForkedTemplate] | None = None


def fork_template() -> None:
    """Fork the template now, if this process can (one thread); the host takes it with
    :func:`take`, or starts one of its own when there is none."""
    global _forked
    if threading.active_count() != 1:
        return
    ours, theirs = unix.pair(unix.SEQPACKET)
    for stream in (sys.stdout, sys.stderr):
        stream.flush()
    try:
        pid = os.fork()
    except OSError:
        ours.close()
        theirs.close()
        return
    if pid == 0:
        ours.close()
        _be_template(theirs)
    theirs.close()
    _forked = (ours, ForkedTemplate(pid))


def _be_template(control: socket.socket) -> None:
    code = 1
    try:
        template.run(control)
        code = 0
    except BaseException:
        traceback.print_exc()
    finally:
        sys.stderr.flush()
        os._exit(code)


def take() -> tuple[socket.socket, ForkedTemplate] | None:
    """The template this job forked as it started (the host's socket to it, its handle),
    once; None if it forked none."""
    global _forked
    forked, _forked = _forked, None
    return forked
