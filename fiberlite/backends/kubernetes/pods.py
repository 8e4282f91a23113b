"""Pod and Secret bodies for jobs, built with the official client's models.

A job's pod: one container running ``JobSpec.command``, ``restartPolicy: Never``,
labels (sanitized), the run's key through a Secret (``secretKeyRef``), resources as
requests = limits, and, when the creating process itself runs in a pod (the *master
pod*): an ownerReference to it, its image (unless one is configured), its service
account, image pull secrets, shared volumes (PVCs, ConfigMaps, Secrets, NFS, CSI,
hostPath) with their mounts, and its container's environment.
"""
from __future__ import annotations

import base64
import re
from dataclasses import dataclass, field
from typing import Any

from ...units import format_memory
from ..base import TREE_DIGEST_ENV, TREE_PART_NAME, TREE_PARTS_ENV, JobSpec, TreeArchive

CONTAINER = "job"
GRACE_SECONDS = 5  # SIGTERM to SIGKILL, for terminate() and for deletions by Kubernetes
# volume kinds worth sharing with children; emptyDir is per pod, and the projected
# service account token volume is added by Kubernetes to every pod anyway
_SHARED_VOLUMES = ("persistent_volume_claim", "config_map", "secret", "nfs", "csi", "host_path")
# a job started in a packed working directory (JobSpec.tree): its parts are ConfigMaps
# (binaryData) owned by its pod, projected into one directory of the container
TREE_VOLUME = "fiberlite-tree"
TREE_MOUNT = "/var/run/fiberlite/tree"
TREE_PART_BYTES = 1_000_000  # under a ConfigMap's 1 MiB (etcd's request limit is 1.5 MiB)
TREE_KEY = "part"


def label_value(value: Any) -> str:
    """``value`` as a valid label value: at most 63 of ``[A-Za-z0-9_.-]``, alphanumeric ends."""
    text = re.sub(r"[^A-Za-z0-9_.-]+", "-", str(value))[:63]
    return text.strip("-_.")


def dns_name(value: Any, limit: int = 63) -> str:
    """``value`` as a DNS-1123 label (pod names double as host names)."""
    text = re.sub(r"[^a-z0-9-]+", "-", str(value).lower())
    text = re.sub(r"-{2,}", "-", text)[:limit].strip("-")
    return text or "fiberlite-job"


def selector(labels: dict[str, str]) -> str:
    return ",".join(f"{k}={v}" for k, v in sorted(labels.items()))


def cpu_quantity(cpus: float) -> str:
    return str(int(cpus)) if float(cpus).is_integer() else f"{round(cpus * 1000)}m"


def resources(spec: JobSpec) -> Any:
    """Requests equal to limits for cpu, memory and ``nvidia.com/gpu`` (None if none)."""
    from kubernetes import client
    wanted: dict[str, str] = {}
    if spec.cpu:
        wanted["cpu"] = cpu_quantity(spec.cpu)
    if spec.memory:
        wanted["memory"] = format_memory(int(spec.memory))
    if spec.gpu:
        wanted["nvidia.com/gpu"] = str(int(spec.gpu))
    if not wanted:
        return None
    return client.V1ResourceRequirements(requests=dict(wanted), limits=dict(wanted))


def _escape(value: str) -> str:
    """Keep ``$(NAME)`` literal: Kubernetes expands it in env values and commands."""
    return str(value).replace("$(", "$$(")


@dataclass
class MasterPod:
    """What children take from the pod the current process runs in."""

    name: str
    namespace: str
    uid: str
    image: str | None
    pod_ip: str | None
    service_account: str | None
    image_pull_secrets: list = field(default_factory=list)
    volumes: list = field(default_factory=list)
    mounts: list = field(default_factory=list)
    env: list = field(default_factory=list)
    env_from: list = field(default_factory=list)

    @classmethod
    def from_pod(cls, pod: Any, container_name: str | None = None) -> "MasterPod":
        spec, status = pod.spec, pod.status
        containers = spec.containers or []
        container = next((c for c in containers if c.name == container_name), None) \
            or (containers[0] if containers else None)
        volumes = [v for v in (spec.volumes or [])
                   if any(getattr(v, kind, None) is not None for kind in _SHARED_VOLUMES)]
        names = {v.name for v in volumes}
        mounts = [m for m in (getattr(container, "volume_mounts", None) or []) if m.name in names]
        env = [e for e in (getattr(container, "env", None) or [])
               if not e.name.startswith("FIBERLITE_")]
        return cls(name=pod.metadata.name, namespace=pod.metadata.namespace, uid=pod.metadata.uid,
                   image=getattr(container, "image", None),
                   pod_ip=getattr(status, "pod_ip", None) if status else None,
                   service_account=spec.service_account_name,
                   image_pull_secrets=list(spec.image_pull_secrets or []),
                   volumes=volumes, mounts=mounts, env=env,
                   env_from=list(getattr(container, "env_from", None) or []))

    def owner_reference(self) -> Any:
        """Children are deleted by Kubernetes' garbage collector when this pod goes.
        (No ``blockOwnerDeletion``: it would need update rights on pods/finalizers.)"""
        from kubernetes import client
        return client.V1OwnerReference(api_version="v1", kind="Pod", name=self.name, uid=self.uid)


def _volumes(spec: JobSpec) -> tuple[list, list]:
    """``JobSpec.volumes``: ``{PVC name or /node/path: path in the job}``."""
    from kubernetes import client
    volumes, mounts = [], []
    for i, (source, target) in enumerate(sorted(spec.volumes.items())):
        name = f"fiberlite-vol-{i}"
        if str(source).startswith("/"):
            volumes.append(client.V1Volume(name=name, host_path=client.V1HostPathVolumeSource(path=source)))
        else:
            claim = str(source).removeprefix("pvc:")
            volumes.append(client.V1Volume(name=name, persistent_volume_claim=(
                client.V1PersistentVolumeClaimVolumeSource(claim_name=claim))))
        mounts.append(client.V1VolumeMount(name=name, mount_path=target))
    return volumes, mounts


