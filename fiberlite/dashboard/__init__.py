"""The run's live page: jobs, pools and their calls, queues, managers, rings, charts.

The master serves it when the ``dashboard`` setting names an address
(``FIBERLITE_DASHBOARD=127.0.0.1:8787``, ``fiberlite.init(dashboard=...)``,
``fiberlite run --dashboard ...``); it learns what the run does through
:mod:`fiberlite.observe`. See docs/dashboard.md.
"""
from __future__ import annotations

import sys
import threading

from .. import config, observe, process
from ..runtime import identity
from .monitor import Monitor
from .registry import HISTORY, Registry
from .server import DashboardServer

__all__ = ["start", "start_if_asked", "stop", "url"]

_lock = threading.Lock()
_server: DashboardServer | None = None


def start(address: tuple[str, int] | None = None) -> str:
    """Serve the page (at the ``dashboard`` setting's address unless given one) and
    print its address; returns the URL. Serving already: the running page's URL."""
    global _server
    with _lock:
        if _server is not None:
            return _server.url
        host, port = address or config.get("dashboard") or ("127.0.0.1", 8787)
        registry = Registry()
        meta = {"run": identity.run_id(), "backend": config.get("backend"), "history": HISTORY}
        server = DashboardServer(host, port, Monitor(registry, meta))
        observe.watch(registry)
        _server = server
    sys.stderr.write(f"fiberlite: dashboard at {server.url}\n")
    sys.stderr.flush()
    return server.url


def start_if_asked() -> bool:
    """Start the page if the settings ask for one and this is the top process of the run
    (never in a job: the setting is not handed down, and a job is not the top)."""
    if config.get("dashboard") is None or process.parent_process() is not None:
        return False
    start()
    return True


def url() -> str | None:
    """The page's address, or None when no page is served."""
    return _server.url if _server is not None else None


def stop() -> None:
    """Stop serving the page and stop watching the run."""
    global _server
    with _lock:
        server, _server = _server, None
    if server is not None:
        observe.unwatch(server.monitor.registry)
        server.close()
