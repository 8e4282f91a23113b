"""Semantic validation and defaulting of pods and secrets (the 422s)."""

from __future__ import annotations

import base64
import re

from .decode import quantity
from .errors import bad_request, invalid

LABEL = r"[a-z0-9]([-a-z0-9]*[a-z0-9])?"
SUBDOMAIN = rf"{LABEL}(\.{LABEL})*"
QUALIFIED = r"([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9]"
MSG_LABEL = ("a lowercase RFC 1123 label must consist of lower case alphanumeric "
             "characters or '-', and must start and end with an alphanumeric character "
             "(e.g. 'my-name',  or '123-abc', regex used for validation is "
             f"'{LABEL}')")
MSG_SUBDOMAIN = ("a lowercase RFC 1123 subdomain must consist of lower case alphanumeric "
                 "characters, '-' or '.', and must start and end with an alphanumeric "
                 "character (e.g. 'example.com', regex used for validation is "
                 f"'{SUBDOMAIN}')")
MSG_QUALIFIED = ("must consist of alphanumeric characters, '-', '_' or '.', and must start "
                 "and end with an alphanumeric character (e.g. 'MyName',  or 'my.name',  "
                 f"or '123-abc', regex used for validation is '{QUALIFIED}')")
MSG_LABEL_VALUE = ("a valid label must be an empty string or consist of alphanumeric "
                   "characters, '-', '_' or '.', and must start and end with an alphanumeric "
                   "character (e.g. 'MyValue',  or 'my_value',  or '12345', regex used for "
                   f"validation is '({QUALIFIED})?')")
ENV_NAME = r"[-._a-zA-Z][-._a-zA-Z0-9]*"
CONFIG_KEY = r"[-._a-zA-Z0-9]+"
RESTART_POLICIES = ("Always", "OnFailure", "Never")


class Errors(list):
    """Collects ``(field, cause reason, message)`` like ``field.ErrorList``."""

    def required(self, field, detail=""):
        self.append((field, "FieldValueRequired",
                     "Required value" + (f": {detail}" if detail else "")))

    def invalid(self, field, value, detail):
        self.append((field, "FieldValueInvalid", f'Invalid value: "{value}": {detail}'))

    def duplicate(self, field, value):
        self.append((field, "FieldValueDuplicate", f'Duplicate value: "{value}"'))

    def unsupported(self, field, value, supported):
        values = ", ".join(f'"{s}"' for s in supported)
        self.append((field, "FieldValueNotSupported",
                     f'Unsupported value: "{value}": supported values: {values}'))

    def not_found(self, field, value):
        self.append((field, "FieldValueNotFound", f'Not found: "{value}"'))

    def too_long(self, field, limit):
        self.append((field, "FieldValueTooLong", f"Too long: must have at most {limit} bytes"))

    def raise_for(self, kind, name):
        if self:
            raise invalid(kind, name or "", list(self))


def check_name(errs: Errors, field: str, name: str, label: bool = False) -> None:
    """DNS-1123 label (<= 63) or subdomain (<= 253) name."""
    limit, pattern, msg = (63, LABEL, MSG_LABEL) if label else (253, SUBDOMAIN, MSG_SUBDOMAIN)
    if len(name) > limit:
        errs.invalid(field, name, f"must be no more than {limit} characters")
    if not re.fullmatch(pattern, name):
        errs.invalid(field, name, msg)


def check_labels(errs: Errors, field: str, labels: dict, values: bool = True) -> None:
    """Label (or annotation, ``values=False``) keys, and label values."""
    for key, value in (labels or {}).items():
        prefix, _, name = key.rpartition("/")
        if prefix:
            if len(prefix) > 253 or not re.fullmatch(SUBDOMAIN, prefix):
                errs.invalid(field, key, "prefix part " + MSG_SUBDOMAIN)
        if len(name) > 63:
            errs.invalid(field, key, "name part must be no more than 63 characters")
        if not re.fullmatch(QUALIFIED, name):
            errs.invalid(field, key, "name part " + MSG_QUALIFIED)
        if values and (len(value) > 63 or not re.fullmatch(f"({QUALIFIED})?", value)):
            errs.invalid(field, value, MSG_LABEL_VALUE if len(value) <= 63
                         else "must be no more than 63 characters")


