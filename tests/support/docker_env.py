"""Docker engine and project image for the test suite.

``ensure_docker()`` runs ``.ci/docker_setup.sh`` once per test session (it
installs/starts dockerd if needed, makes the base image and builds
``fiberlite:test``; seconds when all is in place) and returns the image name.
Failure raises RuntimeError: Docker tests must fail loudly, never skip.
"""
from __future__ import annotations

import os
import subprocess
import threading
from pathlib import Path

IMAGE = os.environ.get("FIBERLITE_IMAGE", "fiberlite:test")
SETUP_SCRIPT = Path(__file__).resolve().parents[2] / ".ci" / "docker_setup.sh"
# First run on a fresh machine: apt install + debootstrap + wheels + build.
TIMEOUT = float(os.environ.get("FIBERLITE_DOCKER_SETUP_TIMEOUT", "1200"))

_lock = threading.Lock()
_result: str | RuntimeError | None = None


def ensure_docker() -> str:
    """Return the test image name once Docker and the image are ready."""
    global _result
    with _lock:
        if _result is None:
            _result = _run_setup()
    if isinstance(_result, RuntimeError):
        raise _result
    return _result


def _run_setup() -> str | RuntimeError:
    env = dict(os.environ, FIBERLITE_IMAGE=IMAGE)
    try:
        proc = subprocess.run(
            ["bash", str(SETUP_SCRIPT)],
            stdin=subprocess.DEVNULL,
            capture_output=True,
            text=True,
            timeout=TIMEOUT,
            env=env,
        )
    except subprocess.TimeoutExpired as exc:
        err = exc.stderr.decode(errors="replace") if isinstance(exc.stderr, bytes) else (exc.stderr or "")
        return RuntimeError(f"{SETUP_SCRIPT} timed out after {TIMEOUT:g} s:\n{_tail(err)}")
    except OSError as exc:
        return RuntimeError(f"cannot run {SETUP_SCRIPT}: {exc}")
    if proc.returncode != 0:
        return RuntimeError(
            f"Docker setup failed ({SETUP_SCRIPT}, exit {proc.returncode}):\n"
            f"{_tail(proc.stderr + proc.stdout)}"
        )
    return IMAGE


def _tail(text: str, lines: int = 40) -> str:
    return "\n".join(text.strip().splitlines()[-lines:])
