"""Shared fixtures: every test runs in a fresh working directory and leaves no job behind."""
from __future__ import annotations

import os
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TESTS = os.path.dirname(os.path.abspath(__file__))
for path in (ROOT, TESTS):
    if path not in sys.path:
        sys.path.insert(0, path)


@pytest.fixture(autouse=True)
def _no_leftover_children():
    """Fail a test that leaves running child jobs behind (and clean them up)."""
    import fiberlite
    yield
    left = fiberlite.active_children()
    for child in left:
        child.kill()
        child.join(10)
    assert not left, f"test left running jobs: {left}"
