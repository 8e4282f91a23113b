"""Observer hooks: the API layer tells whoever watches the run (the dashboard) what it
creates and what happens to it.

``notice(event, *details)`` calls every watcher. With no dashboard the list is empty
after the first call, so a hook costs one call over an empty list (the first watcher,
put there by ``fiberlite/__init__``, starts the dashboard if the settings ask for one,
and steps aside).

Events: ``process`` (a started Process), ``pool``, ``batch`` (a pool's dispatcher and a
call's group), ``tasks`` (a sink, the count of tasks that failed, the error),
``finished`` (a sink that has every result, or gave up: the call is over; a watcher
reads the tasks done from the sink, ``_progress()``), ``worker_lost`` (a dispatcher,
the worker's id, the cause, chunks given back), ``queue``, ``manager``, ``ring``.
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
    global watchers
    with _lock:  # a new list: a notice going through the old one is not disturbed
        if watcher not in watchers:
            watchers = [*watchers, watcher]


def unwatch(watcher: Watcher) -> None:
    global watchers
    with _lock:
        watchers = [w for w in watchers if w is not watcher]
