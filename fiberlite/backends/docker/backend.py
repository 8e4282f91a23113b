"""The docker backend: every job a container, through the Docker SDK (``docker``).

- Image: ``JobSpec.image`` (``@meta(image=...)`` or the ``image`` setting), else the
  image of the container this process runs in; neither is a :class:`BackendError`.
- Code and data: with an engine of this machine, the working directory and the user's
  ``sys.path`` directories are bind-mounted at the same paths (see :mod:`.spec`); with
  a remote engine (or ``mount_working_dir`` false) jobs get a copy of the working
  directory instead.
- Network: ``docker_network`` = ``host`` (default; jobs reach their parent on
  127.0.0.1) or the name of a Docker network (jobs reach a parent on the host through
  the network's gateway, a parent in a container through its address on the network).
- State: one ``docker events`` stream (die / destroy / oom of the run's containers)
  feeds a cache; :meth:`DockerBackend.wait` waits on a condition and never polls.
  Exit status 128+N (a signal killed the job) is reported as ``-N``.
- Output: a thread per container copies its stdout/stderr to this process's as it
  comes; :meth:`DockerBackend.logs` returns it.
- Clean-up: containers are created with ``auto_remove`` (the engine removes them when
  they exit, even when the parent was killed: jobs exit when their parent's connection
  drops); :func:`clean` removes leftovers by label.
"""
from __future__ import annotations

import logging
import os
import re
import secrets
import socket
import threading
import time
from dataclasses import dataclass, field
from typing import Any, Iterator, Sequence

from ... import config
from ...errors import BackendError
from ...units import format_memory
from . import spec as docker_spec
from ..base import (JOB_LABEL, RUN_LABEL, WATCHED_LABELS, Backend, Job, JobSpec, JobState,
                    build_with_docker, decode_stream, exit_code)
from .api import (CONTAINER_ENV, OwnContainer, api_error, connect, container_candidates,
                  own_container, status_of)
from .network import container_usage, gateway
from .watch import EventWatcher, OutputPump

log = logging.getLogger("fiberlite.docker")

NETWORK_ENV = "FIBERLITE_DOCKER_CONTAINER_NETWORK"  # the network a job container was put on
OUTPUT_GRACE = 5.0  # seconds a finished job's output may trail its exit event
_EXITED = re.compile(r"Exited \((-?\d+)\)")
_UNSET: Any = object()


@dataclass(eq=False)
class ContainerJob:
    """What the backend knows about one job's container (``Job.handle``)."""

    id: str
    name: str
    exitcode: int | None = None
    died_at: float | None = None
    gone: bool = False
    oom: bool = False
    memory: int | None = None
    pump: OutputPump | None = None
    cleaned: bool = False
    created: float = field(default_factory=time.monotonic)


