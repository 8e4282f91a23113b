"""How a user opens the master pod's live page (the ``dashboard`` setting) from their
own machine: ``kubectl port-forward`` to the master pod, or the API server's pod proxy,
which ``fiberlite run`` opens on loopback for them (:mod:`.page_forward`) when the page
is bound beyond the pod's loopback."""
from __future__ import annotations

from typing import Any

LOOPBACK = ("127.0.0.1", "localhost", "::1")


def hint(backend: Any, namespace: str, pod: str, address: tuple[str, int]) -> str:
    """Lines telling how to open the page served at ``address`` in ``pod``."""
    host, port = address
    if port == 0:
        return ("fiberlite: the master's page is on a port chosen at start (dashboard port 0): "
                "its first lines name it; then: "
                f"kubectl port-forward -n {namespace} pod/{pod} PORT\n")
    lines = [f"fiberlite: the master's page: kubectl port-forward -n {namespace} pod/{pod} "
             f"{port}:{port}   then open http://127.0.0.1:{port}/"]
    if host in LOOPBACK:
        lines.append(f"fiberlite: (bind it to 0.0.0.0:{port} with --dashboard to open it through "
                     f"the API server's pod proxy as well)")
    else:
        lines.append(f"fiberlite: or through the API server (kubectl proxy, or your credentials): "
                     f"{backend.pod_proxy_url(pod, port)}")
    return "\n".join(lines) + "\n"


def forward(backend: Any, pod: str, address: tuple[str, int]) -> Any:
    """A local door to the master pod's page through the API server's pod proxy, or None
    when the proxy cannot reach it (bound to the pod's loopback, or its port not known)."""
    host, port = address
    if host in LOOPBACK or port == 0:
        return None
    from .page_forward import PageForward
    return PageForward(lambda path: backend.pod_proxy_get(pod, port, path))
