"""The kubernetes backend: every job a pod, through the official ``kubernetes`` client.

:class:`KubernetesBackend` keeps one :class:`~fiberlite.backends.kubernetes.session.Session`
per cluster configuration (kubeconfig and namespace settings), which creates and follows
the jobs; the backend hands each job's calls to its session and answers the command
line (``fiberlite run``, ``ps``, ``clean``, ``logs``) itself.

- A job is a pod (``restartPolicy: Never``) labelled with its run, name and parent;
  when this process runs in a pod, children get an ownerReference to it (Kubernetes
  deletes them when it goes), its image (unless ``image`` is set), service account,
  shared volumes and environment (see :mod:`.pods`).
- The run's key travels in a Secret (``secretKeyRef``), never in the pod spec; the
  Secret is owned by the master pod when there is one and deleted when the backend
  closes (at exit).
- Job state comes from one watch per label selector (:mod:`.watch`) into a cache;
  ``wait`` waits on a condition, never polls the API.
- A pod that can never start (unschedulable, image pull failure, bad container
  config), that is evicted or deleted ends its job with an exit code and a logged
  reason within seconds (:mod:`.status` says which code).
- When a job ends, its pod's log is copied to this process's stdout (a pod's output
  is not a terminal) and the pod is deleted.
- Working directory: a job started from outside the cluster, or from a pod that runs in
  a working directory sent to it, gets a copy from its creator (``fiberlite.runtime.tree``);
  the master pod of ``fiberlite run`` gets it in ConfigMaps owned by it (``JobSpec.tree``).
"""
from __future__ import annotations

import logging
import os
import sys
import threading
from typing import Any, Iterator
from urllib.parse import urlsplit

from ... import config
from ...errors import BackendError
from ...wire.binding import routed_address
from ..base import (RUN_LABEL, TREE_ENV, Backend, Job, JobSpec, JobState, MasterRun,
                    build_with_docker, decode_stream)
from .api import TIMEOUT, api_error, connect, is_status
from .pods import label_value
from .session import Session
from .status import describe, job_state, start_problem

log = logging.getLogger("fiberlite.kubernetes")

FOLLOW_READ_TIMEOUT = 7 * 24 * 3600  # a followed log may stay silent for long


