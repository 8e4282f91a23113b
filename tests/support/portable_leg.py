"""The portable path's leg: the tests of the shared primitives once more, in a pytest of
their own with ``FIBERLITE_PORTABLE_SYNC=1`` (POSIX semaphores instead of the C
extension, what macOS and a machine without a C compiler run).

:func:`start` launches it, niced, with its output in a file, as soon as the suite is
collected (``conftest.py``), so that it runs while the rest of the suite does;
``tests/test_portable_sync.py`` waits for it and reads its result. It runs the
same-machine leg of each test (on the hub's leg the creator acts for the job, with
the same code as for its own threads), the hub's leg of the killed holders, and
CPython's tests of the primitives, Value and Array: about 110 s on its own.
"""
from __future__ import annotations

import os
import sys
import tempfile

from side_run import SideRun, launch

ENV = "FIBERLITE_PORTABLE_SYNC"
FILES = [
    "tests/synchronize/test_synchronize.py",
    "tests/synchronize/test_holder_kills.py",
    "tests/synchronize/test_machine_mix.py",
    "tests/test_sharedctypes.py",
    "tests/runtime/test_shm_door.py",
    *(f"tests/test_cpython_conformance.py::{name}" for name in
      ("TestLock", "TestSemaphore", "TestCondition", "TestEvent", "TestBarrier", "TestValue",
       "TestArray", "TestSharedCTypes")),
]
# the same-machine leg of the tests run on both paths (the hub's leg acts on the memory
# with the same code, from the creator), and both legs of the killed holders
SELECT = "not hub or holder_kills"
MIN_PASSED = 60  # fewer passing means the leg did not really run
RUN_SECONDS = 480


Leg = SideRun  # the leg's run


_started: Leg | None = None


def start() -> Leg:
    """Start the leg (once per session)."""
    global _started
    if _started is None:
        folder = tempfile.mkdtemp(prefix="fiberlite-portable-")
        env = {k: v for k, v in os.environ.items() if not k.startswith(("FIBERLITE_", "PYTEST_"))}
        env[ENV] = "1"
        command = ["nice", "-n", "5", sys.executable, "-m", "pytest", "-q",
                   "-p", "no:cacheprovider", "-m", "not docker and not kubernetes", "-k", SELECT,
                   *FILES]
        _started = launch(command, env, folder, "portable.log")
    return _started


def started() -> Leg | None:
    return _started
