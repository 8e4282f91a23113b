"""Observer hooks: the API layer tells whoever watches the run (the dashboard) what it
creates and what happens to it.

``notice(event, *details)`` calls every watcher. With no dashboard the list is empty
after the first call, so a hook costs one call over an empty list. The first call in
the top process of a run starts the dashboard when the ``dashboard`` setting asks for
one; in a job it never does.

Events: ``process`` (a started Process), ``pool``, ``batch`` (a pool's dispatcher and a
call's group), ``tasks`` (a sink and the count of results delivered, whether they were
values, the error), ``worker_lost`` (a dispatcher, the worker's id, the cause, chunks
given back), ``queue``, ``manager``, ``ring``.
"""
from __future__ import annotations

import threading
from typing import Any, Callable

Watcher = Callable[..., None]

watchers: list[Watcher] = []
_lock = threading.Lock()


def notice(event: str, *details: Any) -> None:
    """Tell every watcher that ``event`` happened."""
    for watcher in watchers:
        watcher(event, *details)


def watch(watcher: Watcher) -> None:
    with _lock:
        if watcher not in watchers:
            watchers.append(watcher)


def unwatch(watcher: Watcher) -> None:
    with _lock:
        if watcher in watchers:
            watchers.remove(watcher)


def start_if_asked() -> bool:
    """Start the dashboard if the settings ask for one and this is the top of the run."""
    from . import config, process
    if config.get("dashboard") is None or not isinstance(process.current_process(),
                                                        process._MainProcess):
        return False
    from .dashboard import start
    start()
    return True


def _first_notice(event: str, *details: Any) -> None:
    """Start the dashboard if asked, then step aside (and pass the event on)."""
    unwatch(_first_notice)
    if start_if_asked():
        notice(event, *details)


watchers.append(_first_notice)
