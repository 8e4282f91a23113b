"""Docker engine and project image for the test suite.

``ensure_docker()`` runs ``.ci/docker_setup.sh`` once per test session (it
installs/starts dockerd if needed, makes the base image and builds
``fiberlite:test``; seconds when all is in place) and returns the image name.
``start_setup()`` launches that run in the background as soon as the suite is
collected (``conftest.py``), so that the build goes on while the first tests run;
``ensure_docker()`` then waits for it. Failure raises RuntimeError: Docker tests
must fail loudly, never skip.
"""
from __future__ import annotations

import os
import subprocess
import tempfile
import threading
import time
from pathlib import Path

IMAGE = os.environ.get("FIBERLITE_IMAGE", "fiberlite:test")
SETUP_SCRIPT = Path(__file__).resolve().parents[2] / ".ci" / "docker_setup.sh"
# First run on a fresh machine: apt install + debootstrap + wheels + build.
TIMEOUT = float(os.environ.get("FIBERLITE_DOCKER_SETUP_TIMEOUT", "1200"))

_lock = threading.Lock()
_result: str | RuntimeError | None = None
_setup: "_Setup | None" = None


def ensure_docker() -> str:
    """Return the test image name once Docker and the image are ready."""
    global _result
    with _lock:
        if _result is None:
            _result = _run_setup()
    if isinstance(_result, RuntimeError):
        raise _result
    return _result


def start_setup() -> None:
    """Launch the setup now, in the background (once per session)."""
    global _setup
    with _lock:
        if _setup is None and _result is None:
            _setup = _Setup()


class _Setup:
    """One background run of the setup script, its output in a file."""

    def __init__(self) -> None:
        self.output = tempfile.TemporaryFile(mode="w+")  # a file, not a pipe: nothing to drain
        self.started = time.monotonic()
        try:
            self.process: subprocess.Popen | None = subprocess.Popen(
                ["bash", str(SETUP_SCRIPT)], stdin=subprocess.DEVNULL, stdout=self.output,
                stderr=subprocess.STDOUT, text=True, env=dict(os.environ, FIBERLITE_IMAGE=IMAGE))
            self.error = ""
        except OSError as exc:
            self.process, self.error = None, f"cannot run {SETUP_SCRIPT}: {exc}"

    def result(self) -> str | RuntimeError:
        if self.process is None:
            return RuntimeError(self.error)
        try:
            code = self.process.wait(max(1.0, TIMEOUT - (time.monotonic() - self.started)))
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()
            return RuntimeError(f"{SETUP_SCRIPT} timed out after {TIMEOUT:g} s:\n{self.tail()}")
        if code != 0:
            return RuntimeError(f"Docker setup failed ({SETUP_SCRIPT}, exit {code}):\n{self.tail()}")
        return IMAGE

    def tail(self) -> str:
        self.output.seek(0)
        return _tail(self.output.read())


def _run_setup() -> str | RuntimeError:
    setup = _setup or _Setup()
    return setup.result()


def _tail(text: str, lines: int = 40) -> str:
    return "\n".join(text.strip().splitlines()[-lines:])
