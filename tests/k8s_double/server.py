"""The HTTP front of the double and its test hooks: :class:`ApiServerDouble`."""

from __future__ import annotations

import json
import select
import signal
import socket
import threading
import traceback
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Callable, Iterable, Optional
from urllib.parse import parse_qs, urlsplit

from .api import Api
from .wire import Request, Response
from .errors import ApiError
from .runner import LocalRunner

DEFAULT_USER = "system:serviceaccount:default:default"


class ApiServerDouble:
    """A Kubernetes API server double on ``127.0.0.1:<random port>``.

    ``runner`` starts containers (default: :class:`LocalRunner`); ``token``,
    when set, is required as ``Authorization: Bearer <token>``; ``user`` is
    the name used in 403 messages.  Use as a context manager or call
    :meth:`close`.
    """

    def __init__(self, runner: Optional[Callable] = None, *, token: Optional[str] = None,
                 namespaces: Iterable[str] = ("default",), user: str = DEFAULT_USER):
        self.api = Api(runner or LocalRunner(), namespaces, user)
        self.token = token
        self.requests: list[Request] = []
        self._http = _Server(("127.0.0.1", 0), _Handler)
        self._http.double = self
        self.port = self._http.server_address[1]
        self.host = f"http://127.0.0.1:{self.port}"
        self._thread = threading.Thread(target=self._http.serve_forever,
                                        kwargs={"poll_interval": 0.1}, daemon=True)
        self._thread.start()

    # -- hooks --------------------------------------------------------------------
    def forbid(self, verb: str, resource: str, namespace: Optional[str] = None) -> None:
        """Make ``verb`` on ``resource`` (e.g. ``create``, ``pods/log``) a 403."""
        self.api.denied.add((verb, resource, namespace))

    def allow(self, verb: str, resource: str, namespace: Optional[str] = None) -> None:
        """Undo :meth:`forbid`."""
        self.api.denied.discard((verb, resource, namespace))

    def unschedulable(self, message: Optional[str] =
                      "0/1 nodes are available: 1 Insufficient nvidia.com/gpu.",
                      when: Optional[Callable[[dict], bool]] = None) -> None:
        """Pods (those ``when(pod)`` accepts) stay Pending/Unschedulable; None lifts it."""
        with self.api.store.cond:
            self.api.unschedulable = None if message is None else (message, when)
            self.api.store.cond.notify_all()

    def capacity(self, pods: Optional[int]) -> None:
        """Run at most ``pods`` pods at once (None: no limit); the others stay
        Pending/Unschedulable (``Too many pods``) until a place frees or this grows."""
        with self.api.store.cond:
            self.api.capacity = pods
            self.api.store.cond.notify_all()

    def image_pull_fails(self, image: str, message: Optional[str] = None) -> None:
        """Pulls of ``image`` fail (``ErrImagePull``/``ImagePullBackOff``)."""
        ref = image if "/" in image else f"docker.io/library/{image}"
        ref = ref if ":" in ref.rsplit("/", 1)[1] else ref + ":latest"
        with self.api.store.cond:
            self.api.pull_failures[image] = message or (
                f'rpc error: code = NotFound desc = failed to pull and unpack image "{ref}": '
                f'failed to resolve reference "{ref}": {ref}: not found')

    def image_pull_works(self, image: str) -> None:
        """Undo :meth:`image_pull_fails` (pending pods then start)."""
        with self.api.store.cond:
            self.api.pull_failures.pop(image, None)
            self.api.store.cond.notify_all()

    def kill_pod(self, name: str, namespace: str = "default") -> None:
        """SIGKILL the pod's containers (exit code 137)."""
        self.api.kubelet.signal(self._run(name, namespace), signal.SIGKILL)

    def evict(self, name: str, namespace: str = "default") -> None:
        """Fail the pod with reason ``Evicted``, as node pressure would."""
        self.api.kubelet.evict(self._run(name, namespace))

    def expire_watch_history(self) -> None:
        """Watches from any current resourceVersion now get ``410 Gone``."""
        with self.api.store.cond:
            self.api.store.compacted = self.api.store.rv + 1

    def add_namespace(self, name: str) -> None:
        self.api.namespaces.add(name)

    # -- inspection ---------------------------------------------------------------
    @property
    def errors(self) -> list[str]:
        """Tracebacks of the double's own failures (should stay empty)."""
        return self.api.errors

    def pod(self, name: str, namespace: str = "default") -> Optional[dict]:
        """The stored pod as JSON (a copy), or None."""
        with self.api.store.cond:
            pod = self.api.store.get("pods", namespace, name)
            return json.loads(json.dumps(pod)) if pod else None

    def _run(self, name, namespace):
        run = self.api.kubelet.runs.get((namespace, name))
        if run is None:
            raise KeyError(f"no pod {namespace}/{name} known to the kubelet")
        return run

    # -- lifecycle ----------------------------------------------------------------
    def close(self) -> None:
        """Stop serving, end streams and kill every pod's processes."""
        store = self.api.store
        with store.cond:
            store.closed = True
            store.cond.notify_all()
            runs = list(self.api.kubelet.runs.values())
        for run in runs:
            self.api.kubelet.signal(run, signal.SIGKILL)
        for run in runs:
            for handle in list(run.handles.values()):
                handle.wait(5)
        runner_close = getattr(self.api.kubelet.runner, "close", None)
        if runner_close is not None:
            runner_close()
        self._http.shutdown()
        self._http.close_connections()
        self._http.server_close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


