"""The Kubernetes backend: every job a pod, owned by the master pod.

- :mod:`.backend`: ``KubernetesBackend``, the seam's methods and the command line's;
- :mod:`.session`: the jobs of one cluster configuration (client, namespace, master
  pod, Secrets, watches), which the backend hands every job's calls to;
- :mod:`.api`: the client, in-cluster or kubeconfig, and its errors;
- :mod:`.pods`: a ``JobSpec`` as a pod and its secret;
- :mod:`.status`: what a pod's status means for its job;
- :mod:`.watch`: one watch for every pod of the run;
- :mod:`.page`: how ``fiberlite run`` opens the master pod's page from here
  (:mod:`.page_forward`, through the API server).

Its settings are declared here (``SETTINGS``); the rest is imported when first used.
"""
from __future__ import annotations

from typing import TYPE_CHECKING

from ...config import Setting, text
from ..base import lazy_exports

SETTINGS = (
    Setting("namespace", None, text, "Kubernetes namespace (default: the pod's own, else 'default')"),
    Setting("kubeconfig", None, text, "kubeconfig file when running outside a cluster"),
)

__all__ = ["KubernetesBackend", "PodJob"]
__getattr__ = lazy_exports(__name__, {"KubernetesBackend": ".backend", "PodJob": ".session"})

if TYPE_CHECKING:
    from .backend import KubernetesBackend
    from .session import PodJob
