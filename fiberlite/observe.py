"""Observer hooks: the API layer tells whoever watches the run (the dashboard) what it
creates and what happens to it.

``notice(event, *details)`` calls every watcher. Before the first event is passed on,
the hook set with :func:`before_first` runs once (``fiberlite/__init__``'s starts the
dashboard if the settings ask for one, which then watches); events noticed meanwhile on
other threads wait for it, so none is missed. With no dashboard the list stays empty,
so a notice costs a look at one name and a call over an empty list.

Events: ``process`` (a started Process), ``pool``, ``batch`` (a pool's dispatcher and a
call's group), ``tasks`` (a sink, the count of tasks that failed, the error),
``finished`` (a sink that has every result, or gave up: the call is over; a watcher
reads the tasks done from the sink, ``progress()``), ``worker_lost`` (a dispatcher,
the worker's id, the cause, chunks given back), ``queue``, ``manager``, ``ring``.

What a watcher may read of an object it was told of is its *view* (:func:`view_of`):
each API class names the function that makes its read-only view (:func:`provides_view`),
so that a user's object carries no extra public attribute for it.
"""
from __future__ import annotations

import threading
from typing import Any, Callable

Watcher = Callable[..., None]

watchers: list[Watcher] = []
_lock = threading.Lock()
_first: Callable[[], None] | None = None
_first_lock = threading.Lock()


def notice(event: str, *details: Any) -> None:
    """Tell every watcher that ``event`` happened."""
    if _first is not None:
        _run_first()
    for watcher in watchers:
        watcher(event, *details)


def before_first(hook: Callable[[], None]) -> None:
    """Run ``hook()`` once, before the first event is passed to the watchers."""
    global _first
    _first = hook


def _run_first() -> None:
    global _first
    with _first_lock:  # a notice on another thread waits here until the hook is done
        hook = _first
        if hook is None:
            return
        try:
            hook()
        finally:
            _first = None  # only now: a notice that finds it None sees the hook's watchers


def watch(watcher: Watcher) -> None:
    global watchers
    with _lock:  # a new list: a notice going through the old one is not disturbed
        if watcher not in watchers:
            watchers = [*watchers, watcher]


def unwatch(watcher: Watcher) -> None:
    global watchers
    with _lock:
        watchers = [w for w in watchers if w is not watcher]


_views: dict[type, Callable[[Any], Any]] = {}


def provides_view(cls: type, make: Callable[[Any], Any]) -> None:
    """``make(obj)`` is the read-only view of an object of ``cls`` (or a subclass)."""
    _views[cls] = make


def view_of(obj: Any) -> Any:
    """The read-only view of ``obj`` (see :func:`provides_view`)."""
    for cls in type(obj).__mro__:
        make = _views.get(cls)
        if make is not None:
            return make(obj)
    raise TypeError(f"{type(obj).__name__} objects have no view")
