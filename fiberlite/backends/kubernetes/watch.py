"""One watch on the pods matching a label selector, in one thread.

The first list, and the answer to the first watch request, are awaited by the caller
(so that a missing right is an error at once). Then the thread watches from the
list's ``resourceVersion``, resumes from the last version it saw after each server
timeout, lists again after ``410 Gone`` (reporting pods that vanished meanwhile as
deleted), and backs off on errors. An API error is never read as "the job stopped":
only events about pods change what jobs see.
"""
from __future__ import annotations

import logging
import threading
from typing import Any, Callable

log = logging.getLogger("fiberlite.kubernetes")

WATCH_SECONDS = 30  # the server ends each watch after this; the thread resumes at once


class PodWatcher:
    """Calls ``on_event(type, pod)`` for every change of a matching pod and ``on_tick()``
    after each watch request ends (so that time-based checks run without any event)."""

    def __init__(self, api: Any, namespace: str, label_selector: str,
                 on_event: Callable[[str, Any], None], on_tick: Callable[[], None] = lambda: None,
                 watch_seconds: int | None = None) -> None:
        self.api = api
        self.namespace = namespace
        self.label_selector = label_selector
        self.on_event = on_event
        self.on_tick = on_tick
        self.watch_seconds = watch_seconds or WATCH_SECONDS
        self._rv: str | None = None
        self._known: dict[str, Any] = {}
        self._stopped = threading.Event()
        self._watch: Any = None
        self._response: Any = None  # the watch request's HTTP response, being read
        self._thread: threading.Thread | None = None
        self._opened = threading.Event()
        self._open_error: BaseException | None = None

    def start(self, timeout: float = 15.0) -> None:
        """List once, then watch in a daemon thread; errors of the list and of the first
        watch request propagate (the watch is then stopped)."""
        self._relist()
        self._thread = threading.Thread(target=self._loop, daemon=True,
                                        name=f"fiberlite-k8s-watch[{self.label_selector}]")
        self._thread.start()
        self._opened.wait(timeout)
        if self._open_error is not None:
            self.stop()
            raise self._open_error

    def _open(self, *args: Any, **kwargs: Any) -> Any:
        """``list_namespaced_pod`` for ``Watch.stream``, noting the first answer's status."""
        from kubernetes.client.exceptions import ApiException
        try:
            response = self.api.list_namespaced_pod(*args, **kwargs)
            status = getattr(response, "status", 200)
            if not 200 <= status <= 299:
                body = response.data.decode("utf-8", "replace") if response.data else None
                raise ApiException(status=status, reason=response.reason, body=body)
        except BaseException as exc:
            if not self._opened.is_set():
                self._open_error = exc
                self._opened.set()
            raise
        self._opened.set()
        self._response = response
        return response

    def stop(self, join: float = 2.0) -> None:
        """Stop watching; the thread is woken from its read and waited for up to ``join``
        seconds (a daemon thread still reading when the interpreter is torn down can
        abort the process as its read returns)."""
        self._stopped.set()
        watch = self._watch
        if watch is not None:
            watch.stop()
        response = self._response
        if response is not None:
            try:
                response.shutdown()  # unblocks the read under way in the thread
            except Exception:
                pass
        thread = self._thread
        if join and thread is not None and thread is not threading.current_thread():
            thread.join(join)

    @property
    def alive(self) -> bool:
        return self._thread is not None and self._thread.is_alive() and not self._stopped.is_set()

    def _deliver(self, kind: str, pod: Any) -> None:
        name = pod.metadata.name
        if kind == "DELETED":
            self._known.pop(name, None)
        else:
            self._known[name] = pod
        try:
            self.on_event(kind, pod)
        except Exception:
            log.exception("handling a pod event failed")

    def _relist(self) -> None:
        from .api import TIMEOUT
        listed = self.api.list_namespaced_pod(self.namespace, label_selector=self.label_selector,
                                              _request_timeout=TIMEOUT)
        present = {pod.metadata.name for pod in listed.items}
        for name, pod in list(self._known.items()):
            if name not in present:
                self._deliver("DELETED", pod)
        for pod in listed.items:
            self._deliver("MODIFIED" if pod.metadata.name in self._known else "ADDED", pod)
        self._rv = listed.metadata.resource_version

    def _loop(self) -> None:
        from kubernetes import watch
        from kubernetes.client.exceptions import ApiException
        backoff, failing, gone_backoff = 0.5, False, 0.2
        while not self._stopped.is_set() and self._open_error is None:
            fresh = False
            try:
                if self._rv is None:
                    self._relist()
                    fresh = True
                self._watch = watch.Watch(return_type="V1Pod")
                for event in self._watch.stream(
                        self._open, self.namespace,
                        label_selector=self.label_selector, resource_version=self._rv,
                        allow_watch_bookmarks=True, timeout_seconds=self.watch_seconds,
                        _request_timeout=(10, self.watch_seconds + 15)):
                    if self._stopped.is_set():
                        break
                    if event["type"] == "BOOKMARK":
                        self._rv = self._watch.resource_version or self._rv
                        continue
                    pod = event["object"]
                    self._rv = pod.metadata.resource_version or self._rv
                    self._deliver(event["type"], pod)
                    gone_backoff = 0.2
                backoff, failing = 0.5, False
            except ApiException as exc:
                if self._open_error is not None:
                    break  # start() raises it
                if exc.status == 410:  # history compacted: list again
                    self._rv = None
                    if fresh:  # even the fresh list's version is too old: do not spin
                        self._stopped.wait(gone_backoff)
                        gone_backoff = min(gone_backoff * 2, 5.0)
                    continue
                failing = self._failed(exc, failing, backoff)
                backoff = min(backoff * 2, 10.0)
            except Exception as exc:  # connection refused, reset, read timeout...
                if self._stopped.is_set() or self._open_error is not None:
                    break
                failing = self._failed(exc, failing, backoff)
                backoff = min(backoff * 2, 10.0)
            finally:
                try:
                    self.on_tick()
                except Exception:
                    log.exception("periodic pod check failed")

    def _failed(self, exc: BaseException, failing: bool, backoff: float) -> bool:
        if not failing:
            from .api import status_message
            text = f"{exc.status} {status_message(exc)}" if hasattr(exc, "status") else str(exc)
            log.warning("watching pods %s failed (%s); retrying", self.label_selector,
                        " ".join(text.split())[:300])
        self._stopped.wait(backoff)
        return True
