"""One-way direct calls not yet known to be handled, and settling them.

A primitive's call that needs no answer (an event's ``set`` and ``clear``, the release
of a lock that carried its object: :mod:`fiberlite.runtime.direct`) is written to the
hub's direct connection and not waited for. The hub handles a process's requests in
the order they were sent, on every direct connection of it (:mod:`.direct`), so the
process's next call to that hub sees its effect. Anyone else learns of the call only
through something this process sends next: every path the wire sends on (links, nng
connections, a pool's frames) first settles what is unsettled (:func:`settle`: one
round trip per such hub), and so does the process's exit. A send on a path that
settles costs one look at a dict when nothing is unsettled. Sends that a thread of their
own gathers into calls (a queue's puts through a hub:
:class:`~fiberlite.runtime.lanes.feeder.Batches`) are unsettled the same way until that
thread has delivered them.
"""
from __future__ import annotations

import threading
from typing import Callable

unsettled: dict[object, Callable[[], None]] = {}  # a hub's channel -> what settles it
_settling = threading.local()


def owe(key: object, settle_one: Callable[[], None]) -> None:
    """One-way calls to ``key`` (a hub's channel) are unsettled: ``settle_one()`` settles them."""
    unsettled[key] = settle_one


def paid(key: object) -> None:
    """Every one-way call to ``key`` is known to be handled."""
    unsettled.pop(key, None)


def settle(skip: type | None = None) -> None:
    """Return once every one-way call this process sent is handled (a round trip per hub
    with some unsettled; nothing otherwise), but those whose key is a ``skip``. A hub that
    is gone settles nothing: what it held for this process is recovered there."""
    if not unsettled or getattr(_settling, "on", False):
        return
    _settling.on = True  # (a settling call's own sends do not settle again)
    try:
        for key, settle_one in list(unsettled.items()):
            if skip is None or not isinstance(key, skip):
                settle_one()
    finally:
        _settling.on = False


def exempt() -> None:
    """The calling thread's sends settle nothing: it is what carries some of the calls
    (a thread of gathered sends), which must not wait for itself."""
    _settling.on = True


def forget_all() -> None:
    """(a forked child) The parent's calls are not this process's."""
    unsettled.clear()


__all__ = ["owe", "paid", "settle", "exempt", "unsettled", "forget_all"]
