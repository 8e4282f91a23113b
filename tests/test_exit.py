"""Scripts end promptly however they leave their pools, processes, managers, queues and
rings, and leave no job behind: each shape of ``exit_shapes.py`` runs as a script, on
the local backend and on Docker, and is timed from the moment it is done to its exit.
"""
from __future__ import annotations

import os
import selectors
import signal
import subprocess
import time

import pytest

from exit_shapes import SHAPES
from interpreters import start_python
from paths import SUPPORT

LOCAL_DEADLINE = 2.0    # seconds from "ready" to the end of the interpreter, on an idle machine
DOCKER_DEADLINE = 10.0  # the same, when the engine stops and removes every container
STARTUP_TIMEOUT = 90.0  # seconds a shape may take to make its objects on a loaded machine
SCRIPT = os.path.join(SUPPORT, "exit_shapes.py")

pytestmark = pytest.mark.timeout(240)  # a shape's start and its deadline, both stretched by load


def run_shape(shape: str, deadline: float, cwd, **env: str) -> tuple[str, float, subprocess.CompletedProcess]:
    """Run one shape; return its run id, the seconds it took to exit after it was done,
    and the finished process."""
    # a script still there at the end prints where each of its threads is (faulthandler,
    # on SIGABRT), so that the failure says what it waited for
    proc = start_python(SCRIPT, shape, cwd=cwd, env={"PYTHONFAULTHANDLER": "1", **env},
                        stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        line = _read_ready(proc)
        done = time.monotonic()
        try:
            proc.wait(deadline * load_factor() + 10)  # room to see how late it is, then give up
        except subprocess.TimeoutExpired:
            proc.send_signal(signal.SIGABRT)
            try:
                proc.wait(10)
            except subprocess.TimeoutExpired:
                pass
        took = time.monotonic() - done
    finally:
        if proc.poll() is None:
            proc.kill()
        out, err = proc.communicate()
    assert line.startswith("ready "), f"{shape} did not get ready: {line!r}\n{err}"
    return line.split()[1], took, subprocess.CompletedProcess(proc.args, proc.returncode, out, err)


def _read_ready(proc: subprocess.Popen) -> str:
    with selectors.DefaultSelector() as selector:
        selector.register(proc.stdout, selectors.EVENT_READ)
        if not selector.select(STARTUP_TIMEOUT):
            return "(no line within %g s)" % STARTUP_TIMEOUT
    return proc.stdout.readline().strip()


def expected_code(shape: str) -> int:
    return 1 if shape == "raises" else 0


def load_factor() -> float:
    """How many times slower than idle this machine runs now (runnable processes per
    core, from 1 to 10): the deadlines are for an idle machine, and the test machine
    is shared. A hang or a wait of its own still fails."""
    return min(10.0, max(1.0, os.getloadavg()[0] / (os.cpu_count() or 1)))


def check(shape: str, took: float, result: subprocess.CompletedProcess, deadline: float) -> None:
    assert result.returncode == expected_code(shape), result.stderr
    allowed = deadline * load_factor()
    assert took < allowed, (f"{shape}: exit took {took:.2f} s (deadline {deadline:g} s, "
                            f"{allowed:.1f} s at this load)\n{result.stderr}")
    # nothing else is written: no traceback, no complaint from the exit (as on 3.12.1,
    # where no thread can be started at exit)
    if shape == "raises":
        last = result.stderr.rstrip().splitlines()[-1]
        assert last == "RuntimeError: the script failed with its pool open", result.stderr
    else:
        assert result.stderr == "", result.stderr


@pytest.mark.parametrize("shape", sorted(SHAPES))
def test_local_script_exits_promptly(shape, tmp_path):
    from fiberlite.backends.local.runs import run_processes
    run, took, result = run_shape(shape, LOCAL_DEADLINE, tmp_path, FIBERLITE_BACKEND="local")
    check(shape, took, result, LOCAL_DEADLINE)
    left = [proc for proc, _ in run_processes(run) if _running(proc)]
    assert not left, f"{shape} left jobs of run {run}: {left}"


def _running(proc) -> bool:
    import psutil
    try:
        return proc.status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


@pytest.mark.docker
@pytest.mark.parametrize("shape", sorted(SHAPES))
def test_docker_script_exits_promptly(shape, tmp_path, docker_image):
    run, took, result = run_shape(shape, DOCKER_DEADLINE, tmp_path, FIBERLITE_BACKEND="docker",
                                  FIBERLITE_IMAGE=docker_image, FIBERLITE_DOCKER_NETWORK="host")
    check(shape, took, result, DOCKER_DEADLINE)
    import docker
    client = docker.from_env()
    try:
        left = client.containers.list(all=True, filters={"label": f"fiberlite/run={run}"})
    finally:
        client.close()
    assert not left, f"{shape} left containers of run {run}: {[c.name for c in left]}"


@pytest.fixture(scope="module")
def docker_image():
    from docker_env import ensure_docker
    return ensure_docker()