class DockerBackend(Backend):
    """Jobs are containers of one Docker engine (``DOCKER_HOST`` or the local socket)."""

    name = "docker"
    delivers_tree = True

    def __init__(self) -> None:
        self._api: Any = None
        self._own: Any = _UNSET
        self._lock = threading.Lock()
        self._cond = threading.Condition()
        self._jobs: dict[str, ContainerJob] = {}
        self._watchers: dict[tuple, EventWatcher] = {}
        self._networks: dict[str, dict] = {}

    # -- connection and this process's own container ----------------------------------------
    def _client(self) -> Any:
        if self._api is None:
            with self._lock:
                if self._api is None:
                    self._api = connect()
        return self._api

    def own_container(self) -> OwnContainer | None:
        """The container this process runs in (on this engine), or None."""
        if self._own is _UNSET:
            if not container_candidates():
                self._own = None
            else:
                api = self._client()
                with self._lock:
                    if self._own is _UNSET:
                        self._own = own_container(api)
        return self._own

    def preflight(self) -> None:
        """Reach the engine (and the named network) now: their errors come first."""
        self._client()
        network = config.get("docker_network")
        if network != "host":
            self._network(network)

    def shares_working_dir(self) -> bool:
        return docker_spec.sees_working_dir(config.settings(), self.own_container(),
                                            self._client().base_url)

    # -- where children reach this process --------------------------------------------------
    def listen_host(self) -> str:
        network = config.get("docker_network")
        if os.environ.get(CONTAINER_ENV) and os.environ.get(NETWORK_ENV) == network:
            # a job container made by fiberlite: its network is known without asking the engine
            if network == "host":
                return "127.0.0.1"
            try:
                address = socket.gethostbyname(socket.gethostname())
                if not address.startswith("127."):
                    return address
            except OSError:
                pass
        own = self.own_container()
        if network == "host":
            if own is None or own.network_mode == "host":
                return "127.0.0.1"
            return own.address() or "127.0.0.1"  # the host reaches a container's bridge address
        if own is not None and own.networks.get(network):
            return own.networks[network]
        if own is not None and own.network_mode != "host":
            raise BackendError(
                f"this process runs in container {own.id[:12]}, which is not on Docker network "
                f"{network!r}: its jobs could not reach it; connect it with `docker network "
                f"connect {network} {own.id[:12]}`, or set docker_network to its network")
        return self._gateway(network)  # the host's side of the network reaches this process

    def _network(self, network: str) -> dict:
        """What the engine says about network ``network`` (a BackendError if it does not exist)."""
        if network not in self._networks:
            try:
                self._networks[network] = self._client().inspect_network(network)
            except Exception as exc:
                if status_of(exc) == 404:
                    raise BackendError(
                        f"Docker network {network!r} does not exist on this Docker host: create it "
                        f"with `docker network create {network}`, or set docker_network=host") from None
                raise api_error(exc, f"inspect Docker network {network!r}") from None
        return self._networks[network]

    def _gateway(self, network: str) -> str:
        """The host's address on Docker network ``network`` (a BackendError if it has none)."""
        return gateway(self._network(network), network)

    # -- creating jobs ---------------------------------------------------------------------
    def create_job(self, spec: JobSpec) -> Job:
        self.check_options(spec)
        api = self._client()
        own = self.own_container()
        image = spec.image or (own.image if own is not None else None)
        if not image:
            raise BackendError(
                f"no container image for job {spec.name}: set the image setting "
                "(FIBERLITE_IMAGE=..., fiberlite.init(image=...)) or @fiberlite.meta(image=...); "
                "build one with `docker build -t fiberlite .` (the project's Dockerfile)")
        settings = config.settings()
        network = settings["docker_network"]
        if network != "host":
            self._network(network)  # it must exist (a clear error otherwise)
        conf = docker_spec.build(spec, image, network, settings, own, api.base_url)
        conf.environment[NETWORK_ENV] = network
        self._watch(spec.labels)
        cid, name = self._create(api, conf, spec)
        job = ContainerJob(cid, name, memory=conf.mem_limit)
        with self._cond:
            self._jobs[cid] = job  # before start: its die event cannot come before
        try:
            if spec.secret_env:
                api.put_archive(cid, "/",
                                docker_spec.secrets_archive(spec.secret_env, conf.user))
            if spec.tree is not None:
                api.put_archive(cid, "/", docker_spec.tree_archive(spec.tree, conf.user))
            sock = api.attach_socket(cid, params={"stdout": 1, "stderr": 1, "stream": 1, "logs": 1})
            job.pump = OutputPump(sock, name, self._notify)
            job.pump.start()
            api.start(cid)
        except Exception as exc:
            self._discard(job)
            error = api_error(exc, f"start the container of job {spec.name} (image {image!r})")
            if spec.gpu and "gpu" in str(error).lower():
                error = BackendError(f"{error} (GPUs need the NVIDIA Container Toolkit on the Docker host)")
            raise error from None
        pid = None
        try:
            pid = api.inspect_container(cid)["State"]["Pid"] or None
        except Exception:
            pass  # only for display: Process.pid
        return Job(self, cid, spec, pid=pid, handle=job)

    def _create(self, api: Any, conf: docker_spec.ContainerConfig, spec: JobSpec) -> tuple[str, str]:
        import docker
        name = conf.name
        for attempt in range(4):
            conf.name = name
            conf.environment[CONTAINER_ENV] = name
            try:
                created = api.create_container(**conf.create_kwargs(api))
                return created["Id"], name
            except docker.errors.ImageNotFound:
                raise BackendError(
                    f"image {conf.image!r} is not present on this Docker host: build it with "
                    f"`docker build -t {conf.image} .` (the project's Dockerfile), pull it, "
                    "or set `image`") from None
            except Exception as exc:
                if status_of(exc) == 409 and attempt < 3:  # the name is taken: add a suffix
                    name = f"{conf.name[:190]}-{secrets.token_hex(2)}"
                    continue
                raise api_error(exc, f"create a container for job {spec.name}") from None
        raise AssertionError("unreachable")

    def _watch(self, labels: dict[str, str]) -> None:
        watched = {k: v for k, v in labels.items() if k in WATCHED_LABELS} or {"fiberlite": "1"}
        key = tuple(sorted(watched.items()))
        api = self._client()
        with self._lock:
            watcher = self._watchers.get(key)
            if watcher is not None and watcher.alive:
                return
            watcher = EventWatcher(api, watched, self._on_event,
                                   lambda: self._after_reconnect(watched))
            try:
                watcher.start()
            except Exception as exc:
                raise api_error(exc, "follow Docker events") from None
            self._watchers[key] = watcher

    def _discard(self, job: ContainerJob) -> None:
        """Forget a job whose container could not start, and remove the container."""
        with self._cond:
            self._jobs.pop(job.id, None)
        if job.pump is not None:
            job.pump.close()
        try:
            self._client().remove_container(job.id, force=True)
        except Exception:
            pass

    # -- following jobs --------------------------------------------------------------------
    def _notify(self) -> None:
        with self._cond:
            self._cond.notify_all()

    def _on_event(self, event: dict) -> None:
        action = event.get("Action") or event.get("status")
        actor = event.get("Actor") or {}
        cid = actor.get("ID") or event.get("id")
        attrs = actor.get("Attributes") or {}
        warn = None
        with self._cond:
            job = self._jobs.get(cid)
            if job is None:
                return
            if action == "oom":
                job.oom = True
            elif action == "die" and job.exitcode is None:
                try:
                    job.exitcode = exit_code(int(attrs.get("exitCode", "")))
                except ValueError:
                    job.exitcode = -9
                job.died_at = time.monotonic()
                if job.oom:
                    warn = (f"job {job.name} was killed: out of memory"
                            + (f" (memory limit {format_memory(job.memory)})" if job.memory else ""))
            elif action == "destroy":
                job.gone = True
                if job.exitcode is None:
                    warn = self._lost(job)
            self._cond.notify_all()
        if warn:
            log.warning(warn)

    def _lost(self, job: ContainerJob) -> str:
        job.exitcode = -9
        job.died_at = time.monotonic()
        return f"the container of job {job.name} is gone and its exit code was not seen; reporting -9"

    def _after_reconnect(self, labels: dict[str, str]) -> None:
        """After the events stream reconnected (and replayed what it could): settle jobs
        whose containers ended while nobody listened."""
        def settle() -> None:
            try:
                listed = self._client().containers(all=True, filters={
                    "label": [f"{k}={v}" for k, v in labels.items()]})
            except Exception as exc:
                log.debug("listing containers after a reconnect failed: %s", exc)
                return
            states = {c["Id"]: c for c in listed}
            warnings = []
            with self._cond:
                for job in self._jobs.values():
                    if job.exitcode is not None:
                        continue
                    seen = states.get(job.id)
                    if seen is None:
                        job.gone = True
                        warnings.append(self._lost(job))
                    elif seen.get("State") in ("exited", "dead"):
                        match = _EXITED.search(seen.get("Status") or "")
                        job.exitcode = exit_code(int(match.group(1))) if match else -9
                        job.died_at = time.monotonic()
                self._cond.notify_all()
            for warning in warnings:
                log.warning(warning)
        timer = threading.Timer(2.0, settle)  # after the replayed events
        timer.daemon = True
        timer.start()

    def status(self, job: Job) -> JobState:
        return JobState.RUNNING if job.handle.exitcode is None else JobState.EXITED

    def _finished(self, job: ContainerJob, now: float) -> float | None:
        """0 when ``job`` is over (exit code seen, output drained), else seconds to re-check
        (None: until notified)."""
        if job.exitcode is None:
            return None
        if job.pump is None or job.pump.done:
            return 0.0
        return max(0.0, job.died_at + OUTPUT_GRACE - now)

    def wait(self, job: Job, timeout: float | None = None) -> int | None:
        cj: ContainerJob = job.handle
        deadline = None if timeout is None else time.monotonic() + max(timeout, 0.0)
        with self._cond:
            while True:
                now = time.monotonic()
                left = self._finished(cj, now)
                if left == 0.0:
                    return cj.exitcode
                if deadline is not None and now >= deadline:
                    return None
                pause = [t for t in (left, None if deadline is None else deadline - now) if t is not None]
                self._cond.wait(min(pause) if pause else None)

    def terminate(self, job: Job, force: bool = False) -> None:
        cj: ContainerJob = job.handle
        if cj.exitcode is not None:
            return
        try:
            self._client().kill(cj.id, signal="SIGKILL" if force else "SIGTERM")
        except Exception as exc:
            if status_of(exc) in (404, 409):  # gone, or not running any more
                return
            raise api_error(exc, f"stop the container of job {cj.name}") from None

    def sample(self, job: Job, forked: Sequence[int] = ()) -> tuple[float, int] | None:
        """From one engine stats call (a container's figures include what it forked)."""
        return container_usage(self._client(), job.id)

    def location(self, job: Job) -> str | None:
        return f"{socket.gethostname()} (container {job.id[:12]})"

    def logs(self, job: Job) -> str:
        cj: ContainerJob = job.handle
        return cj.pump.text() if cj.pump is not None else ""

    def cleanup(self, job: Job) -> None:
        """Remove the container (normally the engine already did: ``auto_remove``)."""
        cj: ContainerJob = job.handle
        if cj.cleaned:
            return
        cj.cleaned = True
        if cj.pump is not None and not cj.pump.done:
            cj.pump.close()
        if not cj.gone:
            try:
                self._client().remove_container(cj.id, force=True)
                cj.gone = True
            except Exception as exc:
                status = status_of(exc)
                if status == 404:
                    cj.gone = True
                elif status == 409:  # the engine is removing it: wait for that to finish
                    with self._cond:
                        self._cond.wait_for(lambda: cj.gone, 10)
                else:
                    log.debug("removing container %s failed: %s", cj.name, exc)
        with self._cond:
            self._jobs.pop(cj.id, None)

    def close(self) -> None:
        with self._lock:
            watchers, self._watchers = list(self._watchers.values()), {}
        for watcher in watchers:
            watcher.close()

    # -- for the command line ---------------------------------------------------------------
    def _containers(self, labels: dict[str, str]) -> list[dict]:
        api = self._client()
        try:
            return api.containers(all=True, filters={"label": [f"{k}={v}" for k, v in labels.items()]})
        except Exception as exc:
            raise api_error(exc, "list containers") from None

    def list_jobs(self, run_id: str | None = None) -> list[tuple[str, str, str]]:
        labels = {"fiberlite": "1"}
        if run_id:
            labels[RUN_LABEL] = run_id
        rows = []
        for c in self._containers(labels):
            tags = c.get("Labels") or {}
            name = tags.get(JOB_LABEL) or (c.get("Names") or ["?"])[0].lstrip("/")
            rows.append((name, tags.get(RUN_LABEL, "?"), _state(c)))
        return rows

    def cleanup_run(self, run_id: str | None = None) -> int:
        return _remove(self._client(), run_id)

    def build_image(self, tag: str, context: str) -> None:
        build_with_docker(tag, context)

    def stream_logs(self, job_name: str, follow: bool = False) -> Iterator[str]:
        with self._cond:
            mine = [j for j in self._jobs.values()
                    if job_name in (j.name, j.id) or (len(job_name) >= 12 and j.id.startswith(job_name))]
        if mine and mine[0].pump is not None:
            pump = mine[0].pump
            if follow:
                return pump.take_over()  # its output goes to the reader, not to the terminal
            return iter([pump.text()])
        api = self._client()
        found = self._containers({JOB_LABEL: job_name})
        cid = found[0]["Id"] if found else None
        if cid is None:
            try:
                attrs = api.inspect_container(job_name)
            except Exception as exc:
                if status_of(exc) == 404:
                    raise LookupError(f"no Docker container of job {job_name}") from None
                raise api_error(exc, f"find the container of job {job_name}") from None
            if (attrs.get("Config", {}).get("Labels") or {}).get("fiberlite") != "1":
                raise LookupError(f"container {job_name} is not a fiberlite job")
            cid = attrs["Id"]
        return _decoded(api, cid, follow)