def tree_map_names(pod_name: str, tree: TreeArchive) -> list[str]:
    """The names of the ConfigMaps that hold ``tree`` for pod ``pod_name``."""
    count = len(tree.parts(TREE_PART_BYTES))
    return [f"{pod_name}-tree-{i}" for i in range(count)]


def _tree_volume(pod_name: str, tree: TreeArchive) -> tuple[Any, Any]:
    """One projected volume of every part, as ``part-0000``... in :data:`TREE_MOUNT`."""
    from kubernetes import client
    sources = [client.V1VolumeProjection(config_map=client.V1ConfigMapProjection(
        name=map_name, items=[client.V1KeyToPath(key=TREE_KEY, path=TREE_PART_NAME.format(i))]))
        for i, map_name in enumerate(tree_map_names(pod_name, tree))]
    volume = client.V1Volume(name=TREE_VOLUME, projected=client.V1ProjectedVolumeSource(
        sources=sources))
    return volume, client.V1VolumeMount(name=TREE_VOLUME, mount_path=TREE_MOUNT, read_only=True)


def build_tree_maps(pod: Any, tree: TreeArchive, labels: dict[str, str]) -> list[Any]:
    """The ConfigMaps of ``tree`` for the created ``pod``, owned by it (they go with it)."""
    from kubernetes import client
    owner = client.V1OwnerReference(api_version="v1", kind="Pod", name=pod.metadata.name,
                                    uid=pod.metadata.uid)
    return [client.V1ConfigMap(
        api_version="v1", kind="ConfigMap",
        metadata=client.V1ObjectMeta(name=map_name, labels=labels or None, owner_references=[owner]),
        binary_data={TREE_KEY: base64.b64encode(part).decode()}, immutable=True)
        for map_name, part in zip(tree_map_names(pod.metadata.name, tree),
                                  tree.parts(TREE_PART_BYTES))]


def build_pod(spec: JobSpec, name: str, image: str, master: MasterPod | None,
              secret_name: str | None, service_account: str | None = None,
              labels: dict[str, str] | None = None) -> Any:
    """The ``V1Pod`` for one job (``master`` given only when in the jobs' namespace);
    ``labels`` default to the spec's, sanitized."""
    from kubernetes import client
    env: dict[str, Any] = {}
    if master is not None:
        env.update((e.name, e) for e in master.env)
    for key, value in spec.env.items():
        env[key] = client.V1EnvVar(name=key, value=_escape(value))
    for key, path in (("FIBERLITE_POD_NAME", "metadata.name"),
                      ("FIBERLITE_POD_NAMESPACE", "metadata.namespace"),
                      ("FIBERLITE_POD_IP", "status.podIP")):
        env[key] = client.V1EnvVar(name=key, value_from=client.V1EnvVarSource(
            field_ref=client.V1ObjectFieldSelector(field_path=path)))
    for key in spec.secret_env:
        if secret_name is None:
            raise ValueError("a job with secret environment needs a Secret")
        env[key] = client.V1EnvVar(name=key, value_from=client.V1EnvVarSource(
            secret_key_ref=client.V1SecretKeySelector(name=secret_name, key=key)))
    volumes, mounts = _volumes(spec)
    if master is not None:
        taken = {m.mount_path for m in mounts}
        volumes = list(master.volumes) + volumes
        mounts = [m for m in master.mounts if m.mount_path not in taken] + mounts
    if spec.tree is not None:
        volume, mount = _tree_volume(name, spec.tree)
        volumes.append(volume)
        mounts.append(mount)
        for key, value in ((TREE_PARTS_ENV, TREE_MOUNT), (TREE_DIGEST_ENV, spec.tree.digest)):
            env[key] = client.V1EnvVar(name=key, value=value)
    container = client.V1Container(
        name=CONTAINER, image=image, command=[_escape(a) for a in spec.command],
        env=list(env.values()), env_from=list(master.env_from) if master else None,
        resources=resources(spec), volume_mounts=mounts or None,
        # the master pod's working directory exists in the same image; elsewhere it may not
        working_dir=spec.cwd if master is not None and spec.cwd else None)
    if labels is None:
        labels = {k: label_value(v) for k, v in spec.labels.items()}
    metadata = client.V1ObjectMeta(
        name=name, labels=labels or None,
        owner_references=[master.owner_reference()] if master is not None else None)
    pod_spec = client.V1PodSpec(
        containers=[container], restart_policy="Never", volumes=volumes or None,
        termination_grace_period_seconds=GRACE_SECONDS, enable_service_links=False,
        # the pause container becomes PID 1: Python then dies on SIGTERM (as PID 1 it would
        # ignore it, and every terminate() would wait out the grace period)
        share_process_namespace=True,
        service_account_name=service_account or (master.service_account if master else None),
        image_pull_secrets=(master.image_pull_secrets or None) if master else None)
    return client.V1Pod(api_version="v1", kind="Pod", metadata=metadata, spec=pod_spec)


def build_secret(prefix: str, data: dict[str, str], labels: dict[str, str],
                 master: MasterPod | None) -> Any:
    """A Secret holding ``data`` (the run's key), named by the server from ``prefix``."""
    from kubernetes import client
    metadata = client.V1ObjectMeta(
        generate_name=dns_name(prefix, 50) + "-", labels=labels or None,
        owner_references=[master.owner_reference()] if master is not None else None)
    return client.V1Secret(api_version="v1", kind="Secret", metadata=metadata,
                           string_data=dict(data), type="Opaque")
