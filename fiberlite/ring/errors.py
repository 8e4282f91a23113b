"""What both sides of a ring share: :class:`RingTimeoutError` and failure reports.

A member's job (:mod:`.job`) reports a target that failed with
:func:`describe_failure`; the parent (:mod:`.parent`) turns the report into the
:class:`~fiberlite.errors.RingError` that ``join()`` raises, and describes a result it
cannot unpack the same way. ``RingTimeoutError`` is raised on the member side
(:mod:`.inbox`, :mod:`.member`) and exported by the package.
"""
from __future__ import annotations

import builtins

from ..errors import RingError
from ..errors import TimeoutError as _MPTimeoutError
from ..failure import Failure


class RingTimeoutError(_MPTimeoutError, builtins.TimeoutError):
    """A ring operation waited longer than its timeout (both ``multiprocessing`` and
    builtin ``TimeoutError``)."""


def describe_failure(exc: BaseException, rank: int) -> dict:
    """What the parent learns of ``exc``, which ended ``rank``'s target: the exception as
    it travels (``failure``, a :class:`~fiberlite.failure.Failure`) and the rank whose
    failure caused it (``culprit``; None: this one's own)."""
    culprit = None
    if isinstance(exc, RingError) and exc.rank is not None and exc.rank != rank:
        culprit = exc.rank  # failed because another rank did
    return {"failure": Failure.of(exc), "culprit": culprit}
