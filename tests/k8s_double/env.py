"""A container's environment, built the way a kubelet builds it."""

from __future__ import annotations

import math
import os
import re
from typing import Optional

from .decode import quantity
from .validation import decode_secret_data

NODE = "double-node"
HOST_IP = "127.0.0.1"


class ConfigError(Exception):
    """The container's env cannot be built (``CreateContainerConfigError``)."""


def expand(text: str, env: dict) -> str:
    """Kubernetes ``$(VAR)`` expansion; ``$$`` escapes, unknown names stay."""
    return re.sub(r"\$\$|\$\(([A-Za-z_][A-Za-z0-9_.-]*)\)",
                  lambda m: "$" if m.group(0) == "$$" else env.get(m.group(1), m.group(0)),
                  text)


def container_env(store, pod: dict, c: dict) -> dict:
    """The container's environment as a kubelet builds it; ConfigError if it can't."""
    ns, name = pod["metadata"]["namespace"], pod["metadata"]["name"]
    env = {"HOSTNAME": pod["spec"].get("hostname") or name}
    for source in c.get("envFrom") or []:
        if source.get("secretRef"):
            ref = source["secretRef"]
            secret = store.get("secrets", ns, ref["name"])
            if secret is None:
                if ref.get("optional"):
                    continue
                raise ConfigError(f'secret "{ref["name"]}" not found')
            for key, value in decode_secret_data(secret).items():
                env[source.get("prefix", "") + key] = value.decode(errors="replace")
        else:
            raise ConfigError("only envFrom.secretRef is supported by the API server double")
    for var in c.get("env") or []:
        env_value = _env_value(store, pod, c, var.get("valueFrom"), env) \
            if var.get("valueFrom") else expand(var.get("value") or "", env)
        if env_value is not None:
            env[var["name"]] = env_value
    return env


def _env_value(store, pod, c, source, env) -> Optional[str]:
    ns = pod["metadata"]["namespace"]
    if source.get("secretKeyRef"):
        ref = source["secretKeyRef"]
        secret = store.get("secrets", ns, ref["name"])
        data = decode_secret_data(secret) if secret else None
        if data is None or ref["key"] not in data:
            if ref.get("optional"):
                return None
            raise ConfigError(f'secret "{ref["name"]}" not found' if secret is None else
                              f'couldn\'t find key {ref["key"]} in Secret {ns}/{ref["name"]}')
        return data[ref["key"]].decode(errors="replace")
    if source.get("fieldRef"):
        return _field_ref(pod, source["fieldRef"]["fieldPath"])
    if source.get("resourceFieldRef"):
        return _resource_ref(c, source["resourceFieldRef"])
    raise ConfigError("configMapKeyRef is not supported by the API server double")


def _field_ref(pod: dict, path: str) -> str:
    meta, spec = pod["metadata"], pod["spec"]
    label = re.fullmatch(r"metadata\.(labels|annotations)\['(.+)'\]", path)
    if label:
        return (meta.get(label.group(1)) or {}).get(label.group(2), "")
    values = {"metadata.name": meta["name"], "metadata.namespace": meta["namespace"],
              "metadata.uid": meta["uid"], "spec.nodeName": NODE,
              "spec.serviceAccountName": spec.get("serviceAccountName", ""),
              "status.hostIP": HOST_IP, "status.podIP": HOST_IP,
              "status.hostIPs": HOST_IP, "status.podIPs": HOST_IP}
    if path not in values:
        raise ConfigError(f'unsupported fieldRef fieldPath "{path}"')
    return values[path]


def _resource_ref(c: dict, ref: dict) -> str:
    section, _, resource = ref["resource"].partition(".")
    value = ((c.get("resources") or {}).get(section) or {}).get(resource)
    if value is None:   # node allocatable stands in for "no limit"
        value = str(os.cpu_count()) if resource == "cpu" else \
            str(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES"))
    return str(math.ceil(quantity(value) / quantity(ref.get("divisor") or "1")))
