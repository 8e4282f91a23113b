"""The page's HTTP server: GET only, nothing it serves changes the run.

``/`` the page, ``/static/...`` its script and style, ``/api/state`` everything the
page shows (JSON), ``/api/events`` the same pushed each time it changes (server-sent
events: an open page costs no request per update), ``/api/logs?job=NAME`` the tail of a
job's output.
"""
from __future__ import annotations

import http.server
import mimetypes
import os
import selectors
import threading
import urllib.parse
from importlib import resources
from typing import Any

from ..errors import ConfigError
from .jobs import log_tail
from .monitor import Monitor
from .push import encode

STATIC = ("index.html", "app.js", "style.css")
WRITE_TIMEOUT = 10.0  # seconds a following page may take to take in an update


def _static(name: str) -> bytes:
    return resources.files(__package__).joinpath("static", name).read_bytes()


class _Handler(http.server.BaseHTTPRequestHandler):
    server: "DashboardServer"
    server_version = "fiberlite-dashboard"
    protocol_version = "HTTP/1.1"  # the page's requests reuse one connection (and its thread)

    def log_message(self, format: str, *args: Any) -> None:  # quiet: the run's output is the user's
        pass

    def do_GET(self) -> None:
        url = urllib.parse.urlsplit(self.path)
        path = url.path
        if path in ("/", "/index.html"):
            self._send(200, _static("index.html"), "text/html; charset=utf-8")
        elif path.startswith("/static/") and path[len("/static/"):] in STATIC:
            name = path[len("/static/"):]
            kind = mimetypes.guess_type(name)[0] or "application/octet-stream"
            self._send(200, _static(name), kind + "; charset=utf-8")
        elif path == "/api/state":
            self._json(200, self.server.monitor.state())
        elif path == "/api/events":
            self._events()
        elif path == "/api/logs":
            self._logs(urllib.parse.parse_qs(url.query).get("job", [""])[0])
        else:
            self._json(404, {"error": f"no such page: {path}"})

    def _logs(self, job: str) -> None:
        registry = self.server.monitor.registry
        with registry.lock:
            record = registry.jobs.get(job)
        if record is None:
            self._json(404, {"error": f"no job {job!r} in this run"})
        else:
            self._json(200, {"job": job, "text": log_tail(record)})

    def _events(self) -> None:
        self.close_connection = True
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        self.send_header("Cache-Control", "no-store")
        self.send_header("Connection", "close")
        self.end_headers()
        self.connection.settimeout(WRITE_TIMEOUT)  # a page that reads nothing is dropped

        def write(data: bytes) -> None:
            self.wfile.write(data)
            self.wfile.flush()
        self.server.monitor.follow(write).ended.wait()  # the monitor's thread writes

    def _refuse(self) -> None:
        self._json(405, {"error": "the dashboard is read-only"})

    do_POST = do_PUT = do_DELETE = do_PATCH = _refuse

    def _json(self, status: int, data: Any) -> None:
        self._send(status, encode(data), "application/json")

    def _send(self, status: int, body: bytes, kind: str) -> None:
        self.send_response(status)
        self.send_header("Content-Type", kind)
        self.send_header("Content-Length", str(len(body)))
        self.send_header("Cache-Control", "no-store")
        self.end_headers()
        self.wfile.write(body)


class DashboardServer(http.server.ThreadingHTTPServer):
    """Serves one run's page on its own daemon thread."""

    daemon_threads = True

    def __init__(self, host: str, port: int, monitor: Monitor) -> None:
        self.monitor = monitor
        try:
            super().__init__((host, port), _Handler)
        except OSError as exc:
            raise ConfigError(
                f"cannot serve the dashboard at {host}:{port}: {exc.strerror or exc}; set "
                f"dashboard (FIBERLITE_DASHBOARD) to another host:port, or to port 0 for any "
                f"free port") from None
        self._closing = False
        self._wake_r, self._wake_w = os.pipe()
        self._thread = threading.Thread(target=self._serve, name="fiberlite-dashboard",
                                        daemon=True)
        self._thread.start()

    def _serve(self) -> None:
        """Take connections until closed; the thread wakes for a connection or the close
        only (``serve_forever`` would look for a shutdown request twice a second)."""
        with selectors.DefaultSelector() as selector:
            selector.register(self, selectors.EVENT_READ)
            selector.register(self._wake_r, selectors.EVENT_READ)
            while not self._closing:
                for key, _ in selector.select():
                    if key.fileobj is self and not self._closing:
                        self._handle_request_noblock()

    @property
    def url(self) -> str:
        host, port = self.server_address[:2]
        shown = "127.0.0.1" if host == "0.0.0.0" else host
        return f"http://{shown}:{port}/"

    def close(self) -> None:
        self._closing = True
        os.write(self._wake_w, b"x")
        self._thread.join()
        self.server_close()
        os.close(self._wake_r)
        os.close(self._wake_w)
        self.monitor.stop()
