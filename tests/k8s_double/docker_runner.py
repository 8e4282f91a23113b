"""Pods as Docker containers of their image: what a node of a real cluster would run.

:class:`DockerRunner` starts each container of a pod with the Docker SDK: the pod's
image and ``command + args``, only the environment the kubelet resolved (plus the
image's own), host networking (every pod is ``127.0.0.1``, as in the double), a tiny
init as PID 1 (the pod's pause container would be), and its ConfigMap and Secret
volumes written to a directory of this machine and bind-mounted read-only. Nothing of
this machine's files is in it unless ``mounts`` lists it (a kubeconfig, standing in for
the service account a real pod would use to reach the API server).

Every container is labelled with the runner's id; :meth:`DockerRunner.close` removes
what is left.
"""

from __future__ import annotations

import os
import secrets
import shutil
import tempfile
import threading
from typing import Optional

from .runner import ContainerStart, LogBuffer, StartError

LABEL = "fiberlite-k8s-double"


class DockerRunner:
    """Run each container as a Docker container of the pod's image."""

    def __init__(self, mounts: Optional[dict] = None):
        import docker
        self.client = docker.from_env(timeout=120)
        self.mounts = dict(mounts or {})   # host path -> path in every container (read-only)
        self.id = secrets.token_hex(4)
        self._dirs: list[str] = []

    def __call__(self, start: ContainerStart) -> "DockerHandle":
        import docker
        from docker.types import Mount
        if not start.command:
            raise StartError("the double's docker runner needs an explicit command")
        mounts = [Mount(target, source, type="bind", read_only=True)
                  for source, target in self.mounts.items()]
        for target, files in start.files.items():
            mounts.append(Mount(target, self._write(files), type="bind", read_only=True))
        name = f"k8sdouble-{start.pod['metadata']['name'][:50]}-{secrets.token_hex(2)}"
        try:
            container = self.client.containers.create(
                start.container["image"], command=start.command, environment=start.env,
                name=name, network_mode="host", init=True, mounts=mounts, detach=True,
                working_dir=start.container.get("workingDir") or None,
                labels={LABEL: self.id, "pod": start.pod["metadata"]["name"]})
            container.start()
        except docker.errors.DockerException as exc:
            raise StartError(f"failed to create containerd task: {exc}") from None
        return DockerHandle(container, start.log)

    def _write(self, files: dict) -> str:
        folder = tempfile.mkdtemp(prefix="k8sdouble-volume-")
        os.chmod(folder, 0o755)
        self._dirs.append(folder)
        for rel, data in files.items():
            path = os.path.join(folder, rel)
            os.makedirs(os.path.dirname(path), exist_ok=True)
            with open(path, "wb") as fh:
                fh.write(data)
            os.chmod(path, 0o644)
        return folder

    def close(self) -> None:
        for container in self.client.containers.list(all=True, filters={"label": f"{LABEL}={self.id}"}):
            try:
                container.remove(force=True)
            except Exception:
                pass
        for folder in self._dirs:
            shutil.rmtree(folder, ignore_errors=True)


class DockerHandle:
    """A Docker container standing for a pod's container."""

    def __init__(self, container, log: LogBuffer):
        self.container = container
        self.container_id = f"docker://{container.id}"
        self._code: Optional[int] = None
        self._done = threading.Event()
        self._reader = threading.Thread(target=self._pump, args=(log,), daemon=True)
        self._reader.start()
        threading.Thread(target=self._wait, daemon=True).start()

    def _pump(self, log: LogBuffer) -> None:
        pending = b""
        try:
            for chunk in self.container.logs(stream=True, follow=True):
                pending += chunk
                *lines, pending = pending.split(b"\n")
                for line in lines:
                    log.write(line + b"\n")
        except Exception:
            pass
        if pending:
            log.write(pending)
        log.close()

    def _wait(self) -> None:
        try:
            self._code = int(self.container.wait()["StatusCode"])
        except Exception:
            self._code = 137
        self._reader.join(10)
        try:
            self.container.remove(force=True)
        except Exception:
            pass
        self._done.set()

    def wait(self, timeout=None):
        if not self._done.wait(timeout):
            return None
        return self._code

    def signal(self, sig: int) -> None:
        try:
            self.container.kill(signal=int(sig))
        except Exception:
            pass  # not running any more
