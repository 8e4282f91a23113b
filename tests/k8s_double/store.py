"""The double's etcd: objects, a monotonic resourceVersion and watch history."""

from __future__ import annotations

import copy
import datetime
import threading
import uuid
from typing import Callable, Iterator, NamedTuple, Optional

from .errors import ApiError


def now() -> str:
    """RFC 3339 time in seconds, as Kubernetes writes ``Time`` fields."""
    return datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


class Change(NamedTuple):
    """One entry of the watch history."""
    rv: int
    resource: str
    namespace: str
    type: str          # ADDED, MODIFIED or DELETED
    obj: dict


class Store:
    """Objects by ``(resource, namespace, name)``; every change is recorded.

    All access happens under ``cond`` (re-entrant); ``cond`` is notified on
    every change so watches, log followers and the kubelet can wait on it.
    """

    def __init__(self):
        self.cond = threading.Condition(threading.RLock())
        self.rv = 1000           # never "0", which means "any" to a watch
        self.objects: dict[str, dict[tuple[str, str], dict]] = {}
        self.history: list[Change] = []
        self.compacted = 0         # watches from an rv below this get 410 Gone
        self.closed = False

    def notify(self) -> None:
        with self.cond:
            self.cond.notify_all()

    def get(self, resource: str, namespace: str, name: str) -> Optional[dict]:
        with self.cond:
            return self.objects.get(resource, {}).get((namespace, name))

    def find_uid(self, resource: str, namespace: str, uid: str) -> Optional[dict]:
        with self.cond:
            return next((o for (ns, _), o in self.objects.get(resource, {}).items()
                         if ns == namespace and o["metadata"]["uid"] == uid), None)

    def list(self, resource: str, namespace: Optional[str],
             match: Callable[[dict], bool] = lambda o: True) -> list[dict]:
        with self.cond:
            items = [o for (ns, _), o in self.objects.get(resource, {}).items()
                     if namespace in (None, ns) and match(o)]
        return sorted(items, key=lambda o: (o["metadata"]["namespace"], o["metadata"]["name"]))

    def create(self, resource: str, obj: dict) -> dict:
        """Store a new object, assigning uid, resourceVersion and creationTimestamp."""
        meta = obj["metadata"]
        with self.cond:
            meta["uid"] = str(uuid.uuid4())
            meta["creationTimestamp"] = now()
            return self._commit(resource, obj, "ADDED")

    def update(self, resource: str, obj: dict) -> dict:
        with self.cond:
            return self._commit(resource, obj, "MODIFIED")

    def delete(self, resource: str, namespace: str, name: str) -> Optional[dict]:
        with self.cond:
            obj = self.objects.get(resource, {}).pop((namespace, name), None)
            if obj is not None:
                self._commit(resource, obj, "DELETED", store=False)
            return obj

    def _commit(self, resource: str, obj: dict, kind: str, store: bool = True) -> dict:
        if self.closed:
            raise ApiError(503, "the double is shut down", reason="ServiceUnavailable")
        self.rv += 1
        meta = obj["metadata"]
        meta["resourceVersion"] = str(self.rv)
        if store:
            self.objects.setdefault(resource, {})[(meta["namespace"], meta["name"])] = obj
        self.history.append(Change(self.rv, resource, meta["namespace"], kind,
                                   copy.deepcopy(obj)))
        self.cond.notify_all()
        return obj

    def changes_after(self, rv: int, resource: str) -> Iterator[Change]:
        """History entries of ``resource`` newer than ``rv`` (call under ``cond``)."""
        lo, hi = 0, len(self.history)
        while lo < hi:                       # history is sorted by rv
            mid = (lo + hi) // 2
            if self.history[mid].rv <= rv:
                lo = mid + 1
            else:
                hi = mid
        return (c for c in self.history[lo:] if c.resource == resource)
