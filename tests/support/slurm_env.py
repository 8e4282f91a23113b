"""A one-node Slurm cluster for the test suite.

``ensure_slurm()`` runs ``.ci/slurm_setup.sh`` once per test session (it installs
slurm-wlm and munge and starts munged, slurmctld and slurmd when they are missing;
seconds when all runs) and returns the ``slurm.conf`` path. The script exits 77 only
when this machine cannot run Slurm at all (not root, no apt-get): then the Slurm tests
are skipped, loudly. Any other failure raises RuntimeError: they never skip silently.
"""
from __future__ import annotations

import os
import subprocess
import threading
from pathlib import Path

SETUP_SCRIPT = Path(__file__).resolve().parents[2] / ".ci" / "slurm_setup.sh"
TIMEOUT = float(os.environ.get("FIBERLITE_SLURM_SETUP_TIMEOUT", "900"))  # apt install on a fresh machine
CANNOT = 77


class SlurmUnavailable(Exception):
    """This machine cannot run a Slurm cluster (the setup script said why)."""


_lock = threading.Lock()
_result: str | Exception | None = None


def ensure_slurm() -> str:
    """The path of the test cluster's slurm.conf, once the cluster answers."""
    global _result
    with _lock:
        if _result is None:
            _result = _run_setup()
    if isinstance(_result, Exception):
        raise _result
    return _result


def _run_setup() -> str | Exception:
    try:
        proc = subprocess.run(["bash", str(SETUP_SCRIPT)], stdin=subprocess.DEVNULL,
                              capture_output=True, text=True, timeout=TIMEOUT)
    except subprocess.TimeoutExpired as exc:
        err = exc.stderr.decode(errors="replace") if isinstance(exc.stderr, bytes) else (exc.stderr or "")
        return RuntimeError(f"{SETUP_SCRIPT} timed out after {TIMEOUT:g} s:\n{_tail(err)}")
    except OSError as exc:
        return RuntimeError(f"cannot run {SETUP_SCRIPT}: {exc}")
    if proc.returncode == CANNOT:
        return SlurmUnavailable(_tail(proc.stderr))
    if proc.returncode != 0:
        return RuntimeError(f"Slurm setup failed ({SETUP_SCRIPT}, exit {proc.returncode}):\n"
                            f"{_tail(proc.stderr + proc.stdout)}")
    return proc.stdout.strip().splitlines()[-1]


def _tail(text: str, lines: int = 40) -> str:
    return "\n".join(text.strip().splitlines()[-lines:])
