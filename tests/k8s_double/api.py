"""The REST API: routing, create, get, list, watch and delete.

Handlers take a parsed :class:`Request` and return a :class:`Response`
(a JSON body, text, or a generator of chunks for ``watch`` and ``follow``);
errors are raised as :class:`~.errors.ApiError` and become ``Status`` bodies.
"""

from __future__ import annotations

import base64
import binascii
import copy
import datetime
import json
import random
import re
import signal
import time
import uuid
from typing import Any, Iterator, Optional

from . import validation
from .decode import decode
from .errors import ApiError, already_exists, bad_request, forbidden, not_found
from .gc import GarbageCollector
from .kubelet import Kubelet, PodRun
from .logs import read_log
from .proxy import ROUTE as PROXY_ROUTE
from .proxy import proxy
from .selectors import field_selector, label_selector
from .store import Store, now
from .wire import Request, Response, is_true

KINDS = {"pods": ("Pod", "V1Pod"), "secrets": ("Secret", "V1Secret"),
         "configmaps": ("ConfigMap", "V1ConfigMap"), "events": ("Event", "CoreV1Event")}
COLLECTION = r"(?P<resource>pods|secrets|configmaps|events)"
WRITABLE = r"(?P<resource>pods|secrets|configmaps)"
NS = r"/api/v1/namespaces/(?P<ns>[^/]+)"
WATCH_DEFAULT_TIMEOUT = 1800


