"""One cluster configuration's jobs: :class:`Session` owns the client, the namespace,
the master pod (read once), the run's Secrets and the pod watchers for the kubeconfig
and namespace in effect, and follows every job it created as a :class:`PodJob`.

:class:`~fiberlite.backends.kubernetes.backend.KubernetesBackend` keeps one session per
(kubeconfig, namespace) and hands each seam call to the session that created the job.
Pod and Secret bodies come from :mod:`.pods`, what a pod's status means from
:mod:`.status`, pod events from :mod:`.watch`.
"""
from __future__ import annotations

import logging
import os
import secrets
import signal
import sys
import threading
import time
from dataclasses import dataclass, field
from typing import Any

from ... import config
from ...errors import BackendError
from ..base import JOB_LABEL, RUN_LABEL, WATCHED_LABELS, Backend, Job, JobSpec, JobState
from .api import TIMEOUT, Connection, api_error, in_cluster, is_status, pod_namespace
from .pods import (GRACE_SECONDS, MasterPod, build_pod, build_secret, build_tree_maps, dns_name,
                   label_value, selector)
from .status import (IMAGE_REASONS, START_FAILED, Outcome, describe, job_state, outcome,
                     start_problem, unschedulable_message, waiting)
from .watch import PodWatcher

log = logging.getLogger("fiberlite.kubernetes")

_UNSET: Any = object()
TREE_UPLOADS = 4  # ConfigMaps of a working directory created at once


@dataclass(eq=False)
class PodJob:
    """What the backend knows about one job's pod (``Job.handle``)."""

    session: "Session"
    name: str
    uid: str | None = None
    pod: Any = None  # the latest V1Pod seen
    deleted: bool = False
    requested: int | None = None  # the signal terminate() asked for
    outcome: Outcome | None = None
    diagnosing: bool = False
    created: float = field(default_factory=time.monotonic)
    logs: str | None = None
    cleaned: bool = False
    waits_for_capacity: bool = False  # unschedulable: wait for room (up to start_timeout)


