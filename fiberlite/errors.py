"""Exceptions, named as in :mod:`multiprocessing` where they mirror it."""
from __future__ import annotations

import multiprocessing


ProcessError = multiprocessing.ProcessError
BufferTooShort = multiprocessing.BufferTooShort
TimeoutError = multiprocessing.TimeoutError
AuthenticationError = multiprocessing.AuthenticationError


class ConnectionLost(ConnectionError):
    """The connection to another job ended (that job exited or was killed)."""


class ConfigError(ValueError):
    """A setting has a value fiberlite cannot use; the message names the setting."""


class BackendError(RuntimeError):
    """A backend could not create or manage a job; the message says what to fix."""


class RemoteTraceback(Exception):
    """Carries the formatted traceback of an exception raised in another job."""

    def __init__(self, tb: str) -> None:
        super().__init__(tb)
        self.tb = tb

    def __str__(self) -> str:
        return self.tb


class WorkerLostError(ProcessError):
    """A task was running in workers that died, as many times as the pool allows."""


class BrokenPoolError(ProcessError):
    """The pool's workers cannot start (they exit before asking for work)."""


class RingError(ProcessError):
    """A :class:`fiberlite.Ring` cannot go on: a member failed, died or left.

    ``rank`` is the member that caused it (None when unknown); ``exitcode`` its exit
    code when known.
    """

    def __init__(self, message: str, rank: int | None = None, exitcode: int | None = None) -> None:
        super().__init__(message)
        self.rank = rank
        self.exitcode = exitcode

    def __reduce__(self):
        return (type(self), (str(self), self.rank, self.exitcode))
