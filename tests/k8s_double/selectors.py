"""Label and field selectors, parsed and matched like the API server does."""

from __future__ import annotations

import re
from typing import Callable

from .errors import bad_request

Predicate = Callable[[dict], bool]

# Fields each resource can be filtered on (the rest are a 400, as for real).
FIELDS = {
    "pods": {"metadata.name", "metadata.namespace", "spec.nodeName",
             "spec.restartPolicy", "spec.schedulerName",
             "spec.serviceAccountName", "status.phase", "status.podIP",
             "status.nominatedNodeName"},
    "secrets": {"metadata.name", "metadata.namespace", "type"},
    "configmaps": {"metadata.name", "metadata.namespace"},
    "events": {"metadata.name", "metadata.namespace", "involvedObject.kind",
               "involvedObject.namespace", "involvedObject.name",
               "involvedObject.uid", "involvedObject.apiVersion",
               "involvedObject.resourceVersion", "involvedObject.fieldPath",
               "reason", "reportingComponent", "source", "type"},
}

_REQUIREMENT = re.compile(
    r"^\s*(?P<neg>!)?\s*(?P<key>[A-Za-z0-9./_-]+)\s*"
    r"(?:(?P<op>==|=|!=|\s+in\s+|\s+notin\s+)\s*(?P<val>\([^)]*\)|[A-Za-z0-9._-]*))?\s*$")


def _split(selector: str) -> list[str]:
    """Split on commas that are not inside ``( ... )``."""
    parts, depth, cur = [], 0, ""
    for ch in selector:
        depth += ch == "("
        depth -= ch == ")"
        if ch == "," and depth == 0:
            parts.append(cur)
            cur = ""
        else:
            cur += ch
    parts.append(cur)
    return [p for p in parts if p.strip()]


def label_selector(selector: str | None) -> Predicate:
    """Predicate on an object's ``metadata.labels``; equality and set based."""
    if not selector:
        return lambda obj: True
    tests = []
    for part in _split(selector):
        m = _REQUIREMENT.match(part)
        if not m or (m["neg"] and m["op"]):
            raise bad_request(f"unable to parse requirement: {part.strip()!r}")
        key, op, val = m["key"], (m["op"] or "").strip(), m["val"]
        if op in ("in", "notin"):
            if not (val or "").startswith("("):
                raise bad_request(f"unable to parse requirement: {part.strip()!r}")
            values = {v.strip() for v in val[1:-1].split(",")}
            tests.append(_set_test(key, values, op == "in"))
        elif op:
            tests.append(_eq_test(key, val or "", op != "!="))
        else:
            tests.append(_exists_test(key, not m["neg"]))
    return lambda obj: all(t(obj.get("metadata", {}).get("labels") or {})
                           for t in tests)


def _eq_test(key, value, equal):
    return lambda labels: (labels.get(key) == value) == equal


def _set_test(key, values, inside):
    return lambda labels: (labels.get(key) in values) == inside


def _exists_test(key, present):
    return lambda labels: (key in labels) == present


def field_selector(resource: str, selector: str | None) -> Predicate:
    """Predicate for ``fieldSelector`` (``=``, ``==`` and ``!=`` only)."""
    if not selector:
        return lambda obj: True
    tests = []
    for part in _split(selector):
        m = re.match(r"^\s*([A-Za-z.]+)\s*(==|!=|=)\s*(.*?)\s*$", part)
        if not m:
            raise bad_request(f"invalid selector: '{selector}'; can't understand '{part}'")
        field, op, value = m.groups()
        if field not in FIELDS.get(resource, ()):
            raise bad_request(f'field label not supported: {field}')
        tests.append(_field_test(field, value, op != "!="))
    return lambda obj: all(t(obj) for t in tests)


def _field_test(field, value, equal):
    def test(obj):
        cur = obj
        for part in field.split("."):
            cur = cur.get(part) if isinstance(cur, dict) else None
        if field == "source" and isinstance(cur, dict):
            cur = cur.get("component")
        return (str(cur or "") == value) == equal
    return test