class Session:
    """Jobs created with one cluster configuration (kubeconfig + namespace)."""

    def __init__(self, conn: Connection) -> None:
        self.conn = conn
        self.namespace = conn.namespace
        self.api = conn.core_v1()
        self.cond = threading.Condition()
        self.jobs: dict[str, PodJob] = {}
        self._creating: set[str] = set()  # pod names whose create call is under way
        self._seen: dict[str, tuple[Any, bool]] = {}  # their events, until they are registered
        self._watchers: dict[str, PodWatcher] = {}
        self._secrets: dict[tuple, str] = {}
        self._master: Any = _UNSET
        self._lock = threading.Lock()
        self.closed = False

    # -- the pod this process runs in ------------------------------------------------------
    def master(self) -> MasterPod | None:
        with self._lock:
            if self._master is _UNSET:
                self._master = self._read_master()
            return self._master

    def _read_master(self) -> MasterPod | None:
        name = os.environ.get("FIBERLITE_POD_NAME") or (os.environ.get("HOSTNAME") if in_cluster() else None)
        if not name:
            return None
        namespace = os.environ.get("FIBERLITE_POD_NAMESPACE") or \
            (pod_namespace() if in_cluster() else None) or self.namespace
        try:
            pod = self.api.read_namespaced_pod(name, namespace, _request_timeout=TIMEOUT)
        except Exception as exc:
            if is_status(exc, 404):
                log.warning("this process's pod %s/%s was not found: its children get no "
                            "ownerReference and need the image setting", namespace, name)
                return None
            raise api_error(exc, f"read this process's own pod {name}", self.conn) from None
        master = MasterPod.from_pod(pod, os.environ.get("FIBERLITE_CONTAINER_NAME"))
        if master.namespace != self.namespace:
            log.warning("jobs go to namespace %r but this pod runs in %r: children get no "
                        "ownerReference, volumes or service account from it",
                        self.namespace, master.namespace)
        return master

    def _owner(self) -> MasterPod | None:
        master = self.master()
        return master if master is not None and master.namespace == self.namespace else None

    # -- creating jobs --------------------------------------------------------------------
    def create_job(self, backend: Backend, spec: JobSpec, service_account: str | None = None) -> Job:
        master = self.master()
        image = spec.image or (master.image if master else None)
        if not image:
            raise BackendError(
                f"no container image for job {spec.name}: set the image setting (FIBERLITE_IMAGE, "
                "fiberlite.init(image=...), fiberlite run --image) or @fiberlite.meta(image=...), "
                "or run the master in a pod (its image is then the default)")
        base = dns_name(spec.name)
        labels = {k: label_value(v) for k, v in spec.labels.items()} or {JOB_LABEL: base}
        watched = {k: v for k, v in labels.items() if k in WATCHED_LABELS} or labels
        self._watch(selector(watched))
        owner = self._owner()
        secret = self._secret(spec.secret_env, watched, owner) if spec.secret_env else None
        name = base
        for attempt in range(4):
            body = build_pod(spec, name, image, owner, secret, service_account, labels)
            with self.cond:
                self._creating.add(name)
            try:
                created = self.api.create_namespaced_pod(self.namespace, body, _request_timeout=TIMEOUT)
                break
            except Exception as exc:
                with self.cond:
                    self._creating.discard(name)
                    self._seen.pop(name, None)
                if is_status(exc, 409) and attempt < 3:  # a pod of that name exists: add a suffix
                    name = f"{base[:57]}-{secrets.token_hex(2)}"
                    continue
                raise api_error(exc, f"create pod {name} in namespace {self.namespace!r}",
                                self.conn) from None
        if spec.tree is not None:
            self._store_tree(created, spec, labels)
        job = PodJob(self, name, uid=created.metadata.uid, pod=created,
                     waits_for_capacity=spec.waits_for_capacity)
        with self.cond:
            self._creating.discard(name)
            seen = self._seen.pop(name, None)
            if seen is not None and seen[0].metadata.uid == job.uid:
                job.pod, job.deleted = seen
            self.jobs[name] = job
            problem = self._evaluate(job)
        if problem:
            self._diagnose(job, problem)
        return Job(backend, name, spec, pid=None, handle=job)

    def _store_tree(self, pod: Any, spec: JobSpec, labels: dict[str, str]) -> None:
        """The ConfigMaps of the pod's working directory, a few at a time (the pod waits
        for them to be mounted); if they cannot all be made, the pod goes and the error
        says why."""
        from concurrent.futures import ThreadPoolExecutor

        def create(body: Any) -> BackendError | None:
            try:
                self.api.create_namespaced_config_map(self.namespace, body, _request_timeout=TIMEOUT)
                return None
            except Exception as exc:
                return api_error(exc, f"create ConfigMap {body.metadata.name} (the working "
                                 f"directory of pod {pod.metadata.name})", self.conn)

        with ThreadPoolExecutor(TREE_UPLOADS) as uploads:
            errors = [e for e in uploads.map(create, build_tree_maps(pod, spec.tree, labels)) if e]
        if errors:
            with self.cond:
                self._creating.discard(pod.metadata.name)
                self._seen.pop(pod.metadata.name, None)
            self._delete(pod.metadata.name, 0)
            raise errors[0]

    def _watch(self, label_selector: str) -> None:
        with self._lock:
            watcher = self._watchers.get(label_selector)
            if watcher is not None and watcher.alive:
                return
            watcher = PodWatcher(self.api, self.namespace, label_selector, self._on_event,
                                 self._check_start_timeouts)
            try:
                watcher.start()
            except Exception as exc:
                raise api_error(exc, f"list and watch pods in namespace {self.namespace!r}",
                                self.conn) from None
            self._watchers[label_selector] = watcher

    def _secret(self, data: dict[str, str], labels: dict[str, str], owner: MasterPod | None) -> str:
        key = tuple(sorted(data.items()))
        with self._lock:
            name = self._secrets.get(key)
            if name is None:
                body = build_secret(f"fl-{labels.get(RUN_LABEL, 'run')}-key", data, labels, owner)
                try:
                    created = self.api.create_namespaced_secret(self.namespace, body,
                                                                _request_timeout=TIMEOUT)
                except Exception as exc:
                    raise api_error(exc, "create the Secret that holds the run's key in namespace "
                                    f"{self.namespace!r}", self.conn) from None
                name = self._secrets[key] = created.metadata.name
            return name

    # -- following pods -------------------------------------------------------------------
    def _on_event(self, kind: str, pod: Any) -> None:
        name = pod.metadata.name
        with self.cond:
            job = self.jobs.get(name)
            if job is None or (job.uid and pod.metadata.uid != job.uid):
                if name in self._creating:  # seen before create() returned: keep for it
                    deleted = kind == "DELETED" or (name in self._seen and self._seen[name][1])
                    self._seen[name] = (pod, deleted)
                return
            job.pod = pod
            job.deleted = job.deleted or kind == "DELETED"
            problem = self._evaluate(job)
        if problem:
            self._diagnose(job, problem)

    def _evaluate(self, job: PodJob) -> str | None:
        """(Under ``cond``.) Finish the job if its pod is done; name a start problem."""
        if job.outcome is not None:
            return None
        done = outcome(job.pod, job.deleted, job.requested)
        if done is not None:
            self._finish(job, done)
            return None
        if not job.diagnosing and job.requested is None:
            problem = start_problem(job.pod)
            if problem == "unschedulable" and job.waits_for_capacity:
                return None  # it starts when the cluster has room; start_timeout still applies
            if problem:
                job.diagnosing = True
                return problem
        return None

    def _finish(self, job: PodJob, done: Outcome) -> None:
        job.outcome = done
        if done.message and job.requested is None:
            log.error("fiberlite job %s: %s", job.name, done.message)
        self.cond.notify_all()

    def _diagnose(self, job: PodJob, problem: str) -> None:
        """Turn a pod that cannot start into a failed job with the reason (API calls: no lock)."""
        pod = job.pod
        if problem == "unschedulable":
            events = self._events(pod)
            if any(e.reason == "TriggeredScaleUp" for e in events):
                log.info("pod %s waits for the cluster autoscaler", job.name)
                return  # a node is coming; start_timeout still applies
            message = f"pod {job.name} cannot be scheduled: {unschedulable_message(pod)}"
        elif problem in IMAGE_REASONS:
            image = pod.spec.containers[0].image
            pulls = [e.message for e in self._events(pod)
                     if (e.message or "").startswith("Failed to pull image")]
            detail = pulls[-1] if pulls else (waiting(pod).message or problem)
            message = (f"pod {job.name} cannot pull image {image!r} ({problem}): {detail}; push the "
                       "image to a registry the cluster can reach (kind: kind load docker-image), "
                       "or give the master pod imagePullSecrets")
        else:
            state = waiting(pod)
            message = f"pod {job.name} cannot start its container: {problem}: {state.message or ''}"
        self._fail(job, " ".join(message.split()))

    def _fail(self, job: PodJob, message: str) -> None:
        with self.cond:
            if job.outcome is not None:
                return
            self._finish(job, Outcome(START_FAILED, message, started=False))
        self._delete(job.name, 0)

    def _events(self, pod: Any) -> list:
        try:
            listed = self.api.list_namespaced_event(
                self.namespace, field_selector=f"involvedObject.name={pod.metadata.name}",
                _request_timeout=TIMEOUT)
        except Exception as exc:
            log.debug("cannot read events of pod %s: %s", pod.metadata.name, exc)
            return []
        return [e for e in listed.items
                if not e.involved_object.uid or e.involved_object.uid == pod.metadata.uid]

    def _start_left(self, job: PodJob, now: float) -> float | None:
        if job.outcome is not None or job.requested is not None or \
                job_state(job.pod, job.deleted) is not JobState.PENDING:
            return None
        return job.created + float(config.get("start_timeout")) - now

    def _check_start_timeouts(self) -> None:
        now = time.monotonic()
        with self.cond:
            lefts = [(j, self._start_left(j, now)) for j in self.jobs.values()]
            late = [j for j, left in lefts if left is not None and left <= 0]
        for job in late:
            self._start_timed_out(job)

    def _start_timed_out(self, job: PodJob) -> None:
        self._fail(job, f"pod {job.name} did not start within {config.get('start_timeout'):g} s "
                   f"(start_timeout setting); it was {describe(job.pod)}")

    # -- the seam ---------------------------------------------------------------------------
    def wait(self, job: PodJob, timeout: float | None) -> int | None:
        end = None if timeout is None else time.monotonic() + max(0.0, timeout)
        while True:
            with self.cond:
                while job.outcome is None:
                    now = time.monotonic()
                    start_left = self._start_left(job, now)
                    if start_left is not None and start_left <= 0:
                        break
                    left = None if end is None else end - now
                    if left is not None and left <= 0:
                        return None
                    waits = [w for w in (left, start_left) if w is not None]
                    self.cond.wait(min(waits) if waits else None)
                if job.outcome is not None:
                    return job.outcome.exitcode
            self._start_timed_out(job)

    def status(self, job: PodJob) -> JobState:
        with self.cond:
            return JobState.EXITED if job.outcome is not None else job_state(job.pod, job.deleted)

    def terminate(self, job: PodJob, force: bool) -> None:
        with self.cond:
            if job.outcome is not None:
                return
            if job.requested != signal.SIGKILL:
                job.requested = signal.SIGKILL if force else signal.SIGTERM
        self._delete(job.name, 0 if force else GRACE_SECONDS, strict=True)

    def logs(self, job: PodJob) -> str:
        if job.logs is not None:
            return job.logs
        try:
            return self.api.read_namespaced_pod_log(job.name, self.namespace, _request_timeout=TIMEOUT)
        except Exception:
            return ""

    def cleanup(self, job: PodJob) -> None:
        """Copy the finished pod's log to stdout, then delete the pod."""
        with self.cond:
            if job.cleaned:
                return
            job.cleaned = True
        if not job.deleted and job.outcome is not None and job.outcome.started:
            try:
                job.logs = self.api.read_namespaced_pod_log(job.name, self.namespace,
                                                            _request_timeout=TIMEOUT)
            except Exception as exc:
                log.debug("no log for pod %s: %s", job.name, exc)
            if job.logs:
                try:
                    sys.stdout.write(job.logs)
                    sys.stdout.flush()
                except (OSError, ValueError):
                    pass
        if not job.deleted:
            self._delete(job.name, 0)
        with self.cond:
            self.jobs.pop(job.name, None)

    def kill(self, names: list[str]) -> None:
        """Delete pods ``names`` at once (grace 0), whoever created them; those that are
        jobs of this session end as killed (SIGKILL)."""
        with self.cond:
            for name in names:
                job = self.jobs.get(name)
                if job is not None and job.requested is None:
                    job.requested = signal.SIGKILL
        for name in names:
            self._delete(name, 0, strict=True)

    def _delete(self, name: str, grace: int, strict: bool = False) -> None:
        try:
            self.api.delete_namespaced_pod(name, self.namespace, grace_period_seconds=grace,
                                           propagation_policy="Background", _request_timeout=TIMEOUT)
        except Exception as exc:
            if is_status(exc, 404):
                return
            error = api_error(exc, f"delete pod {name}", self.conn)
            if strict:
                raise error from None
            log.warning("%s", error)

    def close(self) -> None:
        """Stop watching, remove pods still running and the run's Secrets."""
        self.closed = True
        with self._lock:
            watchers, self._watchers = list(self._watchers.values()), {}
            secret_names, self._secrets = list(self._secrets.values()), {}
        for watcher in watchers:
            watcher.stop()
        with self.cond:
            left = [j for j in self.jobs.values() if j.outcome is None]
            for job in left:
                job.requested = job.requested or signal.SIGKILL
            ended = [j for j in self.jobs.values() if j.outcome is not None and not j.cleaned]
        for job in left:
            self._delete(job.name, 0)
        for job in ended:  # ended pods not cleaned up yet: their logs, then the pods go
            self.cleanup(job)
        with self.cond:
            for job in left:
                if job.outcome is None:
                    self._finish(job, Outcome(-signal.SIGKILL))
        for name in secret_names:
            try:
                self.api.delete_namespaced_secret(name, self.namespace, _request_timeout=TIMEOUT)
            except Exception as exc:
                if not is_status(exc, 404):
                    log.warning("cannot delete Secret %s: %s", name, api_error(exc, "delete it", self.conn))
