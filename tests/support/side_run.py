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


_REAPED: dict[int, tuple[float, float, int]] = {}  # pid -> (wall seconds, CPU seconds, exit code)
_REAPERS: dict[int, threading.Thread] = {}
COSTS: dict[str, tuple[float, float]] = {}  # name -> (wall seconds, CPU seconds with its waited children)


def started(process: subprocess.Popen) -> None:
    """Note that ``process`` (a side run) starts now: a thread reaps it as soon as it
    ends, so that its wall time is its own (not until someone waited for it) and its CPU
    time (and its children's that it waited for) is known."""
    start = time.monotonic()

    def reap() -> None:
        try:
            _, status, usage = os.wait4(process.pid, 0)
        except ChildProcessError:  # its Popen reaped it (killed as the session ends)
            return
        code = os.waitstatus_to_exitcode(status)
        process.returncode = code  # the Popen knows it ended: no later wait or kill of the pid
        _REAPED[process.pid] = (time.monotonic() - start, usage.ru_utime + usage.ru_stime, code)
    reaper = threading.Thread(target=reap, daemon=True, name=f"reap-{process.pid}")
    _REAPERS[process.pid] = reaper
    reaper.start()


def reaped_cpu() -> float:
    """The CPU seconds of the side runs reaped so far (with their waited children): this
    process's children's CPU time includes them from the moment each is reaped."""
    return sum(cpu for _, cpu, _ in list(_REAPED.values()))


def wait_for(process: subprocess.Popen, seconds: float, name: str) -> bool:
    """Wait up to ``seconds`` for ``process`` to end: whether it did (if not, it is
    killed). What it cost goes to :data:`COSTS` under ``name``."""
    _REAPERS[process.pid].join(seconds)
    if process.pid not in _REAPED:
        process.kill()
        _REAPERS[process.pid].join()
        return False
    wall, cpu, process.returncode = _REAPED[process.pid]
    COSTS[name] = (wall, cpu)
    return True
