"""``wait()``: wait until any of several connections (and other waitable objects) is
ready, like ``multiprocessing.connection.wait``.

A fiberlite ``Connection`` (:mod:`fiberlite.connection.pipe`) has no descriptor of its
own: ``wait()`` asks each pipe to notify this process's mailbox
(:mod:`fiberlite.connection.readiness`) once the end is readable, and watches the
other objects' descriptors in a thread of its own.
"""
from __future__ import annotations

import os
import threading
import time
from typing import Any, Iterable

from ..runtime.links.reader import unlink_own
from .pipe import Connection
from .readiness import _readiness_mailbox, _wait_ids

__all__ = ["wait"]


def _reads_lane(conn: Connection) -> bool:
    return conn._lanes is not None and conn._lanes[0] is not None


def wait(object_list: Iterable[Any], timeout: float | None = None) -> list[Any]:
    """Wait until one of ``object_list`` is ready, like ``multiprocessing.connection.wait``.

    Accepts fiberlite :class:`Connection` objects (ready: something to read, or EOF)
    together with anything the standard ``wait`` accepts (``Process.sentinel``, sockets,
    objects with ``fileno()``). Returns the ready ones; an empty list after ``timeout``.
    """
    from multiprocessing.connection import wait as os_wait
    objects = list(object_list)
    # (an end that reads a lane here is waited on by the lane's own descriptor)
    conns = [o for o in objects if isinstance(o, Connection) and not _reads_lane(o)]
    others = [o for o in objects if not isinstance(o, Connection) or _reads_lane(o)]
    if not conns:
        return os_wait(others, timeout)
    for conn in conns:
        conn._check_readable()
        unlink_own(conn._ref, conn._end)
    deadline = None if timeout is None else time.monotonic() + max(0.0, timeout)
    mailbox, mailbox_ref = _readiness_mailbox()
    wait_id = next(_wait_ids)
    woken, ready_indexes = threading.Event(), set()

    def notify(index: int) -> None:
        ready_indexes.add(index)
        woken.set()
    mailbox.open(wait_id, notify)
    watched: list[int] = []
    stop_r = stop_w = None
    try:
        for index, conn in enumerate(conns):
            if conn._ref.call("watch", conn._end, (wait_id, index), mailbox_ref):
                ready_indexes.add(index)
            else:
                watched.append(index)
        ready_others = os_wait(others, 0) if others else []
        if not ready_indexes and not ready_others:
            if others:  # the descriptors are watched by a thread that rings the same bell
                stop_r, stop_w = os.pipe()
                watcher = threading.Thread(target=_watch_descriptors, daemon=True,
                                           args=(others + [stop_r], stop_r, woken),
                                           name="fiberlite-wait")
                watcher.start()
            remaining = None if deadline is None else max(0.0, deadline - time.monotonic())
            woken.wait(remaining)
            if others:
                ready_others = os_wait(others, 0)
        ready = {id(conns[i]) for i in ready_indexes} | {id(o) for o in ready_others}
        return [o for o in objects if id(o) in ready]
    finally:
        mailbox.close(wait_id)
        if stop_w is not None:
            try:
                os.write(stop_w, b"x")  # the watcher thread returns and closes its end
            except BrokenPipeError:
                pass  # it has already returned
            os.close(stop_w)
        for index in watched:
            if index not in ready_indexes:
                try:
                    conns[index]._ref.cast("unwatch", conns[index]._end, (wait_id, index))
                except (ConnectionError, ReferenceError):
                    pass


def _watch_descriptors(objects: list, stop_r: int, woken: threading.Event) -> None:
    from multiprocessing.connection import wait as os_wait
    try:
        if stop_r not in os_wait(objects):
            woken.set()
    finally:
        os.close(stop_r)