class KubernetesBackend(Backend):
    """Jobs are pods; see the module docstring."""

    name = "kubernetes"
    delivers_tree = True
    job_options = {"service_account": "the pod's service account (fiberlite run --service-account: "
                                      "the master's; its jobs get the same)"}

    def __init__(self) -> None:
        self._sessions: dict[tuple, Session] = {}
        self._lock = threading.Lock()

    def _session(self) -> Session:
        """The session for the current settings (a new one when kubeconfig/namespace change)."""
        key = (config.get("kubeconfig"), config.get("namespace"))
        with self._lock:
            session = self._sessions.get(key)
            if session is None or session.closed:
                session = self._sessions[key] = Session(connect(*key))
                for other_key, other in list(self._sessions.items()):
                    if other is not session and not other.jobs:
                        del self._sessions[other_key]
                        other.close()
            return session

    # -- the seam ---------------------------------------------------------------------------
    def create_job(self, spec: JobSpec) -> Job:
        """Create the job's pod (option ``service_account``: the pod's, e.g. a master pod's)."""
        self.check_options(spec)
        return self._session().create_job(self, spec, spec.options.get("service_account"))

    def location(self, job: Job) -> str | None:
        """The pod's node, once it is scheduled."""
        pod = getattr(job.handle, "pod", None)
        return getattr(getattr(pod, "spec", None), "node_name", None) or "(not scheduled)"

    def status(self, job: Job) -> JobState:
        return job.handle.session.status(job.handle)

    def wait(self, job: Job, timeout: float | None = None) -> int | None:
        return job.handle.session.wait(job.handle, timeout)

    def terminate(self, job: Job, force: bool = False) -> None:
        job.handle.session.terminate(job.handle, force)

    def logs(self, job: Job) -> str:
        return job.handle.session.logs(job.handle)

    def cleanup(self, job: Job) -> None:
        session = job.handle.session
        session.cleanup(job.handle)
        with self._lock:
            if not session.jobs and session not in self._sessions.values():
                session.close()

    def preflight(self) -> None:
        """Load the cluster configuration now: its absence is a clear error at start()."""
        self._session()

    def shares_working_dir(self) -> bool:
        """In a pod whose working directory came with its image, children run the same
        image there; anywhere else (a laptop, a working directory sent to the pod) they
        need a copy."""
        return not os.environ.get(TREE_ENV) and self._session().master() is not None

    # -- for ``fiberlite run`` ----------------------------------------------------------------
    def run_master(self, run: MasterRun) -> int:
        """The master pod's jobs go to this command's namespace, wherever it came from."""
        namespace = config.get("namespace")
        if namespace:
            run.spec.env.setdefault("FIBERLITE_NAMESPACE", namespace)
        return super().run_master(run)

    def open_page(self, job: Job, address: tuple[str, int]) -> Any:
        """How to open the page with kubectl, and a local door to it through the API
        server's pod proxy when the pod serves it beyond its loopback."""
        from . import page
        sys.stderr.write(page.hint(self, self._session().namespace, job.id, address))
        door = page.forward(self, job.id, address)
        if door is not None:
            sys.stderr.write(f"fiberlite: the master's page, through the API server: {door.url}\n")
        return door

    def build_image(self, tag: str, context: str) -> None:
        """Built with this machine's Docker engine (for a cluster that uses its images)."""
        build_with_docker(tag, context)

    def pod_proxy_url(self, pod: str, port: int) -> str:
        """The API server's proxy address of ``port`` on ``pod`` (opened with the user's
        credentials, e.g. through ``kubectl proxy``)."""
        session = self._session()
        return (f"{session.conn.host.rstrip('/')}/api/v1/namespaces/{session.namespace}/pods/"
                f"{pod}:{port}/proxy/")

    def pod_proxy_get(self, pod: str, port: int, path: str) -> tuple[int, str, bytes]:
        """GET ``path`` of ``port`` on ``pod`` through the API server's pod proxy, with this
        configuration's credentials: the status, content type and body of the answer."""
        session = self._session()
        client = session.api.api_client
        resource = f"/api/v1/namespaces/{session.namespace}/pods/{pod}:{port}/proxy{path}"
        if not hasattr(client, "param_serialize"):  # clients before the 2025 generator
            from kubernetes.client.rest import ApiException
            try:
                answer = client.call_api(resource, "GET", header_params={"Accept": "*/*"},
                                         auth_settings=["BearerToken"], _preload_content=False,
                                         _return_http_data_only=True, _request_timeout=TIMEOUT)
            except ApiException as refused:  # these clients raise on any status but 2xx
                kind = (refused.headers or {}).get("Content-Type", "")
                return refused.status, kind, refused.body or b""
            return answer.status, answer.headers.get("Content-Type", ""), answer.data
        method, url, headers, body, post = client.param_serialize(
            "GET", resource, header_params={"Accept": "*/*"}, auth_settings=["BearerToken"])
        answer = client.call_api(method, url, headers, body, post, _request_timeout=TIMEOUT)
        return answer.status, answer.getheader("Content-Type") or "", answer.read()

    def listen_host(self) -> str:
        """The ``listen_host`` setting; else this pod's IP (downward API env
        ``FIBERLITE_POD_IP`` or the pod's status); else the local address that routes
        to the API server."""
        host = config.get("listen_host")
        if host:
            return host
        if os.environ.get("FIBERLITE_POD_IP"):
            return os.environ["FIBERLITE_POD_IP"]
        try:
            session = self._session()
            master = session.master()
        except BackendError:
            return _local_address(None)
        if master is not None and master.pod_ip:
            return master.pod_ip
        return _local_address(session.conn.host)

    def close(self) -> None:
        with self._lock:
            sessions, self._sessions = list(self._sessions.values()), {}
        for session in sessions:
            session.close()

    # -- for the command line ------------------------------------------------------------
    def list_jobs(self, run_id: str | None = None) -> list[tuple[str, str, str]]:
        session = self._session()
        try:
            pods = session.api.list_namespaced_pod(session.namespace, label_selector=_run_selector(run_id),
                                                   _request_timeout=TIMEOUT).items
        except Exception as exc:
            raise api_error(exc, f"list pods in namespace {session.namespace!r}", session.conn) from None
        pods.sort(key=lambda p: (p.metadata.creation_timestamp is None, p.metadata.creation_timestamp,
                                 p.metadata.name))
        return [(p.metadata.name, (p.metadata.labels or {}).get(RUN_LABEL, ""), describe(p)) for p in pods]

    def cleanup_run(self, run_id: str | None = None) -> int:
        """Delete the run's pods at once (grace 0) and its Secrets (when listing them is allowed)."""
        session = self._session()
        removed: set[str] = set()
        for _ in range(2):  # a second pass catches pods created while the first one ran
            try:
                pods = session.api.list_namespaced_pod(session.namespace, label_selector=_run_selector(run_id),
                                                       _request_timeout=TIMEOUT).items
            except Exception as exc:
                raise api_error(exc, f"list pods in namespace {session.namespace!r}", session.conn) from None
            fresh = [p.metadata.name for p in pods if p.metadata.name not in removed]
            if not fresh:
                break
            session.kill(fresh)
            removed.update(fresh)
        for kind in ("secret", "config_map"):  # the run's key; the master's working directory
            _delete_owned(session, kind, _run_selector(run_id))
        return len(removed)

    def stream_logs(self, job_name: str, follow: bool = False) -> Iterator[str]:
        session = self._session()
        api, namespace = session.api, session.namespace
        try:
            pod = api.read_namespaced_pod(job_name, namespace, _request_timeout=TIMEOUT)
        except Exception as exc:
            if is_status(exc, 404):
                raise LookupError(f"no pod {job_name} in namespace {namespace!r}") from None
            raise api_error(exc, f"read pod {job_name}", session.conn) from None
        if follow and job_state(pod) is JobState.PENDING:
            _wait_until_started(session, job_name)
        try:
            timeout = (TIMEOUT[0], FOLLOW_READ_TIMEOUT) if follow else TIMEOUT
            response = api.read_namespaced_pod_log(job_name, namespace, follow=follow,
                                                   _preload_content=False, _request_timeout=timeout)
        except Exception as exc:
            if is_status(exc, 404):
                raise LookupError(f"no pod {job_name} in namespace {namespace!r}") from None
            raise api_error(exc, f"read the log of pod {job_name}", session.conn) from None
        return _text_chunks(response)


