"""From a :class:`JobSpec` to the arguments of Docker's "create container" call.

What a job container gets:

- the working directory (setting ``working_dir``, default the parent's cwd) bind-mounted
  read-write at the same path when the engine runs on this machine (a Unix socket) and
  ``mount_working_dir`` is true (:func:`mounts_working_dir`); otherwise the job gets a
  copy (``fiberlite.runtime.tree``; a master of ``fiberlite run``: :func:`tree_archive`);
- with an engine of this machine, every directory on the parent's ``sys.path`` that is
  not part of Python or an installed package (a source checkout, a tests directory, the
  script's directory) bind-mounted read-only at the same path, so that code pickled by
  reference imports;
- ``JobSpec.volumes`` (an absolute host path is a bind mount, any other name a Docker volume);
- the Docker socket (when the daemon is reached through one), so that a job can start
  jobs of its own; the container runs as the parent's user when that is not root;
- environment: ``JobSpec.env`` (Docker keeps it in the container config, visible to
  ``docker inspect``); ``secret_env`` is not in it: it is copied into the created
  container as a file of its user's only (:func:`secrets_archive`), which the job reads
  and removes before it runs anything;
- resources: ``cpu`` -> ``NanoCpus``, ``memory`` -> ``Memory``, ``gpu`` -> a device request
  for that many GPUs (needs the NVIDIA Container Toolkit on the host);
- ``init`` (a tiny init as PID 1 forwards signals, so SIGTERM stops the job) and
  ``auto_remove`` (the engine removes the container when it exits, even if the parent
  was killed).

When the parent itself runs in a container, paths are translated to the host paths its
own bind mounts come from (paths not bind-mounted from the host are not mounted: the
children run the same image).
"""
from __future__ import annotations

import io
import os
import re
import site
import stat
import sys
import sysconfig
import tarfile
import threading
from dataclasses import dataclass, field
from typing import Any, Callable

from ...errors import BackendError
from ..base import (SECRETS_FILE_ENV, TREE_DIGEST_ENV, TREE_ENV, TREE_PART_NAME, TREE_PARTS_ENV,
                    JobSpec, TreeArchive, encode_secrets)
from .api import CONTAINER_ENV, OwnContainer

SOCKET_PATH = "/var/run/docker.sock"
SECRETS_DIR = "/.fiberlite-secrets"  # made by the archive in the container's own root, never a mount
SECRETS_FILE = "secrets"
TREE_DIR = "/.fiberlite-tree"  # a master's packed working directory (JobSpec.tree), copied in
_NAME_BAD = re.compile(r"[^a-zA-Z0-9_.-]")


@dataclass
class Mount:
    source: str  # host path, or volume name
    target: str
    read_only: bool = False
    kind: str = "bind"  # or "volume"


@dataclass
class ContainerConfig:
    """Everything ``create_container`` needs, in plain data (easy to check in tests)."""

    image: str
    command: list[str]
    name: str
    environment: dict[str, str]
    labels: dict[str, str]
    working_dir: str | None
    network: str
    mounts: list[Mount] = field(default_factory=list)
    user: str | None = None
    group_add: list[str] = field(default_factory=list)
    nano_cpus: int | None = None
    mem_limit: int | None = None
    gpus: int | None = None

    def create_kwargs(self, api: Any) -> dict[str, Any]:
        """Keyword arguments of ``docker.APIClient.create_container``."""
        from docker.types import DeviceRequest
        from docker.types import Mount as DockerMount
        host_config: dict[str, Any] = dict(
            network_mode=self.network, auto_remove=True, init=True,
            mounts=[DockerMount(m.target, m.source, type=m.kind, read_only=m.read_only)
                    for m in self.mounts])
        if self.nano_cpus:
            host_config["nano_cpus"] = self.nano_cpus
        if self.mem_limit:
            host_config["mem_limit"] = self.mem_limit
        if self.gpus:
            host_config["device_requests"] = [DeviceRequest(count=self.gpus, capabilities=[["gpu"]])]
        if self.group_add:
            host_config["group_add"] = self.group_add
        kwargs: dict[str, Any] = dict(
            image=self.image, command=self.command, name=self.name, environment=self.environment,
            labels=self.labels, detach=True, stdin_open=False, tty=False,
            host_config=api.create_host_config(**host_config))
        if self.working_dir:
            kwargs["working_dir"] = self.working_dir
        if self.user:
            kwargs["user"] = self.user
        return kwargs


def container_name(job_name: str) -> str:
    """A valid container name made of the job name (``[a-zA-Z0-9][a-zA-Z0-9_.-]*``)."""
    name = _NAME_BAD.sub("-", job_name).lstrip("_.-") or "fiberlite-job"
    return name[:200]


def _inside(path: str, folder: str) -> bool:
    folder = folder.rstrip("/") or "/"
    return folder == "/" or path == folder or path.startswith(folder + "/")


