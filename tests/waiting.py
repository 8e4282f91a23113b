"""Waiting for a state a test can only observe from outside (no event announces it)."""
from __future__ import annotations

import time
from typing import Callable


def eventually(check: Callable[[], bool], timeout: float = 30.0, what: str = "the state") -> None:
    """Return once ``check()`` holds; fail the test, naming ``what``, after ``timeout`` s."""
    deadline = time.monotonic() + timeout
    while not check():
        assert time.monotonic() < deadline, f"{what} did not settle within {timeout} s"
        time.sleep(0.05)
