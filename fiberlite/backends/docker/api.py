"""Reaching a Docker engine, the one-line errors users see, and the container this
process runs in (if any).

The daemon is found as the ``docker`` command finds it: ``DOCKER_HOST`` (plus
``DOCKER_TLS_VERIFY`` / ``DOCKER_CERT_PATH``), else ``unix:///var/run/docker.sock``.
"""
from __future__ import annotations

import os
import re
import socket
from dataclasses import dataclass, field
from typing import Any

from ...errors import BackendError

CONNECT_TIMEOUT = 5.0  # seconds: an unreachable or hung daemon fails within seconds
CALL_TIMEOUT = 120.0  # seconds for ordinary calls once connected (a loaded daemon is slow)
DEFAULT_HOST = "unix:///var/run/docker.sock"
CONTAINER_ENV = "FIBERLITE_DOCKER_CONTAINER"  # set in every job container: its own name

_HOSTNAME_MOUNT = re.compile(r"/containers/([0-9a-f]{64})/hostname$")
_SHORT_ID = re.compile(r"^[0-9a-f]{12}$")
_CGROUP = re.compile(r"[/-]docker[-/]([0-9a-f]{64})(?:\.scope)?$")


def daemon_address() -> str:
    return os.environ.get("DOCKER_HOST") or DEFAULT_HOST


def reason(exc: BaseException) -> str:
    """The innermost useful cause of ``exc`` on one line ("No such file or directory")."""
    chain: list[BaseException] = []
    todo = [exc]
    while todo:
        error = todo.pop(0)
        if any(error is seen for seen in chain):
            continue
        chain.append(error)
        # requests/urllib3 keep causes in args or .reason, not only in the chain
        todo += [e for e in (error.__cause__, error.__context__, getattr(error, "reason", None),
                             *getattr(error, "args", ())) if isinstance(e, BaseException)]
    for error in reversed(chain):
        if isinstance(error, TimeoutError) or type(error).__name__.endswith("Timeout"):
            return "no answer (timed out)"
        if isinstance(error, OSError) and error.strerror:
            return error.strerror
    text = str(getattr(exc, "explanation", None) or exc).strip()
    return (text.splitlines()[0] if text else type(exc).__name__)[:300]


def unreachable(address: str, exc: BaseException) -> BackendError:
    return BackendError(f"cannot reach the Docker daemon at {address}: {reason(exc)}; "
                        "start dockerd (or Docker Desktop) or set DOCKER_HOST")


def connect() -> Any:
    """A ``docker.APIClient`` for the configured daemon; :class:`BackendError` if none answers."""
    try:
        import docker
    except ImportError:
        raise BackendError("the docker backend needs the docker package: "
                           "pip install 'fiberlite[docker]'") from None
    address = daemon_address()
    try:
        kwargs = docker.utils.kwargs_from_env()
        # version="auto" asks the daemon for its API version: the reachability check
        api = docker.APIClient(version="auto", timeout=CONNECT_TIMEOUT, max_pool_size=64, **kwargs)
    except docker.errors.TLSParameterError as exc:
        raise BackendError(f"bad Docker TLS settings (DOCKER_TLS_VERIFY, DOCKER_CERT_PATH): {exc}") from None
    except Exception as exc:
        raise unreachable(address, exc) from None
    api.timeout = CALL_TIMEOUT
    return api


def api_error(exc: BaseException, action: str) -> BackendError:
    """A :class:`BackendError` for a failed call: what was attempted and the daemon's reason."""
    import docker
    import requests
    if isinstance(exc, (requests.exceptions.ConnectionError, requests.exceptions.Timeout)):
        return unreachable(daemon_address(), exc)
    if isinstance(exc, docker.errors.APIError):
        text = exc.explanation or str(exc)
        if isinstance(text, bytes):
            text = text.decode(errors="replace")
        return BackendError(f"cannot {action}: {str(text).strip()}")
    return BackendError(f"cannot {action}: {reason(exc)}")


def status_of(exc: BaseException) -> int | None:
    """The HTTP status of a failed Docker API call (None for connection errors)."""
    return getattr(exc, "status_code", None)


# -- the container this process runs in -------------------------------------------------------
@dataclass
class OwnContainer:
    """What children need to know about the container this process runs in."""

    id: str
    image: str  # image id (sha256:...): children run exactly the same image
    network_mode: str
    networks: dict[str, str] = field(default_factory=dict)  # network name -> our IP address
    binds: list[tuple[str, str]] = field(default_factory=list)  # (path here, path on the host)

    @classmethod
    def from_inspect(cls, attrs: dict) -> "OwnContainer":
        settings = attrs.get("NetworkSettings") or {}
        networks = {name: (net or {}).get("IPAddress") or ""
                    for name, net in (settings.get("Networks") or {}).items()}
        binds = [(m["Destination"], m["Source"]) for m in attrs.get("Mounts") or []
                 if m.get("Type") == "bind" and m.get("Source") and m.get("Destination")]
        binds.sort(key=lambda b: len(b[0]), reverse=True)  # deepest first
        return cls(id=attrs["Id"], image=attrs["Image"],
                   network_mode=(attrs.get("HostConfig") or {}).get("NetworkMode") or "default",
                   networks=networks, binds=binds)

    def host_path(self, path: str) -> str | None:
        """``path`` as the Docker host sees it, when it is bind-mounted into this container."""
        for inside, source in self.binds:
            if path == inside or path.startswith(inside.rstrip("/") + "/"):
                return source + path[len(inside):]
        return None

    def address(self) -> str | None:
        """An address of this container that the Docker host can reach."""
        for ip in self.networks.values():
            if ip:
                return ip
        return None


def container_candidates() -> list[str]:
    """Ids or names under which this process's container may be known (best first)."""
    found: list[str] = []
    name = os.environ.get(CONTAINER_ENV)
    if name:
        found.append(name)
    try:
        with open("/proc/self/mountinfo") as fh:
            for line in fh:
                parts = line.split()
                # field 4: root of the mount in its filesystem, field 5: mount point
                if len(parts) > 4 and parts[4] == "/etc/hostname":
                    match = _HOSTNAME_MOUNT.search(parts[3])
                    if match:
                        found.append(match.group(1))
    except OSError:
        pass
    try:
        with open("/proc/self/cgroup") as fh:
            for line in fh:
                match = _CGROUP.search(line.strip())
                if match:
                    found.append(match.group(1))
                    break
    except OSError:
        pass
    hostname = socket.gethostname()  # Docker's default hostname: the short container id
    if _SHORT_ID.match(hostname):
        found.append(hostname)
    return list(dict.fromkeys(found))


def own_container(api: Any) -> OwnContainer | None:
    """The container of this Docker engine that this process runs in, or None."""
    for candidate in container_candidates():
        try:
            return OwnContainer.from_inspect(api.inspect_container(candidate))
        except Exception as exc:
            if status_of(exc) == 404:
                continue  # a container of another engine, or not a container at all
            raise api_error(exc, "inspect the container this process runs in") from None
    return None