def check_metadata(errs: Errors, meta: dict) -> None:
    """Name, labels, annotations and ownerReferences of any object."""
    if not meta.get("name") and not meta.get("generateName"):
        errs.required("metadata.name", "name or generateName is required")
    elif meta.get("name"):
        check_name(errs, "metadata.name", meta["name"])
    check_labels(errs, "metadata.labels", meta.get("labels"))
    check_labels(errs, "metadata.annotations", meta.get("annotations"), values=False)
    controllers = 0
    for ref in meta.get("ownerReferences") or []:
        for key, what in (("apiVersion", "version"), ("kind", "kind"),
                          ("name", "name"), ("uid", "uid")):
            if not ref.get(key):
                errs.invalid(f"metadata.ownerReferences.{key}", "",
                             f"{what} must not be empty")
        controllers += bool(ref.get("controller"))
    if controllers > 1:
        errs.invalid("metadata.ownerReferences", meta["ownerReferences"],
                     "Only one reference can have Controller set to true")


def validate_pod(pod: dict) -> None:
    """Raise a 422 ``Invalid`` for what the real server would refuse."""
    errs = Errors()
    meta, spec = pod.get("metadata") or {}, pod.get("spec") or {}
    check_metadata(errs, meta)
    containers = spec.get("containers") or []
    if not containers:
        errs.required("spec.containers")
    volumes = {v.get("name") for v in spec.get("volumes") or []}
    seen = set()
    for i, c in enumerate(containers):
        _check_container(errs, f"spec.containers[{i}]", c, seen, volumes)
    policy = spec.get("restartPolicy")
    if policy is not None and policy not in RESTART_POLICIES:
        errs.unsupported("spec.restartPolicy", policy, RESTART_POLICIES)
    if (spec.get("terminationGracePeriodSeconds") or 0) < 0:
        errs.invalid("spec.terminationGracePeriodSeconds",
                     spec["terminationGracePeriodSeconds"], "must be greater than or equal to 0")
    errs.raise_for("Pod", meta.get("name") or meta.get("generateName"))


def _check_container(errs, path, c, seen, volumes):
    name = c.get("name")
    if not name:
        errs.required(f"{path}.name")
    else:
        check_name(errs, f"{path}.name", name, label=True)
        if name in seen:
            errs.duplicate(f"{path}.name", name)
        seen.add(name)
    if not (c.get("image") or "").strip():
        errs.required(f"{path}.image")
    for j, env in enumerate(c.get("env") or []):
        _check_env(errs, f"{path}.env[{j}]", env)
    for j, mount in enumerate(c.get("volumeMounts") or []):
        if mount.get("name") not in volumes:
            errs.not_found(f"{path}.volumeMounts[{j}].name", mount.get("name"))
    _check_resources(errs, f"{path}.resources", c.get("resources") or {})


def _check_env(errs, path, env):
    name = env.get("name") or ""
    if not name:
        errs.required(f"{path}.name")
    elif not re.fullmatch(ENV_NAME, name):
        errs.invalid(f"{path}.name", name, "a valid environment variable name must consist "
                     "of alphabetic characters, digits, '_', '-', or '.', and must not start "
                     f"with a digit (regex used for validation is '{ENV_NAME}')")
    source = env.get("valueFrom")
    if source is None:
        return
    if env.get("value"):
        errs.invalid(f"{path}.valueFrom", "", "may not be specified when `value` is not empty")
    if len([k for k, v in source.items() if v is not None]) != 1:
        errs.invalid(f"{path}.valueFrom", "",
                     "may not have more than one field specified at a time")
    ref = source.get("secretKeyRef") or source.get("configMapKeyRef")
    if ref is not None:
        kind = "secretKeyRef" if "secretKeyRef" in source else "configMapKeyRef"
        for key in ("name", "key"):
            if not ref.get(key):
                errs.required(f"{path}.valueFrom.{kind}.{key}")


def _check_resources(errs, path, res):
    limits, requests = res.get("limits") or {}, res.get("requests") or {}
    for rname, value in requests.items():
        extended = "/" in rname and not rname.startswith("kubernetes.io/")
        if extended and rname not in limits:
            errs.required(f"{path}.limits", "Limit must be set for non overcommitable resources")
        elif extended and quantity(value) != quantity(limits[rname]):
            errs.invalid(f"{path}.requests[{rname}]", value,
                         f"must be equal to {rname} limit of {limits[rname]}")
        elif rname in limits and quantity(value) > quantity(limits[rname]):
            errs.invalid(f"{path}.requests", value,
                         f"must be less than or equal to {rname} limit of {limits[rname]}")
    for rname, value in limits.items():
        if "/" in rname and quantity(value) != int(quantity(value)):
            errs.invalid(f"{path}.limits[{rname}]", value, "must be an integer")


