"""Reaching a Kubernetes API server: which configuration, which namespace, and the
one-line errors users see when a call fails.

Configuration, first match wins: the ``kubeconfig`` setting (unless its file is missing
in a pod, as when a child inherits its master's setting); the in-cluster service
account (``KUBERNETES_SERVICE_HOST`` and a mounted token: the process runs in a pod);
``$KUBECONFIG`` or ``~/.kube/config``. Namespace: the ``namespace`` setting; the pod's
own namespace (service account mount); the kubeconfig context's namespace; ``default``.
"""
from __future__ import annotations

import json
import os
import re
from dataclasses import dataclass
from typing import Any

from ...errors import BackendError

SERVICE_ACCOUNT_DIR = "/var/run/secrets/kubernetes.io/serviceaccount"
RBAC_HINT = "grant it with the Role in docs/kubernetes/rbac.yaml (kubectl apply -f docs/kubernetes/rbac.yaml)"
# (connect, read) seconds for ordinary calls: an unreachable server fails within seconds
TIMEOUT = (5, 30)


def in_cluster() -> bool:
    """True when this process runs in a pod with a service account token mounted."""
    return bool(os.environ.get("KUBERNETES_SERVICE_HOST")) and \
        os.path.isfile(os.path.join(SERVICE_ACCOUNT_DIR, "token"))


def pod_namespace() -> str | None:
    """The namespace of the pod this process runs in (service account mount), if any."""
    try:
        with open(os.path.join(SERVICE_ACCOUNT_DIR, "namespace")) as fh:
            return fh.read().strip() or None
    except OSError:
        return None


@dataclass
class Connection:
    """A loaded client configuration and the namespace jobs go to."""

    configuration: Any  # kubernetes.client.Configuration
    namespace: str
    source: str  # for messages: "kubeconfig /path" or "in-cluster service account"

    @property
    def host(self) -> str:
        return self.configuration.host

    def core_v1(self) -> Any:
        from kubernetes import client
        return client.CoreV1Api(client.ApiClient(self.configuration))


def connect(kubeconfig: str | None, namespace: str | None) -> Connection:
    """Load the cluster configuration; :class:`BackendError` saying how to fix it if none."""
    try:
        from kubernetes import client, config
        from kubernetes.config.config_exception import ConfigException
    except ImportError:
        raise BackendError("the kubernetes backend needs the kubernetes client: "
                           "pip install 'fiberlite[kubernetes]'") from None
    configuration = client.Configuration()
    context_namespace = None
    if kubeconfig and not os.path.isfile(os.path.expanduser(kubeconfig)) and in_cluster():
        kubeconfig = None  # a setting inherited from a master outside the cluster: use the pod's
    if kubeconfig:
        path = os.path.expanduser(kubeconfig)
        if not os.path.isfile(path):
            raise BackendError(f"kubeconfig {path} (setting kubeconfig) does not exist: "
                               "point FIBERLITE_KUBECONFIG / fiberlite.init(kubeconfig=...) at a kubeconfig file")
        source = f"kubeconfig {path}"
    elif in_cluster():
        try:
            config.load_incluster_config(client_configuration=configuration)
        except ConfigException as exc:
            raise BackendError(f"cannot use the pod's service account for Kubernetes: {exc}") from None
        return Connection(configuration, namespace or pod_namespace() or "default",
                          "in-cluster service account")
    else:
        paths = [os.path.expanduser(p) for p in
                 (os.environ.get("KUBECONFIG") or "~/.kube/config").split(os.pathsep) if p]
        if not any(os.path.isfile(p) for p in paths):
            raise BackendError(
                "no Kubernetes cluster configuration: not running in a pod and no kubeconfig at "
                f"{os.pathsep.join(paths)}; set the kubeconfig setting (FIBERLITE_KUBECONFIG=/path "
                "or fiberlite.init(kubeconfig=...)) or run fiberlite in a pod")
        path = None
        source = f"kubeconfig {os.pathsep.join(paths)}"
    try:
        config.load_kube_config(config_file=path, client_configuration=configuration,
                                persist_config=False)
        _, active = config.list_kube_config_contexts(config_file=path)
        context_namespace = ((active or {}).get("context") or {}).get("namespace")
    except (ConfigException, OSError, ValueError, TypeError) as exc:
        raise BackendError(f"cannot use {source}: {exc}") from None
    return Connection(configuration, namespace or context_namespace or "default", source)


def status_message(exc: Any) -> str:
    """The ``message`` of a Kubernetes ``Status`` error body (else the HTTP reason)."""
    body = getattr(exc, "body", None)
    if body:
        try:
            message = json.loads(body).get("message")
            if message:
                return str(message)
        except (ValueError, AttributeError):
            pass
    return str(getattr(exc, "reason", None) or exc)


def api_error(exc: BaseException, action: str, conn: Connection) -> BackendError:
    """A one-line :class:`BackendError` for a failed call; ``action`` like ``create pod x``."""
    from kubernetes.client.exceptions import ApiException
    if isinstance(exc, ApiException):
        message = status_message(exc)
        if exc.status == 403:
            found = re.search(r'(User "[^"]*") cannot (\S+) resource "([^"]+)"', message)
            if found:
                who, verb, resource = found.groups()
                text = (f"Kubernetes RBAC forbids {verb} on {resource} in namespace "
                        f"{conn.namespace!r} for {who}: {RBAC_HINT}")
            else:
                text = f"Kubernetes forbids to {action} ({message}): {RBAC_HINT}"
        elif exc.status == 401:
            text = (f"Kubernetes rejected the credentials of {conn.source} (401 Unauthorized) "
                    f"while trying to {action}: refresh the token or fix the kubeconfig")
        elif exc.status == 404 and message.startswith("namespaces "):
            text = (f"namespace {conn.namespace!r} does not exist on {conn.host}: create it or "
                    "set the namespace setting (FIBERLITE_NAMESPACE)")
        elif exc.status == 422:
            text = f"Kubernetes refused to {action}: {message}"
        else:
            text = f"cannot {action}: Kubernetes answered {exc.status} {exc.reason}: {message}"
    elif not _is_connection_error(exc):
        text = f"cannot {action}: {type(exc).__name__}: {exc}"
    else:
        reason = getattr(exc, "reason", None) or exc
        text = (f"cannot reach the Kubernetes API server at {conn.host} ({conn.source}) to "
                f"{action}: {reason}; check that the cluster runs and the kubeconfig points at it")
    return BackendError(" ".join(str(text).split()))


def _is_connection_error(exc: BaseException) -> bool:
    import urllib3
    return isinstance(exc, (urllib3.exceptions.HTTPError, OSError))


def is_status(exc: BaseException, *codes: int) -> bool:
    """True for an ``ApiException`` with one of ``codes``."""
    from kubernetes.client.exceptions import ApiException
    return isinstance(exc, ApiException) and exc.status in codes