class _Server(ThreadingHTTPServer):
    daemon_threads = True
    allow_reuse_address = True

    def __init__(self, *args):
        super().__init__(*args)
        self.connections: set[socket.socket] = set()

    def close_connections(self) -> None:
        for conn in list(self.connections):
            try:
                conn.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server: _Server

    def setup(self):
        super().setup()
        self.server.connections.add(self.connection)

    def finish(self):
        self.server.connections.discard(self.connection)
        super().finish()

    def log_message(self, *args):
        pass

    def do_GET(self):
        self._serve()

    do_POST = do_DELETE = do_PUT = do_PATCH = do_GET

    def _serve(self) -> None:
        double: ApiServerDouble = self.server.double
        url = urlsplit(self.path)
        query = {k: v[-1] for k, v in parse_qs(url.query, keep_blank_values=True).items()}
        raw = self.rfile.read(int(self.headers.get("Content-Length") or 0))
        try:
            body = json.loads(raw) if raw else None
        except ValueError:
            body = raw
        req = Request(self.command, url.path, body, query, dict(self.headers), raw)
        double.requests.append(req)
        try:
            if double.token and self.headers.get("Authorization") != f"Bearer {double.token}":
                raise ApiError(401, "Unauthorized")
            resp = double.api.handle(req)
        except ApiError as exc:
            resp = Response(exc.code, exc.status())
        except Exception:
            double.api.errors.append(traceback.format_exc())
            resp = Response(500, ApiError(500, "internal error in the double").status())
        try:
            self._send(resp)
        except (BrokenPipeError, ConnectionResetError):
            self.close_connection = True

    def _send(self, resp: Response) -> None:
        body = resp.body
        if isinstance(body, (dict, list)):
            body = json.dumps(body)
        if isinstance(body, str):
            data = body.encode()
            self.send_response(resp.code)
            self._headers(resp, {"Content-Length": str(len(data))})
            self.wfile.write(data)
            return
        self.send_response(resp.code)
        self._headers(resp, {"Transfer-Encoding": "chunked"})
        try:
            for chunk in body:
                if chunk:
                    self.wfile.write(b"%X\r\n%s\r\n" % (len(chunk), chunk))
                    self.wfile.flush()
                elif self._client_gone():
                    self.close_connection = True
                    return
            self.wfile.write(b"0\r\n\r\n")
        finally:
            body.close()

    def _headers(self, resp: Response, extra: dict) -> None:
        ctype = resp.content_type
        if ctype == "text/plain":
            ctype += "; charset=utf-8"
        self.send_header("Content-Type", ctype)
        for key, value in {**resp.headers, **extra}.items():
            self.send_header(key, value)
        self.end_headers()

    def _client_gone(self) -> bool:
        readable, _, _ = select.select([self.connection], [], [], 0)
        if not readable:
            return False
        try:
            return self.connection.recv(1, socket.MSG_PEEK) == b""
        except OSError:
            return True