def default_pod(pod: dict) -> None:
    """Fill in what the API server's defaulting would (a subset)."""
    spec = pod["spec"]
    spec.setdefault("restartPolicy", "Always")
    spec.setdefault("terminationGracePeriodSeconds", 30)
    spec.setdefault("dnsPolicy", "ClusterFirst")
    spec.setdefault("schedulerName", "default-scheduler")
    spec.setdefault("serviceAccountName", spec.get("serviceAccount") or "default")
    spec.setdefault("serviceAccount", spec["serviceAccountName"])
    spec.setdefault("enableServiceLinks", True)
    spec.setdefault("securityContext", {})
    for c in spec["containers"]:
        tag = c["image"].rpartition("/")[2]
        c.setdefault("imagePullPolicy", "Always" if ":" not in tag or tag.endswith(":latest")
                     else "IfNotPresent")
        c.setdefault("terminationMessagePath", "/dev/termination-log")
        c.setdefault("terminationMessagePolicy", "File")
        res = c.setdefault("resources", {})
        for rname, value in (res.get("limits") or {}).items():
            res.setdefault("requests", {}).setdefault(rname, value)


def qos_class(pod: dict) -> str:
    """``Guaranteed``, ``Burstable`` or ``BestEffort``, from the containers' resources."""
    containers = pod["spec"]["containers"]
    res = [c.get("resources") or {} for c in containers]
    if not any(r.get("limits") or r.get("requests") for r in res):
        return "BestEffort"
    guaranteed = all(
        all(k in (r.get("limits") or {}) for k in ("cpu", "memory"))
        and (r.get("requests") or {}) == (r.get("limits") or {}) for r in res)
    return "Guaranteed" if guaranteed else "Burstable"


def validate_secret(secret: dict) -> None:
    """Keys, base64 values and total size of a secret."""
    errs = Errors()
    meta = secret.get("metadata") or {}
    check_metadata(errs, meta)
    size = 0
    for section in ("data", "stringData"):
        for key, value in (secret.get(section) or {}).items():
            if not re.fullmatch(CONFIG_KEY, key):
                errs.invalid(f"{section}[{key}]", key, "a valid config key must consist of "
                             "alphanumeric characters, '-', '_' or '.' (regex used for "
                             f"validation is '{CONFIG_KEY}')")
            size += len(value)
    if size > 1048576:
        errs.too_long("data", 1048576)
    errs.raise_for("Secret", meta.get("name") or meta.get("generateName"))


def validate_config_map(config_map: dict) -> None:
    """Keys (each in ``data`` or ``binaryData``, not both), base64 of ``binaryData`` and
    the 1 MiB limit on both together."""
    errs = Errors()
    meta = config_map.get("metadata") or {}
    check_metadata(errs, meta)
    size = 0
    data, binary = config_map.get("data") or {}, config_map.get("binaryData") or {}
    for section, values in (("data", data), ("binaryData", binary)):
        for key, value in values.items():
            if not re.fullmatch(CONFIG_KEY, key):
                errs.invalid(f"{section}[{key}]", key, "a valid config key must consist of "
                             "alphanumeric characters, '-', '_' or '.' (regex used for "
                             f"validation is '{CONFIG_KEY}')")
            if section == "binaryData":
                try:
                    size += len(base64.b64decode(value, validate=True))
                except ValueError as exc:
                    raise bad_request(f'ConfigMap in version "v1" cannot be handled as a '
                                      f"ConfigMap: illegal base64 data for key {key!r}: {exc}")
                if key in data:
                    errs.invalid(f"binaryData[{key}]", key, "duplicate of key present in data")
            else:
                size += len(value)
    if size > 1048576:
        errs.too_long("[]", 1048576)
    errs.raise_for("ConfigMap", meta.get("name") or meta.get("generateName"))


def decode_secret_data(secret: dict) -> dict[str, bytes]:
    """``data`` decoded from base64 (the 400 for bad base64 happens earlier)."""
    return {k: base64.b64decode(v) for k, v in (secret.get("data") or {}).items()}
