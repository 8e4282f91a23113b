"""The Kubernetes backend: every job a pod, owned by the master pod.

- :mod:`.backend`: ``KubernetesBackend``, the seam's methods and the command line's;
- :mod:`.session`: the jobs of one cluster configuration (client, namespace, master
  pod, Secrets, watches), which the backend hands every job's calls to;
- :mod:`.api`: the client, in-cluster or kubeconfig, and its errors;
- :mod:`.pods`: a ``JobSpec`` as a pod and its secret;
- :mod:`.status`: what a pod's status means for its job;
- :mod:`.watch`: one watch for every pod of the run.
"""
from .backend import KubernetesBackend
from .session import PodJob

__all__ = ["KubernetesBackend", "PodJob"]
