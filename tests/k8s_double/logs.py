"""Pod logs: ``GET /api/v1/namespaces/{ns}/pods/{name}/log``."""

from __future__ import annotations

import datetime
import time
from typing import Iterator

from .errors import bad_request, not_found
from .wire import Request, Response, is_true


def read_log(api, req: Request, ns: str, name: str) -> Response:
    """``GET .../pods/{name}/log``: text, or a chunk stream with ``follow``."""
    q = req.query
    with api.store.cond:
        pod = api.store.get("pods", ns, name)
        if pod is None:
            raise not_found("pods", name)
        names = [c["name"] for c in pod["spec"]["containers"]]
        container = q.get("container") or (names[0] if len(names) == 1 else None)
        if container is None:
            raise bad_request(f"a container name must be specified for pod {name}, "
                              f"choose one of: [{' '.join(names)}]")
        if container not in names:
            raise bad_request(f"container {container} is not valid for pod {name}")
        run = api.kubelet.runs.get((ns, name))
        buffers = run.logs.get(container, []) if run else []
        if is_true(q.get("previous")):
            if len(buffers) < 2:
                raise bad_request(f'previous terminated container "{container}" in pod '
                                  f'"{name}" not found')
            buf = buffers[-2]
        elif buffers:
            buf = buffers[-1]
        else:
            raise bad_request(_not_started(pod, container))
        covered = len(buf.lines)  # a follow goes on from here, whatever is written meanwhile
    since = float(q["sinceSeconds"]) if q.get("sinceSeconds") else None
    lines = [ln for ln in buf.lines[:covered] if since is None or ln[0] >= time.time() - since]
    if q.get("tailLines"):
        lines = lines[len(lines) - min(len(lines), int(q["tailLines"])):]
    render = _renderer(is_true(q.get("timestamps")), q.get("limitBytes"))
    if not is_true(q.get("follow")):
        return Response(200, b"".join(render(lines)).decode(errors="replace"), "text/plain")
    return Response(200, _follow(api, buf, run, lines, render, covered), "text/plain")


def _not_started(pod: dict, container: str) -> str:
    name = pod["metadata"]["name"]
    if not pod["spec"].get("nodeName"):
        return f"pod {name} does not have a host assigned"
    state = next((s["state"] for s in pod.get("status", {}).get("containerStatuses", [])
                  if s["name"] == container), {})
    reason = state.get("waiting", {}).get("reason", "ContainerCreating")
    if reason in ("ErrImagePull", "ImagePullBackOff"):
        reason = "image can't be pulled"
    return f'container "{container}" in pod "{name}" is waiting to start: {reason}'


def _follow(api, buf, run, lines, render, seen: int) -> Iterator[bytes]:
    """``lines`` first (the first ``seen`` lines of ``buf``, filtered), then each line
    written after them, until the container's log closes."""
    yield b"".join(render(lines))
    while True:
        with api.store.cond:
            new = buf.lines[seen:]
            seen += len(new)
            if not new:
                if buf.closed or run.gone or api.store.closed:
                    return
                api.store.cond.wait(1.0)
        yield b"".join(render(new))


def _renderer(timestamps: bool, limit_bytes):
    """Turn ``(time, line)`` pairs into bytes, with timestamps and a byte limit."""
    budget = [int(limit_bytes)] if limit_bytes else None

    def render(lines):
        for stamp, line in lines:
            if timestamps:
                line = datetime.datetime.fromtimestamp(stamp, datetime.timezone.utc).strftime(
                    "%Y-%m-%dT%H:%M:%S.%fZ ").encode() + line
            if budget is not None:
                line, budget[0] = line[:budget[0]], budget[0] - len(line[:budget[0]])
            if line:
                yield line
    return render
