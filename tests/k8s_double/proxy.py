"""The pod proxy: ``GET /api/v1/namespaces/{ns}/pods/{name}:{port}/proxy/{path}``.

As the API server does, the request goes on to ``{podIP}:{port}/{path}`` (the double's
pods run on this machine, so the pod's IP is loopback) and the pod's answer comes back
with its status and content type. Forbidding ``get`` on ``pods/proxy`` makes it a 403.
"""
from __future__ import annotations

import urllib.error
import urllib.request

from .errors import ApiError, forbidden, not_found
from .wire import Request, Response

ROUTE = r"^/api/v1/namespaces/(?P<ns>[^/]+)/pods/(?P<pod>[^/:]+):(?P<port>\d+)/proxy(?P<rest>/.*)?$"


def proxy(api, req: Request, ns: str, pod: str, port: str, rest: str | None = None) -> Response:
    if api.denies("get", "pods/proxy", ns):
        raise forbidden(api.user, "get", "pods/proxy", ns, pod)
    with api.store.cond:
        found = api.store.get("pods", ns, pod)
    if found is None:
        raise not_found("pods", pod)
    ip = found.get("status", {}).get("podIP")
    if not ip:
        raise ApiError(503, f"pod {pod} has no IP address yet")
    query = "?" + "&".join(f"{k}={v}" for k, v in req.query.items()) if req.query else ""
    url = f"http://{ip}:{port}{rest or '/'}{query}"
    try:
        with urllib.request.urlopen(url, timeout=10) as answer:
            return _relayed(answer.status, answer.read(), answer.headers)
    except urllib.error.HTTPError as answer:
        return _relayed(answer.code, answer.read(), answer.headers)
    except OSError as exc:
        raise ApiError(503, f"error trying to reach service: {exc}") from None


def _relayed(code: int, data: bytes, headers) -> Response:
    """The pod's answer as the double sends a body of bytes: one chunk of a stream."""
    return Response(code, (chunk for chunk in [data]), headers.get("Content-Type", ""))
