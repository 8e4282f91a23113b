"""Waiting for a state a test can only observe from outside (no event announces it)."""
from __future__ import annotations

import time
from typing import Callable


def eventually(check: Callable[[], bool], timeout: float = 30.0,
               what: str | Callable[[], str] = "the state") -> None:
    """Return once ``check()`` holds; fail the test, naming ``what`` (or what ``what()``
    says when it fails: the state as it is then), after ``timeout`` s."""
    deadline = time.monotonic() + timeout
    while not check():
        if time.monotonic() >= deadline:
            said = what() if callable(what) else what
            raise AssertionError(f"{said} did not settle within {timeout} s")
        time.sleep(0.05)
