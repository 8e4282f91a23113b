"""Exit codes as text, the same everywhere: ``-N`` is a job killed by signal ``N``."""
from __future__ import annotations

import signal


def signal_name(code: int | None) -> str | None:
    """The name of the signal that killed a job with exit code ``code`` (``SIGKILL``
    for -9), or None."""
    if code is not None and code < 0:
        try:
            return signal.Signals(-code).name
        except ValueError:
            pass
    return None


def exit_name(code: int | None) -> str:
    """``multiprocessing``'s form (a Process's repr): ``-SIGTERM`` for a job killed by a
    signal, else the code (``0``, ``None``)."""
    name = signal_name(code)
    return f"-{name}" if name else str(code)


def describe_exit(code: int | None) -> str:
    """How a job ended, for a message: ``exit code 3``, ``killed by SIGKILL``, or
    ``ended`` when its code is not known."""
    if code is None:
        return "ended"
    if code < 0:
        return f"killed by {signal_name(code) or f'signal {-code}'}"
    return f"exit code {code}"
