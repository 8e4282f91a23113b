"""The ``k8s_api`` pytest fixture: a running double plus client configuration.

Use it from a test module or conftest with
``from k8s_double.fixture import k8s_api  # noqa: F401`` (or list
``"k8s_double.fixture"`` in ``pytest_plugins``).
"""

from __future__ import annotations

import dataclasses
import secrets
from pathlib import Path

import pytest
import yaml
from kubernetes import client

from .server import ApiServerDouble


@dataclasses.dataclass
class K8sApi:
    """What a test gets: the double's hooks and two ways to reach it."""
    server: ApiServerDouble
    configuration: client.Configuration
    kubeconfig_path: Path
    token: str
    namespace: str = "default"

    def core_v1(self) -> client.CoreV1Api:
        """A ``CoreV1Api`` on :attr:`configuration`."""
        return client.CoreV1Api(client.ApiClient(self.configuration))


def write_kubeconfig(path: Path, host: str, token: str, namespace: str = "default") -> Path:
    """A kubeconfig with one context pointing at ``host`` with a bearer token."""
    path.write_text(yaml.safe_dump({
        "apiVersion": "v1", "kind": "Config", "preferences": {},
        "clusters": [{"name": "double", "cluster": {"server": host}}],
        "users": [{"name": "double", "user": {"token": token}}],
        "contexts": [{"name": "double", "context": {
            "cluster": "double", "user": "double", "namespace": namespace}}],
        "current-context": "double",
    }))
    return path


def _serve(tmp_path: Path, make_runner=None):
    """An :class:`ApiServerDouble` (runner made by ``make_runner(kubeconfig)``) while the
    generator runs; it fails the test at the end if the double itself raised internally."""
    token = secrets.token_hex(16)
    kubeconfig = tmp_path / "kubeconfig"
    kubeconfig.touch()
    server = ApiServerDouble(runner=make_runner(kubeconfig) if make_runner else None, token=token)
    configuration = client.Configuration(host=server.host)
    configuration.api_key = {"BearerToken": token}
    configuration.api_key_prefix = {"BearerToken": "Bearer"}
    write_kubeconfig(kubeconfig, server.host, token)
    try:
        yield K8sApi(server, configuration, kubeconfig, token)
    finally:
        server.close()
    assert not server.errors, "the API server double failed:\n" + "\n".join(server.errors)


@pytest.fixture
def k8s_api(tmp_path):
    """Start an :class:`ApiServerDouble`; close it (and its pods) at teardown."""
    yield from _serve(tmp_path)


@pytest.fixture
def k8s_docker_api(tmp_path):
    """A double whose pods are Docker containers of their image (:mod:`.docker_runner`),
    with the kubeconfig mounted at the same path in each: a master pod reaches the
    double through it (``FIBERLITE_KUBECONFIG``), as a real one would through its
    service account."""
    from .docker_runner import DockerRunner
    yield from _serve(tmp_path, lambda kubeconfig: DockerRunner(
        mounts={str(kubeconfig): str(kubeconfig)}))