def _delete_owned(session: Session, kind: str, label_selector: str) -> None:
    """Delete the run's Secrets or ConfigMaps, when listing them is allowed (else they go
    with the pod that owns them)."""
    api = session.api
    try:
        found = getattr(api, f"list_namespaced_{kind}")(
            session.namespace, label_selector=label_selector, _request_timeout=TIMEOUT).items
    except Exception as exc:
        log.debug("cannot list %ss (they go with their owner pod): %s", kind, exc)
        return
    for item in found:
        try:
            getattr(api, f"delete_namespaced_{kind}")(item.metadata.name, session.namespace,
                                                       _request_timeout=TIMEOUT)
        except Exception as exc:
            log.debug("cannot delete %s %s: %s", kind, item.metadata.name, exc)


def _run_selector(run_id: str | None) -> str:
    return f"{RUN_LABEL}={label_value(run_id)}" if run_id else RUN_LABEL


def _wait_until_started(session: Session, name: str) -> None:
    """Watch pod ``name`` until it leaves Pending; BackendError if it cannot start."""
    from kubernetes import watch
    stream = watch.Watch().stream(session.api.list_namespaced_pod, session.namespace,
                                  field_selector=f"metadata.name={name}", timeout_seconds=3600)
    for event in stream:
        pod = event["object"]
        if event["type"] == "DELETED" or job_state(pod) is not JobState.PENDING:
            return
        if start_problem(pod):
            raise BackendError(f"pod {name} cannot start: {describe(pod)}")


def _text_chunks(response: Any) -> Iterator[str]:
    try:
        yield from decode_stream(response.stream(4096, decode_content=True))
    finally:
        response.release_conn()


def _local_address(api_url: str | None) -> str:
    """The local IP that routes to the API server (or to anything), else loopback."""
    parts = urlsplit(api_url or "")
    return routed_address(parts.hostname or "10.255.255.255", parts.port or 443)