class Api:
    """State and behaviour of the double behind the HTTP server."""

    def __init__(self, runner, namespaces, user: str):
        self.store = Store()
        self.kubelet = Kubelet(self, runner)
        self.gc = GarbageCollector(self)
        self.namespaces = set(namespaces)
        self.user = user
        self.denied: set[tuple[str, str, Optional[str]]] = set()
        self.unschedulable: Optional[tuple[str, Any]] = None
        self.capacity: Optional[int] = None  # pods the node runs at once (None: no limit)
        self.pull_failures: dict[str, str] = {}
        self.errors: list[str] = []
        self.routes = [
            ("GET", rf"^{NS}/{COLLECTION}$", self.list_or_watch),
            ("POST", rf"^{NS}/{WRITABLE}$", self.create),
            ("DELETE", rf"^{NS}/{WRITABLE}$", self.delete_collection),
            ("GET", rf"^{NS}/{COLLECTION}/(?P<name>[^/]+)$", self.get),
            ("DELETE", rf"^{NS}/{WRITABLE}/(?P<name>[^/]+)$", self.delete),
            ("GET", rf"^{NS}/pods/(?P<name>[^/]+)/log$",
             lambda req, ns, name: read_log(self, req, ns, name)),
            ("GET", rf"^{NS}/pods/(?P<name>[^/]+)/status$", self.get),
            ("GET", PROXY_ROUTE, lambda req, **args: proxy(self, req, **args)),
            ("GET", rf"^/api/v1/{COLLECTION}$", self.list_or_watch),
            ("GET", rf"^{NS}$", self.namespace),
            ("POST", r"^/apis/authorization.k8s.io/v1/selfsubjectaccessreviews$", self.review),
            ("GET", r"^/version/?$", self.version),
            ("GET", r"^/api/?$", lambda req: Response(200, {
                "kind": "APIVersions", "versions": ["v1"], "serverAddressByClientCIDRs": []})),
            ("GET", r"^/(?:healthz|livez|readyz)$", lambda req: Response(200, "ok", "text/plain")),
        ]

    # -- dispatch ------------------------------------------------------------
    def handle(self, req: Request) -> Response:
        known_path = False
        for method, pattern, func in self.routes:
            m = re.match(pattern, req.path)
            if m:
                known_path = True
                if method == req.method:
                    args = {k: v for k, v in m.groupdict().items() if v is not None}
                    self._authorize(req, args)
                    return func(req, **args)
        if known_path:
            raise ApiError(405, "the server does not allow this method on the requested resource")
        raise ApiError(404, "the server could not find the requested resource")

    def _authorize(self, req: Request, args: dict) -> None:
        """RBAC as configured by ``forbid``; only resource requests are checked."""
        if "name" in args and "resource" not in args:      # pods/{name}/log|status
            resource = "pods/" + req.path.rsplit("/", 1)[1]
        elif "resource" in args:
            resource = args["resource"]
        else:
            return
        name = args.get("name")
        verb = {"POST": "create", "DELETE": "delete" if name else "deletecollection"}.get(
            req.method, "get" if name else "watch" if is_true(req.query.get("watch")) else "list")
        if self.denies(verb, resource, args.get("ns")):
            err = forbidden(self.user, verb, resource, args.get("ns", ""), name)
            if "ns" not in args:
                err.message = err.message.split(" in the namespace")[0] + " at the cluster scope"
            raise err

    def denies(self, verb: str, resource: str, namespace: Optional[str]) -> bool:
        return any((verb, resource, ns) in self.denied for ns in (namespace, None))

    # -- behaviour consulted by the kubelet ------------------------------------
    def unschedulable_message(self, pod: dict) -> Optional[str]:
        rule = self.unschedulable
        if rule and (rule[1] is None or rule[1](pod)):
            return rule[0]
        return None

    def take_place(self, run) -> bool:
        """(Store lock held.) Give ``run`` one of the node's places, if one is free and
        no pod created before it still waits for one (the scheduler's queue is first come,
        first placed)."""
        if not run.placed:
            runs = list(self.kubelet.runs.values())
            placed = sum(1 for other in runs if other.placed)
            if self.capacity is not None and (placed >= self.capacity or any(
                    self._waits_for_place(other) for other in runs if other.order < run.order)):
                return False
            run.placed, run.queued = True, False
        return True

    def _waits_for_place(self, run) -> bool:
        pod = self.store.get("pods", run.namespace, run.name)
        return bool(run.queued and pod and pod["metadata"]["uid"] == run.uid
                    and not self.unschedulable_message(pod))

    def free_place(self, run) -> None:
        """The pod's life is over: its place goes to a pod that waits for one."""
        with self.store.cond:
            if run.placed:
                run.placed = False
                self.store.cond.notify_all()

    def no_place_message(self) -> str:
        return f"0/1 nodes are available: 1 Too many pods (capacity {self.capacity})."

    def pull_failure(self, image: str) -> Optional[str]:
        return self.pull_failures.get(image)

    def record_event(self, pod: dict, reason: str, message: str, type: str = "Normal",
                     component: str = "kubelet", field_path: Optional[str] = None) -> dict:
        """Store a ``v1.Event`` about ``pod``, as the scheduler or kubelet would."""
        meta = pod["metadata"]
        involved = {"kind": "Pod", "namespace": meta["namespace"], "name": meta["name"],
                    "uid": meta["uid"], "apiVersion": "v1",
                    "resourceVersion": meta.get("resourceVersion")}
        if field_path:
            involved["fieldPath"] = f"spec.containers{{{field_path}}}"
        stamp = now()
        event = {"metadata": {"name": f"{meta['name']}.{uuid.uuid4().hex[:16]}",
                              "namespace": meta["namespace"]},
                 "involvedObject": involved, "reason": reason, "message": message,
                 "source": {"component": component, "host": "double-node"},
                 "firstTimestamp": stamp, "lastTimestamp": stamp, "count": 1, "type": type,
                 "reportingComponent": component, "reportingInstance": "double-node"}
        return self.store.create("events", event)

    # -- create ------------------------------------------------------------------
    def create(self, req: Request, ns: str, resource: str) -> Response:
        kind, model = KINDS[resource]
        obj, warnings = decode(req.raw, model, kind, req.query.get("fieldValidation"))
        meta = obj.setdefault("metadata", {})
        if meta.get("namespace") not in (None, "", ns):
            raise bad_request("the namespace of the provided object does not match "
                              "the namespace sent on the request")
        if ns not in self.namespaces:
            raise not_found("namespaces", ns)
        for key in ("uid", "resourceVersion", "creationTimestamp", "deletionTimestamp",
                    "deletionGracePeriodSeconds", "selfLink"):
            meta.pop(key, None)
        meta["namespace"] = ns
        obj.update(kind=kind, apiVersion="v1")
        if not meta.get("name") and meta.get("generateName"):
            meta["name"] = generate_name(meta["generateName"])
        if resource == "pods":
            obj.pop("status", None)
            validation.validate_pod(obj)
            validation.default_pod(obj)
            obj["status"] = {"phase": "Pending", "qosClass": validation.qos_class(obj)}
        elif resource == "configmaps":
            validation.validate_config_map(obj)
        else:
            _secret_data(obj)
            obj.setdefault("type", "Opaque")
        headers = {"Warning": ", ".join(f'299 - "{w}"' for w in warnings)} if warnings else {}
        if req.query.get("dryRun") == "All":
            return Response(201, obj, headers=headers)
        with self.store.cond:
            if self.store.get(resource, ns, meta["name"]) is not None:
                raise already_exists(resource, meta["name"])
            self.store.create(resource, obj)
            body = copy.deepcopy(obj)
            if resource == "pods":
                self.kubelet.admit(obj)
        if meta.get("ownerReferences"):
            self.gc.later(self.gc.collect_if_orphaned, resource, ns, meta["name"], meta["uid"])
        return Response(201, body, headers=headers)

    # -- read ----------------------------------------------------------------------
    def get(self, req: Request, ns: str, name: str, resource: str = "pods") -> Response:
        with self.store.cond:
            obj = self.store.get(resource, ns, name)
            if obj is None:
                raise not_found(resource, name)
            return Response(200, _with_kind(resource, obj))

    def namespace(self, req: Request, ns: str) -> Response:
        if ns not in self.namespaces:
            raise not_found("namespaces", ns)
        uid = str(uuid.uuid5(uuid.NAMESPACE_DNS, ns))
        return Response(200, {"kind": "Namespace", "apiVersion": "v1",
                              "metadata": {"name": ns, "uid": uid, "resourceVersion": "1"},
                              "spec": {"finalizers": ["kubernetes"]},
                              "status": {"phase": "Active"}})

    def list_or_watch(self, req: Request, resource: str, ns: Optional[str] = None) -> Response:
        q = req.query
        labels = label_selector(q.get("labelSelector"))
        fields = field_selector(resource, q.get("fieldSelector"))

        def match(obj):
            return labels(obj) and fields(obj)

        if is_true(q.get("watch")):
            return Response(200, self._watch(resource, ns, match, q), "application/json")
        with self.store.cond:
            items = [copy.deepcopy(o) for o in self.store.list(resource, ns, match)]
            rv = self.store.rv
        meta = {"resourceVersion": str(rv)}
        if q.get("continue"):
            after = json.loads(base64.urlsafe_b64decode(q["continue"]))
            items = [o for o in items
                     if [o["metadata"]["namespace"], o["metadata"]["name"]] > after]
        limit = int(q.get("limit") or 0)
        if limit and len(items) > limit:
            last = items[limit - 1]["metadata"]
            meta["continue"] = base64.urlsafe_b64encode(
                json.dumps([last["namespace"], last["name"]]).encode()).decode()
            meta["remainingItemCount"] = len(items) - limit
            items = items[:limit]
        kind = KINDS[resource][0] + "List"
        return Response(200, {"kind": kind, "apiVersion": "v1", "metadata": meta, "items": items})

    def _watch(self, resource: str, ns: Optional[str], match, q: dict) -> Iterator[bytes]:
        """Validate eagerly; then stream ``{"type", "object"}`` lines."""
        timeout = int(q.get("timeoutSeconds") or WATCH_DEFAULT_TIMEOUT)
        rv = q.get("resourceVersion") or "0"
        if not rv.isdigit():
            raise bad_request(f'resourceVersion: Invalid value: "{rv}": must be an integer')
        with self.store.cond:
            if rv == "0":
                initial = [_event_line("ADDED", resource, o)
                           for o in self.store.list(resource, ns, match)]
                last = self.store.rv
            elif int(rv) < self.store.compacted:
                initial = [json.dumps({"type": "ERROR", "object": ApiError(
                    410, f"too old resource version: {rv} ({self.store.compacted})").status()}
                ).encode() + b"\n"]
                last = None
            else:
                initial, last = [], int(rv)
        return self._stream_changes(resource, ns, match, initial, last, timeout)

    def _stream_changes(self, resource, ns, match, initial, last, timeout):
        yield from initial
        end = time.monotonic() + timeout
        while last is not None:
            with self.store.cond:
                lines = [_event_line(c.type, resource, c.obj)
                         for c in self.store.changes_after(last, resource)
                         if ns in (None, c.namespace) and match(c.obj)]
                last = self.store.rv
                if not lines:
                    if self.store.closed or time.monotonic() >= end:
                        return
                    self.store.cond.wait(min(1.0, max(0.0, end - time.monotonic())))
            yield b"".join(lines)   # b"" is a heartbeat: the server checks the client

    # -- delete ------------------------------------------------------------------------
    def delete(self, req: Request, ns: str, resource: str, name: str) -> Response:
        opts = self._delete_options(req)
        with self.store.cond:
            obj = self.store.get(resource, ns, name)
            if obj is None:
                raise not_found(resource, name)
            if opts["dryRun"] == "All":
                return Response(200, _with_kind(resource, obj))
            if resource != "pods":
                self.store.delete(resource, ns, name)
                self.gc.later(self.gc.collect, ns, obj["metadata"]["uid"], opts["propagation"])
                return Response(200, {"kind": "Status", "apiVersion": "v1", "metadata": {},
                                      "status": "Success", "details": {
                                          "name": name, "kind": resource,
                                          "uid": obj["metadata"]["uid"]}})
            return Response(200, _with_kind(resource, self._delete_pod(obj, opts)))

    def _delete_options(self, req: Request) -> dict:
        body = req.body if isinstance(req.body, dict) else {}
        if body:
            decode(json.dumps(body).encode(), "V1DeleteOptions", "DeleteOptions", "Strict")
        grace = req.query.get("gracePeriodSeconds", body.get("gracePeriodSeconds"))
        return {"grace": None if grace is None else int(grace),
                "propagation": req.query.get("propagationPolicy",
                                             body.get("propagationPolicy")) or "Background",
                "dryRun": req.query.get("dryRun") or ("All" if body.get("dryRun") else None)}

    def _delete_pod(self, pod: dict, opts: dict) -> dict:
        """Graceful if containers run and grace > 0; otherwise remove now."""
        meta = pod["metadata"]
        run = self.kubelet.runs.get((meta["namespace"], meta["name"]))
        grace = opts["grace"]
        if grace is None:
            grace = pod["spec"].get("terminationGracePeriodSeconds", 30)
        if run is not None and run.uid == meta["uid"] and (run.handles or run.restart_at) \
                and grace > 0:
            run.propagation = opts["propagation"]
            deadline = time.monotonic() + grace
            if run.deadline is None or deadline < run.deadline:
                run.deadline = deadline
                meta["deletionTimestamp"] = (datetime.datetime.now(datetime.timezone.utc)
                                             + datetime.timedelta(seconds=grace)
                                             ).strftime("%Y-%m-%dT%H:%M:%SZ")
                meta["deletionGracePeriodSeconds"] = grace
                self.store.update("pods", pod)
            return copy.deepcopy(pod)
        final = copy.deepcopy(self._remove_pod(pod, opts["propagation"]))
        if run is not None:
            self.kubelet.signal(run, signal.SIGKILL)
        return final

    def _remove_pod(self, pod: dict, propagation: str) -> dict:
        meta = pod["metadata"]
        run = self.kubelet.runs.get((meta["namespace"], meta["name"]))
        if run is not None and run.uid == meta["uid"]:
            run.gone = True
            del self.kubelet.runs[(meta["namespace"], meta["name"])]
        self.store.delete("pods", meta["namespace"], meta["name"])
        self.gc.later(self.gc.collect, meta["namespace"], meta["uid"], propagation)
        return pod

    def finish_delete(self, run: PodRun) -> None:
        """Called by the kubelet once a gracefully deleted pod's containers are gone."""
        with self.store.cond:
            pod = self.store.get("pods", run.namespace, run.name)
            if pod is not None and pod["metadata"]["uid"] == run.uid:
                self._remove_pod(pod, run.propagation)

    def delete_collection(self, req: Request, ns: str, resource: str) -> Response:
        listed = self.list_or_watch(Request("GET", req.path, None, {
            k: v for k, v in req.query.items() if k in ("labelSelector", "fieldSelector")}),
            resource, ns).body["items"]
        for obj in listed:
            try:
                self.delete(req, ns=ns, resource=resource, name=obj["metadata"]["name"])
            except ApiError:
                pass   # deleted meanwhile
        return Response(200, {"kind": "Status", "apiVersion": "v1", "metadata": {},
                              "status": "Success"})

    # -- misc ---------------------------------------------------------------------------
    def review(self, req: Request) -> Response:
        obj, _ = decode(req.raw, "V1SelfSubjectAccessReview", "SelfSubjectAccessReview", "Strict")
        attrs = (obj.get("spec") or {}).get("resourceAttributes") or {}
        resource = attrs.get("resource", "") + (f"/{attrs['subresource']}"
                                                if attrs.get("subresource") else "")
        allowed = not self.denies(attrs.get("verb", ""), resource, attrs.get("namespace"))
        obj["status"] = {"allowed": allowed}
        return Response(201, obj)

    def version(self, req: Request) -> Response:
        return Response(200, {"major": "1", "minor": "37", "gitVersion": "v1.37.0-double",
                              "gitCommit": "double", "gitTreeState": "clean",
                              "buildDate": "2026-01-01T00:00:00Z", "goVersion": "go1.24",
                              "compiler": "gc", "platform": "linux/amd64"})


def generate_name(prefix: str) -> str:
    """``generateName`` plus five characters, as the API server does."""
    alphabet = "bcdfghjklmnpqrstvwxz2456789"
    return prefix[:58] + "".join(random.choice(alphabet) for _ in range(5))


def _secret_data(secret: dict) -> None:
    """Check base64 in ``data``; fold ``stringData`` into it (and drop it)."""
    for key, value in (secret.get("data") or {}).items():
        try:
            base64.b64decode(value, validate=True)
        except (binascii.Error, ValueError) as exc:
            raise bad_request(f'Secret in version "v1" cannot be handled as a Secret: '
                              f"illegal base64 data for key {key!r}: {exc}")
    validation.validate_secret(secret)
    for key, value in (secret.pop("stringData", None) or {}).items():
        secret.setdefault("data", {})[key] = base64.b64encode(value.encode()).decode()


def _with_kind(resource: str, obj: dict) -> dict:
    return {"kind": KINDS[resource][0], "apiVersion": "v1", **copy.deepcopy(obj)}


def _event_line(kind: str, resource: str, obj: dict) -> bytes:
    return json.dumps({"type": kind, "object": _with_kind(resource, obj)}).encode() + b"\n"
