"""The garbage collector: dependents follow their owners (``ownerReferences``)."""

from __future__ import annotations

import threading
import traceback
from typing import Optional

from .errors import ApiError
from .wire import Request

DELAY = 0.05          # asynchronous, as for real (where it takes seconds)


class GarbageCollector:
    """Deletes pods, secrets and config maps whose owners (v1 Pods/Secrets) are gone."""

    def __init__(self, api):
        self.api = api

    def later(self, func, *args) -> None:
        timer = threading.Timer(DELAY, self._guarded, (func,) + args)
        timer.daemon = True
        timer.start()

    def _guarded(self, func, *args) -> None:
        try:
            if not self.api.store.closed:
                func(*args)
        except ApiError:
            pass
        except Exception:
            self.api.errors.append(traceback.format_exc())

    def _owner_exists(self, ns: str, ref: dict) -> Optional[bool]:
        """True/False for owners the double knows (v1 Pod/Secret), else None."""
        resource = {"Pod": "pods", "Secret": "secrets"}.get(ref.get("kind"))
        if ref.get("apiVersion") != "v1" or resource is None:
            return None
        obj = self.api.store.get(resource, ns, ref.get("name", ""))
        return obj is not None and obj["metadata"]["uid"] == ref.get("uid")

    def collect(self, ns: str, owner_uid: str, propagation: str) -> None:
        """Delete (or orphan) the dependents of a deleted owner, like the real GC."""
        with self.api.store.cond:
            for resource in ("pods", "secrets", "configmaps"):
                for obj in self.api.store.list(resource, ns):
                    refs = obj["metadata"].get("ownerReferences") or []
                    if not any(r.get("uid") == owner_uid for r in refs):
                        continue
                    if propagation == "Orphan":
                        obj["metadata"]["ownerReferences"] = [
                            r for r in refs if r.get("uid") != owner_uid]
                        self.api.store.update(resource, obj)
                    else:
                        self.collect_if_orphaned(resource, ns, obj["metadata"]["name"],
                                                 obj["metadata"]["uid"])

    def collect_if_orphaned(self, resource: str, ns: str, name: str, uid: str) -> None:
        """Delete the object if every owner it names is known to be absent."""
        with self.api.store.cond:
            obj = self.api.store.get(resource, ns, name)
            if obj is None or obj["metadata"]["uid"] != uid:
                return
            refs = obj["metadata"].get("ownerReferences") or []
            if refs and all(self._owner_exists(ns, r) is False for r in refs):
                self.api.delete(Request("DELETE", "", None), ns=ns, resource=resource, name=name)