# directories of the operating system: never mounted, a mount there would hide the image's
_SYSTEM = ("/bin", "/boot", "/dev", "/etc", "/lib", "/lib32", "/lib64", "/libx32", "/proc",
           "/run", "/sbin", "/sys", "/usr", "/var/lib", "/var/run")
_SYSTEM_EXCEPTIONS = ("/usr/src", "/usr/local/src")


def system_dir(path: str) -> bool:
    """True for a directory of the operating system (``/usr/bin``, ``/etc``...)."""
    if path == "/":
        return True
    if any(_inside(path, d) for d in _SYSTEM_EXCEPTIONS):
        return False
    return any(_inside(path, d) for d in _SYSTEM)


_python_dirs_lock = threading.Lock()  # sysconfig fills its caches unlocked: one thread at a time
_python_dirs_found: list[str] | None = None


def _python_dirs() -> list[str]:
    """Directories of the Python installation: the interpreter, its library, installed
    packages (found once: jobs may be made from several threads at the same time)."""
    global _python_dirs_found
    with _python_dirs_lock:
        if _python_dirs_found is None:
            _python_dirs_found = _find_python_dirs()
        return list(_python_dirs_found)


def _find_python_dirs() -> list[str]:
    dirs: set[str] = {os.path.dirname(sys.executable)}
    for prefix in (sys.prefix, sys.base_prefix, sys.exec_prefix, sys.base_exec_prefix):
        if prefix and not system_dir(prefix) and prefix != "/usr/local":
            dirs.add(prefix)  # a venv, pyenv or conda installation: all of it
    for key in ("stdlib", "platstdlib", "purelib", "platlib", "scripts"):
        try:
            dirs.add(sysconfig.get_path(key))
        except KeyError:
            pass
    try:
        dirs.update(site.getsitepackages())
    except AttributeError:
        pass
    user_site = getattr(site, "USER_SITE", None)
    if user_site:
        dirs.add(user_site)
    return sorted({os.path.realpath(d) for d in dirs if d and d != "/"})


def code_dirs(path_entries: list[str]) -> list[str]:
    """The ``sys.path`` entries to mount: existing directories that hold the user's code
    (not Python's, not installed packages', not the operating system's)."""
    python = _python_dirs()
    found: list[str] = []
    for entry in path_entries:
        if not entry:
            continue  # the cwd: the working directory mount covers it
        path = os.path.abspath(entry)
        if not os.path.isdir(path) or system_dir(path):
            continue  # zip files, missing entries, /usr/...
        parts = path.split(os.sep)
        if "site-packages" in parts or "dist-packages" in parts:
            continue
        real = os.path.realpath(path)
        if system_dir(real) or any(_inside(real, d) for d in python):
            continue
        found.append(path)
    # a directory inside another one is mounted with it
    return [p for i, p in enumerate(found)
            if p not in found[:i] and not any(o != p and _inside(p, o) for o in found)]


def _is_unix(base_url: str) -> bool:
    return base_url.startswith("http+docker://localhost")  # docker-py's name for a unix socket


def _socket_mount(base_url: str, host_path: Callable[[str], str | None]) -> tuple[Mount | None, str | None]:
    """The Docker socket mount (and its group) when the daemon is reached through one."""
    if not _is_unix(base_url):
        return None, None
    local = os.environ.get("DOCKER_HOST", "unix://" + SOCKET_PATH)
    local = local[len("unix://"):] if local.startswith("unix://") else SOCKET_PATH
    source = host_path(local)
    if source is None:
        return None, None
    try:
        gid = str(os.stat(local).st_gid) if stat.S_ISSOCK(os.stat(local).st_mode) else None
    except OSError:
        gid = None
    return Mount(source, SOCKET_PATH), gid


