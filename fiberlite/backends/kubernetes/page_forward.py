"""``fiberlite run``'s local door to the master pod's page (:mod:`.page`): a loopback HTTP server that
passes each GET on through the API server's pod proxy, with the user's credentials."""
from __future__ import annotations

import http.server
import threading
from typing import Any, Callable

Fetch = Callable[[str], tuple[int, str, bytes]]  # path -> (status, content type, body)


class _Relay(http.server.BaseHTTPRequestHandler):
    server: "PageForward"

    def log_message(self, format: str, *args: Any) -> None:
        pass

    def do_GET(self) -> None:
        if self.path.split("?")[0].endswith("/api/events"):
            # a stream never ends: it cannot be fetched whole; the page polls instead
            self._answer(404, "text/plain; charset=utf-8", b"not relayed: poll api/state")
            return
        try:
            status, kind, body = self.server.fetch(self.path)
        except Exception as exc:  # the cluster cannot be reached: say so in the browser
            status, kind = 502, "text/plain; charset=utf-8"
            body = f"fiberlite: the master's page cannot be reached through the API server: {exc}".encode()
        self._answer(status, kind, body)

    def _answer(self, status: int, kind: str, body: bytes) -> None:
        self.send_response(status)
        self.send_header("Content-Type", kind or "application/octet-stream")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)


class PageForward(http.server.ThreadingHTTPServer):
    """Serves ``fetch`` on a free port of 127.0.0.1."""

    daemon_threads = True

    def __init__(self, fetch: Fetch) -> None:
        self.fetch = fetch
        super().__init__(("127.0.0.1", 0), _Relay)
        threading.Thread(target=self.serve_forever, kwargs={"poll_interval": 0.5},
                         name="fiberlite-page-forward", daemon=True).start()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server_address[1]}/"

    def close(self) -> None:
        self.shutdown()
        self.server_close()