def _state(c: dict) -> str:
    state = c.get("State") or ""
    if state == "created":
        return "pending"
    if state in ("exited", "dead"):
        match = _EXITED.search(c.get("Status") or "")
        return f"exited (code {match.group(1)})" if match else "exited"
    if state == "running":
        return "running"
    return f"running ({state})"


def _decoded(api: Any, cid: str, follow: bool) -> Iterator[str]:
    try:
        chunks = api.logs(cid, stream=True, follow=follow)
    except Exception as exc:
        if status_of(exc) == 404:
            raise LookupError(f"container {cid[:12]} is gone") from None
        raise api_error(exc, f"read the output of container {cid[:12]}") from None
    yield from decode_stream(chunks)


def _remove(api: Any, run_id: str | None) -> int:
    filters = {"label": ["fiberlite=1"] + ([f"{RUN_LABEL}={run_id}"] if run_id else [])}
    try:
        found = api.containers(all=True, filters=filters)
    except Exception as exc:
        raise api_error(exc, "list containers") from None
    removed = 0
    for c in found:
        try:
            api.remove_container(c["Id"], force=True)
            removed += 1
        except Exception as exc:
            if status_of(exc) in (404, 409):  # gone, or already being removed
                removed += 1
                continue
            raise api_error(exc, f"remove container {c['Id'][:12]}") from None
    return removed


def clean(run_id: str | None = None) -> int:
    """Stop and remove the containers of run ``run_id`` (of every fiberlite run when None)
    on the configured Docker engine; returns how many were removed."""
    return _remove(connect(), run_id)
