"""Container runners: how the double's "kubelet" starts a pod's container.

A runner is any callable ``runner(start: ContainerStart) -> Handle``.  The
default, :class:`LocalRunner`, runs the container's ``command + args`` as a
local process in its own session (so a kill reaches the process tree, as a
container stop would); it mounts no volume.  :mod:`.docker_runner` runs each
container as a Docker container of the pod's image.
"""

from __future__ import annotations

import dataclasses
import os
import signal
import subprocess
import threading
import time
from typing import Callable, Optional, Protocol


class StartError(Exception):
    """The container could not be started (becomes ``StartError``, exit 128)."""


class LogBuffer:
    """A container's combined stdout/stderr, kept as timestamped lines."""

    def __init__(self, on_change: Callable[[], None] = lambda: None):
        self.lines: list[tuple[float, bytes]] = []
        self.closed = False
        self._on_change = on_change

    def write(self, line: bytes) -> None:
        self.lines.append((time.time(), line))
        self._on_change()

    def close(self) -> None:
        self.closed = True
        self._on_change()


@dataclasses.dataclass
class ContainerStart:
    """Everything a runner needs to start one container of a pod."""
    pod: dict            # the pod object (JSON dict) as stored
    container: dict      # its entry in ``spec.containers``
    env: dict            # fully resolved environment (spec env, secrets, HOSTNAME)
    command: list        # ``command + args`` after ``$(VAR)`` expansion
    log: LogBuffer       # where stdout/stderr go
    # ConfigMap and Secret volumes: {mountPath: {relative path: bytes}} (volumes.py)
    files: dict = dataclasses.field(default_factory=dict)


class Handle(Protocol):
    """A started container."""
    container_id: str

    def wait(self, timeout: Optional[float] = None) -> Optional[int]:
        """Exit code (128 + n when killed by signal n), or None on timeout."""

    def signal(self, sig: int) -> None:
        """Deliver ``sig`` to the container's processes."""


# Variables a pod on a real node would not inherit from the test process.
SCRUBBED = ("FIBERLITE_", "KUBERNETES_", "KUBECONFIG", "PYTEST_")


def host_env() -> dict:
    """The test process's environment standing in for the image's, scrubbed."""
    return {k: v for k, v in os.environ.items() if not k.startswith(SCRUBBED)}


class LocalRunner:
    """Run containers as local subprocesses; the "image" is this machine."""

    def __init__(self, base_env: Optional[Callable[[], dict]] = host_env):
        self.base_env = base_env

    def __call__(self, start: ContainerStart) -> "LocalHandle":
        if not start.command:
            raise StartError("the double's local runner needs an explicit command: "
                             "image entrypoints are unknown here")
        env = dict(self.base_env() if self.base_env else {})
        env.update(start.env)
        cwd = start.container.get("workingDir")
        try:
            proc = subprocess.Popen(
                start.command, env=env,
                cwd=cwd if cwd and os.path.isdir(cwd) else None,
                stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                stderr=subprocess.STDOUT, start_new_session=True)
        except OSError as exc:
            raise StartError(f'failed to create containerd task: exec: "{start.command[0]}": '
                             f"{exc.strerror}") from exc
        return LocalHandle(proc, start.log)


class LocalHandle:
    """A local process standing for a container."""

    def __init__(self, proc: subprocess.Popen, log: LogBuffer):
        self.proc = proc
        self.container_id = f"local://{proc.pid}"
        self._reader = threading.Thread(target=self._pump, args=(log,), daemon=True)
        self._reader.start()

    def _pump(self, log: LogBuffer) -> None:
        for line in iter(self.proc.stdout.readline, b""):
            log.write(line)
        self.proc.stdout.close()
        log.close()

    def wait(self, timeout=None):
        try:
            code = self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            return None
        self._reader.join(5)  # flush the tail of the log before reporting exit
        return 128 - code if code < 0 else code

    def signal(self, sig: int) -> None:
        try:
            os.killpg(self.proc.pid, sig)
        except ProcessLookupError:
            pass

    def kill(self) -> None:
        self.signal(signal.SIGKILL)
