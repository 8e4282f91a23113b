"""A pytest started beside the suite, its output in a file (the other Pythons' subsets,
the portable leg, the side leg): :func:`launch` starts one, :class:`SideRun` reads and
ends it, :func:`wait_for` waits for one and notes what it cost (:data:`COSTS`, printed
at the end of the suite's run)."""
from __future__ import annotations

import os
import shutil
import subprocess
import threading
import time
from dataclasses import dataclass

from paths import ROOT


@dataclass
class SideRun:
    process: subprocess.Popen
    output_path: str
    folder: str

    def output(self) -> str:
        with open(self.output_path, errors="replace") as file:
            return file.read()

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.kill()
            self.process.wait()
        shutil.rmtree(self.folder, ignore_errors=True)


def launch(command: list[str], env: dict[str, str], folder: str, log_name: str) -> SideRun:
    """Start ``command`` in the checkout, its output in ``folder``/``log_name``."""
    output_path = os.path.join(folder, log_name)
    with open(output_path, "w") as output:  # a file, not a pipe: nothing held open here
        process = subprocess.Popen(command, cwd=ROOT, env=env, text=True, stdin=subprocess.DEVNULL,
                                   stdout=output, stderr=subprocess.STDOUT)
    started(process)
    return SideRun(process, output_path, folder)


_STARTS: dict[int, float] = {}  # pid -> when it started (time.monotonic)
COSTS: dict[str, tuple[float, float]] = {}  # name -> (wall seconds, CPU seconds with its waited children)


def started(process: subprocess.Popen) -> None:
    """Note that ``process`` (a side run) starts now."""
    _STARTS[process.pid] = time.monotonic()


def wait_for(process: subprocess.Popen, seconds: float, name: str) -> bool:
    """Wait up to ``seconds`` for ``process`` to end: whether it did (if not, it is
    killed). It is reaped here, so that its CPU time (and its children's that it waited
    for) goes to :data:`COSTS` under ``name``."""
    reaped: list = []
    waiter = threading.Thread(target=lambda: reaped.append(os.wait4(process.pid, 0)), daemon=True,
                              name=f"wait-{name}")
    waiter.start()
    waiter.join(seconds)
    if not reaped:
        process.kill()
        process.wait()
        return False
    _, status, usage = reaped[0]
    process.returncode = os.waitstatus_to_exitcode(status)
    wall = time.monotonic() - _STARTS.get(process.pid, time.monotonic())
    COSTS[name] = (wall, usage.ru_utime + usage.ru_stime)
    return True
