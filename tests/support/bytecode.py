"""fiberlite's bytecode files for an interpreter, written before the suite's jobs start.

A source checkout run with ``PYTHONDONTWRITEBYTECODE`` set (as CI machines often are) would
otherwise compile every fiberlite module again in each job the suite starts: about a tenth
of a CPU-second per job, thousands of times in a whole run."""
from __future__ import annotations

import os
import subprocess
import sys

from paths import ROOT


def compile_package(python: str = sys.executable) -> None:
    """Write the bytecode of ``fiberlite/`` for ``python`` (quick when it is current)."""
    subprocess.run([python, "-m", "compileall", "-q", os.path.join(ROOT, "fiberlite")],
                   stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, check=True, timeout=300)
