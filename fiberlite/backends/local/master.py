"""``fiberlite run`` on this machine: the master is a child process of the command, its
output shown as it comes and kept (:mod:`.runs`) for ``fiberlite logs``."""
from __future__ import annotations

import os
import subprocess
import sys
import threading
from typing import Any, BinaryIO

from ...errors import BackendError
from ..base import MasterRun, exit_status
from . import runs

IGNORED = ("--image", "--cpu", "--memory", "--gpu", "--volume", "--working-dir")


def run_master(run: MasterRun) -> int:
    """Run ``run.spec``'s command here to its end; the command's exit status."""
    ignored = [option for option in run.given if option in IGNORED]
    if ignored:
        sys.stderr.write(f"fiberlite: {', '.join(ignored)} do(es) not apply to the local backend; ignored\n")
    spec = run.spec
    command = [sys.executable, *spec.command[1:]] if spec.command[0] == "python" else spec.command
    try:
        runs.private_log_dir()
    except OSError as exc:
        raise BackendError(f"cannot keep the run's log: {exc}") from None
    runs.done_path(spec.name).unlink(missing_ok=True)
    with runs.open_private(runs.log_path(spec.name)) as log:
        try:
            proc = subprocess.Popen(command, env={**os.environ, **spec.env},
                                    stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        except OSError as exc:
            raise BackendError(f"cannot start {' '.join(spec.command[1:2])}: {exc}") from None
        progress = run.progress(f"fiberlite: run {run.run_id} [local]",
                                lambda: runs.list_jobs(run.run_id), 0.5)
        lock = threading.Lock()
        pumps = [threading.Thread(target=_pump, args=(pipe, out, log, lock, progress), daemon=True)
                 for pipe, out in ((proc.stdout, sys.stdout), (proc.stderr, sys.stderr))]
        for pump in pumps:
            pump.start()
        try:
            code = proc.wait()
            for pump in pumps:
                pump.join()
        finally:
            progress.stop()
            if proc.poll() is None:  # interrupted: the caller removes the run's processes
                threading.Thread(target=_finish_log, args=(proc, spec.name), daemon=True).start()
    if proc.poll() is not None:
        _mark_done(spec.name, code)
    return exit_status(code)


def _pump(pipe: BinaryIO, out: Any, log: BinaryIO, lock: threading.Lock, progress: Any) -> None:
    """Copy the master's output to our stream and to its log, as it comes."""
    target = getattr(out, "buffer", None)
    fd = pipe.fileno()
    while True:
        data = os.read(fd, 65536)
        if not data:
            break
        progress.stop()
        with lock:
            try:
                if target is not None:
                    target.write(data)
                else:
                    out.write(data.decode(errors="replace"))
                out.flush()
            except (OSError, ValueError):
                pass
            log.write(data)
            log.flush()
    pipe.close()


def _finish_log(proc: subprocess.Popen, job_name: str) -> None:
    _mark_done(job_name, proc.wait())


def _mark_done(job_name: str, code: int) -> None:
    try:
        with runs.open_private(runs.done_path(job_name)) as done:
            done.write(f"{code}\n".encode())
    except OSError:
        pass
