"""How long a shared object (Queue, Lock, Value...) stays in its creator's hub.

A servant created through a handle (:class:`~fiberlite.queues.Queue`, the locks...) is
*kept* in its hub while any of these holds:

- a handle on it is alive in the creating process (each one counts);
- it was pickled for a job being started (a Process argument) and that job has not
  ended: the job, and whatever it hands the object on to the same way, may use it;
- it was pickled any other way (put on a queue, sent on a pipe, returned by a task):
  where it goes cannot be followed, so it is kept until the creator exits.

Once none holds, the servant is dropped and its memory (items left in a queue...) freed.
Pipe ends follow the same job scope (see :mod:`fiberlite.connection`).
"""
from __future__ import annotations

import contextlib
import os
import threading
import weakref
from typing import Any, Iterator

from .hub import HOLD, PIN, RELEASE, ObjectRef, current_hub, get_hub


_scope = threading.local()


@contextlib.contextmanager
def exports_for_job() -> Iterator[list]:
    """Collect what this thread pickles in the block (a job's Process) as
    ``(ref, method, args)`` to cast once that job has ended (:func:`expire_exports`)."""
    outer = getattr(_scope, "exports", None)
    exports: list = []
    _scope.exports = exports
    try:
        yield exports
    finally:
        _scope.exports = outer


def job_exports() -> list | None:
    """The list of the job being packed on this thread, if any."""
    return getattr(_scope, "exports", None)


def expire_exports(exports: list) -> None:
    """The job ``exports`` were pickled for has ended: tell each object's hub."""
    for ref, method, args in exports:
        try:
            ref.cast(method, *args)
        except (ConnectionError, ReferenceError):
            pass  # its creator has gone: nothing to free


def register(handle: Any, servant: Any) -> ObjectRef:
    """Register ``servant`` for ``handle`` (a new object in the creating process): kept
    while ``handle`` lives, or longer as above."""
    hub = get_hub()
    ref = hub.register(servant, held=True)
    weakref.finalize(handle, hub.release_local, ref.oid)
    return ref


def exported(ref: ObjectRef) -> None:
    """``ref``'s handle is being pickled: keep its servant for where it is going."""
    exports = job_exports()
    if exports is None:
        ref.cast(PIN)
        return
    token = os.urandom(8)
    ref.cast(HOLD, token)  # sent before the job exists: it arrives first
    exports.append((ref, RELEASE, (token,)))


def loaded(handle: Any, ref: ObjectRef) -> None:
    """A handle was unpickled: in the creating process it counts like the original."""
    hub = current_hub()
    if hub is not None and hub.address == ref.address and hub.retain_local(ref.oid):
        weakref.finalize(handle, hub.release_local, ref.oid)