def build(spec: JobSpec, image: str, network: str, settings: dict[str, Any],
          own: OwnContainer | None = None, base_url: str = "http+docker://localhost",
          path_entries: list[str] | None = None) -> ContainerConfig:
    """The container for ``spec``; ``settings`` are fiberlite's resolved settings."""
    def host_path(path: str) -> str | None:
        return path if own is None else own.host_path(path)

    mounts: list[Mount] = []
    targets: set[str] = set()

    def add(mount: Mount) -> None:
        if mount.target not in targets:
            targets.add(mount.target)
            mounts.append(mount)

    chosen = settings.get("working_dir")
    working_dir = os.path.abspath(os.path.expanduser(chosen or spec.cwd or os.getcwd()))
    local = _is_unix(base_url)
    mounted_work = False
    if chosen is not False and local and settings.get("mount_working_dir", True):
        source = host_path(working_dir)
        if source is not None:
            if system_dir(working_dir):
                raise BackendError(
                    f"the working directory is {working_dir}, a system directory that cannot be "
                    "mounted into job containers: set working_dir to your project's directory "
                    "(FIBERLITE_WORKING_DIR), or working_dir=off")
            add(Mount(source, working_dir))
            mounted_work = True
    # a remote engine has none of this machine's paths; a working directory that is not
    # mounted travels as a copy, its code with it
    for path in code_dirs(sys.path if path_entries is None else path_entries) if local else ():
        if chosen is not False and _inside(path, working_dir):
            continue
        source = host_path(path)
        if source is not None:
            add(Mount(source, path, read_only=True))
    for source, target in spec.volumes.items():
        if os.path.isabs(source):
            translated = host_path(source)
            if translated is None:
                raise BackendError(f"volume {source}:{target} of job {spec.name}: {source} is not a "
                                   "path of the Docker host (this process runs in a container "
                                   "that does not bind-mount it)")
            add(Mount(translated, target))
        else:
            add(Mount(source, target, kind="volume"))
    socket, socket_gid = _socket_mount(base_url, host_path)
    if socket is not None:
        add(socket)

    cwd = spec.cwd or working_dir
    in_mount = any(m.kind == "bind" and _inside(cwd, m.target) for m in mounts)
    environment = dict(spec.env)
    if spec.secret_env:
        environment[SECRETS_FILE_ENV] = f"{SECRETS_DIR}/{SECRETS_FILE}"
    if spec.tree is not None:
        environment[TREE_PARTS_ENV] = TREE_DIR
        environment[TREE_DIGEST_ENV] = spec.tree.digest
    name = container_name(spec.name)
    environment[CONTAINER_ENV] = name
    if not _is_unix(base_url):  # a TCP daemon: tell the job where it is (certificates: volumes)
        for var in ("DOCKER_HOST", "DOCKER_TLS_VERIFY", "DOCKER_CERT_PATH"):
            if os.environ.get(var):
                environment.setdefault(var, os.environ[var])

    user, group_add = None, []
    if hasattr(os, "getuid") and os.getuid() != 0:
        # files the job writes into the mounted working directory belong to the user
        user = f"{os.getuid()}:{os.getgid()}"
        environment.setdefault("HOME", "/tmp")
        if socket_gid is not None:
            group_add.append(socket_gid)

    labels = dict(spec.labels)
    labels["fiberlite"] = "1"
    return ContainerConfig(
        image=image, command=list(spec.command), name=name, environment=environment,
        labels=labels, working_dir=cwd if in_mount else None, network=network, mounts=mounts,
        user=user, group_add=group_add,
        nano_cpus=int(round(spec.cpu * 1e9)) if spec.cpu else None,
        mem_limit=int(spec.memory) if spec.memory else None,
        gpus=int(spec.gpu) if spec.gpu else None)


def mounts_working_dir(settings: dict[str, Any], own: OwnContainer | None, base_url: str) -> bool:
    """True when :func:`build` bind-mounts the working directory: on, ``mount_working_dir``,
    an engine of this machine, and a path the engine's host has."""
    if settings.get("working_dir") is False or not settings.get("mount_working_dir", True):
        return False
    if not _is_unix(base_url):
        return False
    chosen = settings.get("working_dir")
    working_dir = os.path.abspath(os.path.expanduser(chosen or os.getcwd()))
    return own is None or own.host_path(working_dir) is not None


def sees_working_dir(settings: dict[str, Any], own: OwnContainer | None, base_url: str) -> bool:
    """True when job containers see the working directory as it is here: bind-mounted,
    or (this process runs in a container whose working directory came with its image,
    not sent to it) the same image."""
    return (mounts_working_dir(settings, own, base_url)
            or (own is not None and not os.environ.get(TREE_ENV)))


def _private_archive(folder: str, files: dict[str, bytes], user: str | None) -> bytes:
    """A tar of ``folder`` (0700) holding ``files`` (0600), all owned by the container's
    ``user`` ("uid:gid", root when None), for ``put_archive`` at ``/`` before it starts."""
    directory = tarfile.TarInfo(folder.lstrip("/"))
    directory.type, directory.mode = tarfile.DIRTYPE, 0o700
    members = [(directory, None)]
    for name, data in files.items():
        member = tarfile.TarInfo(f"{directory.name}/{name}")
        member.size, member.mode = len(data), 0o600
        members.append((member, data))
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w") as archive:
        for entry, data in members:
            if user:
                uid, _, gid = user.partition(":")
                entry.uid, entry.gid = int(uid), int(gid or 0)
            archive.addfile(entry, None if data is None else io.BytesIO(data))
    return buffer.getvalue()


def secrets_archive(secret_env: dict[str, str], user: str | None) -> bytes:
    """:data:`SECRETS_DIR` holding one file with ``secret_env``, readable (and removable)
    by the container's user only; the job reads and removes it before it runs anything."""
    return _private_archive(SECRETS_DIR, {SECRETS_FILE: encode_secrets(secret_env)}, user)


def tree_archive(tree: TreeArchive, user: str | None) -> bytes:
    """:data:`TREE_DIR` holding the packed working directory as one part."""
    return _private_archive(TREE_DIR, {TREE_PART_NAME.format(0): tree.data}, user)
