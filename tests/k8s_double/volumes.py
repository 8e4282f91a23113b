"""The files a kubelet would mount into a container from ConfigMap and Secret volumes.

``configMap``, ``secret`` and ``projected`` (of ConfigMaps and Secrets) volumes become
``{mountPath: {relative path: bytes}}``; a runner that can mount (the Docker runner)
puts them there, the local runner cannot and ignores them, as it ignores every other
volume. A ConfigMap or Secret that does not exist yet is a :class:`MountError`: the
kubelet keeps the pod in ``ContainerCreating`` with a ``FailedMount`` event and tries
again, as a real one does, unless the source is ``optional``.
"""

from __future__ import annotations

import base64
from typing import Optional

from .validation import decode_secret_data


class MountError(Exception):
    """A volume's source is missing (``FailedMount``)."""


def _source_files(store, namespace: str, kind: str, ref: dict) -> Optional[dict[str, bytes]]:
    name = ref.get("name") if kind == "configmap" else ref.get("secretName") or ref.get("name")
    obj = store.get("configmaps" if kind == "configmap" else "secrets", namespace, name)
    if obj is None:
        if ref.get("optional"):
            return None
        raise MountError(f'{kind} "{name}" not found')
    if kind == "configmap":
        values = {k: v.encode() for k, v in (obj.get("data") or {}).items()}
        values.update({k: base64.b64decode(v) for k, v in (obj.get("binaryData") or {}).items()})
    else:
        values = decode_secret_data(obj)
    items = ref.get("items")
    if not items:
        return values
    files = {}
    for item in items:
        if item["key"] not in values:
            if ref.get("optional"):
                continue
            raise MountError(f'configmap references non-existent config key: {item["key"]}'
                             if kind == "configmap" else
                             f'references non-existent secret key: {item["key"]}')
        files[item["path"]] = values[item["key"]]
    return files


def _volume_files(store, namespace: str, volume: dict) -> Optional[dict[str, bytes]]:
    if volume.get("configMap") is not None:
        return _source_files(store, namespace, "configmap", volume["configMap"]) or {}
    if volume.get("secret") is not None:
        return _source_files(store, namespace, "secret", volume["secret"]) or {}
    if volume.get("projected") is not None:
        files: dict[str, bytes] = {}
        for source in volume["projected"].get("sources") or []:
            for key, kind in (("configMap", "configmap"), ("secret", "secret")):
                if source.get(key) is not None:
                    files.update(_source_files(store, namespace, kind, source[key]) or {})
        return files
    return None  # not a volume of files the double can make


def container_files(store, pod: dict, container: dict) -> dict[str, dict[str, bytes]]:
    """``{mountPath: {path: bytes}}`` for the container's ConfigMap and Secret mounts."""
    namespace = pod["metadata"]["namespace"]
    volumes = {v["name"]: v for v in pod["spec"].get("volumes") or []}
    mounted = {}
    for mount in container.get("volumeMounts") or []:
        volume = volumes.get(mount["name"])
        if volume is None:
            continue
        try:
            files = _volume_files(store, namespace, volume)
        except MountError as exc:
            raise MountError(f'MountVolume.SetUp failed for volume "{mount["name"]}" : {exc}') from None
        if files is not None:
            mounted[mount["mountPath"]] = files
    return mounted
