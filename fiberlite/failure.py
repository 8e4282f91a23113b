"""An exception raised in one job, as it travels to the job that reports it.

A pool's task, a manager's method and a ring member's target may raise in a job of
their own; the caller sees the same exception, its remote traceback attached as
``__cause__`` (:class:`~fiberlite.errors.RemoteTraceback`, formatted as
``multiprocessing.pool`` does). :meth:`Failure.of` captures it where it was raised: the
exception pickled (with cloudpickle, its class may be the user's script's) or, when it
cannot be, why not, with its type's name, message, repr and formatted traceback, all
plain text. :meth:`Failure.rebuild` makes the exception again where it is reported, or a
stand-in when it cannot be unpickled there.
"""
from __future__ import annotations

import pickle
import traceback
from typing import Callable

from .errors import RemoteTraceback
from .wire.codec import dumps_bytes, short_repr

__all__ = ["Failure"]


class Failure:
    """An exception raised in another job: ``pickled`` (None when it could not be
    pickled: ``why`` says why), ``type_name``, ``message`` (its ``str``), ``shown`` (its
    ``repr``, cut short) and ``traceback`` (formatted)."""

    __slots__ = ("pickled", "why", "type_name", "message", "shown", "traceback")

    def __init__(self, pickled: bytes | None, why: str | None, type_name: str, message: str,
                 shown: str, traceback: str) -> None:
        self.pickled = pickled
        self.why = why
        self.type_name = type_name
        self.message = message
        self.shown = shown
        self.traceback = traceback

    @classmethod
    def of(cls, exc: BaseException, tb: str | None = None) -> "Failure":
        """``exc`` as it travels; ``tb``: its formatted traceback (default: its own)."""
        if tb is None:
            tb = "".join(traceback.format_exception(type(exc), exc, exc.__traceback__))
        try:
            pickled, why = dumps_bytes(exc), None
        except Exception as error:
            pickled, why = None, repr(error)
        try:
            message = str(exc)
        except Exception:
            message = "<its message could not be shown>"
        return cls(pickled, why, type(exc).__qualname__, message, short_repr(exc), tb)

    def __reduce__(self):
        return (Failure, (self.pickled, self.why, self.type_name, self.message, self.shown,
                          self.traceback))

    def remote_traceback(self) -> RemoteTraceback:
        return RemoteTraceback(f'\n"""\n{self.traceback}"""')

    def exception(self) -> BaseException | None:
        """The exception unpickled here, or None (it could not be pickled there, or
        unpickled here: ``why`` then says why)."""
        if self.pickled is None:
            return None
        try:
            exc = pickle.loads(self.pickled)
        except Exception as error:
            self.why = f"it could not be unpickled here: {error!r}"
            return None
        return exc if isinstance(exc, BaseException) else None

    def rebuild(self, stand_in: Callable[["Failure"], BaseException] | None = None) -> BaseException:
        """The exception, its remote traceback attached as ``__cause__``. When the
        exception is not available: ``stand_in(self)`` with the same cause, or without a
        ``stand_in`` the :class:`~fiberlite.errors.RemoteTraceback` alone."""
        remote = self.remote_traceback()
        exc = self.exception()
        if exc is None:
            if stand_in is None:
                return remote
            exc = stand_in(self)
        exc.__cause__ = remote
        return exc

