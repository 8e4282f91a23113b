"""Following containers without polling: one Docker events stream per label selector,
and one thread per container copying its output to this process's stdout/stderr."""
from __future__ import annotations

import codecs
import logging
import socket
import sys
import threading
import time
from collections import deque
from typing import Any, Callable, Iterator

log = logging.getLogger("fiberlite.docker")

EVENTS = ("die", "destroy", "oom")
_RETRY_DELAYS = (0.2, 0.5, 1.0, 2.0, 5.0)
_write_lock = threading.Lock()  # whole chunks from different containers, never interleaved


class EventWatcher:
    """``docker events`` for containers carrying ``labels``, delivered to ``on_event``.

    The first connection is made by :meth:`start` (its errors reach the caller); after
    that the stream reconnects on its own, replays what it missed (``since``) and calls
    ``on_reconnect`` so that the owner can check what may still be lost.
    """

    def __init__(self, api: Any, labels: dict[str, str], on_event: Callable[[dict], None],
                 on_reconnect: Callable[[], None]) -> None:
        self.api = api
        self.labels = dict(labels)
        self.on_event = on_event
        self.on_reconnect = on_reconnect
        self._stream: Any = None
        self._since: str | None = None
        self._closed = False
        self._thread: threading.Thread | None = None

    @property
    def alive(self) -> bool:
        return self._thread is not None and self._thread.is_alive() and not self._closed

    def _open(self) -> Any:
        filters = {"type": ["container"], "event": list(EVENTS),
                   "label": [f"{k}={v}" for k, v in self.labels.items()]}
        return self.api.events(since=self._since, filters=filters, decode=True)

    def start(self) -> None:
        self._stream = self._open()
        self._thread = threading.Thread(target=self._run, name="fiberlite-docker-events", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        failures = 0
        while not self._closed:
            stream = self._stream
            try:
                for event in stream:
                    failures = 0
                    nanos = event.get("timeNano")
                    if nanos:
                        self._since = f"{nanos // 10**9}.{nanos % 10**9:09d}"
                    try:
                        self.on_event(event)
                    except Exception:
                        log.exception("handling Docker event %r failed", event)
                if self._closed:
                    return
                log.debug("Docker events stream ended; reconnecting")
            except Exception as exc:
                if self._closed:
                    return
                log.debug("Docker events stream failed (%s); reconnecting", exc)
            self._stream = None
            while not self._closed and self._stream is None:
                time.sleep(_RETRY_DELAYS[min(failures, len(_RETRY_DELAYS) - 1)])
                failures += 1
                try:
                    self._stream = self._open()
                except Exception as exc:
                    if failures == 3:
                        log.warning("lost the Docker events stream, retrying: %s", exc)
            if self._stream is not None:
                self.on_reconnect()

    def close(self) -> None:
        self._closed = True
        stream = self._stream
        if stream is not None:
            try:
                stream.close()
            except Exception:
                pass


def _raw_socket(sock: Any) -> Any:
    return getattr(sock, "_sock", sock)


def _echo(stream_no: int, data: bytes, decoders: dict) -> None:
    """Write ``data`` to this process's stdout (1) or stderr (2), as they are now."""
    out = sys.stderr if stream_no == 2 else sys.stdout
    if out is None:
        return
    with _write_lock:
        try:
            buffer = getattr(out, "buffer", None)
            if buffer is not None:
                out.flush()  # text written before must come first
                buffer.write(data)
                buffer.flush()
            else:
                decoder = decoders.setdefault(stream_no, codecs.getincrementaldecoder("utf-8")("replace"))
                out.write(decoder.decode(data))
                out.flush()
        except (OSError, ValueError):
            pass  # closed at interpreter exit, or a broken pipe: the job goes on


class OutputPump:
    """Reads one container's attached stdout/stderr until it ends.

    Each chunk is written to this process's stdout or stderr (as a local child shares
    the terminal) and the last ``keep`` bytes are kept for :meth:`text`. A reader that
    calls :meth:`take_over` gets the chunks from then on instead of the terminal.
    """

    def __init__(self, sock: Any, name: str, on_done: Callable[[], None], keep: int = 1 << 20) -> None:
        self.name = name
        self._sock = sock
        self._on_done = on_done
        self._keep = keep
        self._chunks: deque[bytes] = deque()
        self._size = 0
        self._cond = threading.Condition()
        self._pending: list[bytes] | None = None  # set once taken over
        self.done = False
        for target in (sock, _raw_socket(sock)):  # silence may last longer than any timeout
            try:
                target.settimeout(None)
            except Exception:
                pass
        self._thread = threading.Thread(target=self._run, name=f"fiberlite-output-{name}", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def _run(self) -> None:
        from docker.utils.socket import frames_iter
        decoders: dict = {}
        try:
            for stream_no, data in frames_iter(self._sock, False):
                if not data:
                    continue
                with self._cond:
                    self._chunks.append(data)
                    self._size += len(data)
                    while self._size > self._keep and len(self._chunks) > 1:
                        self._size -= len(self._chunks.popleft())
                    if self._pending is not None:
                        self._pending.append(data)
                        self._cond.notify_all()
                        continue
                _echo(stream_no, data, decoders)
        except Exception as exc:
            log.debug("output of %s: %s", self.name, exc)
        finally:
            self._close_socket()
            with self._cond:
                self.done = True
                self._cond.notify_all()
            self._on_done()

    def wait(self, timeout: float | None = None) -> bool:
        with self._cond:
            return self._cond.wait_for(lambda: self.done, timeout)

    def text(self) -> str:
        with self._cond:
            return b"".join(self._chunks).decode(errors="replace")

    def take_over(self) -> Iterator[str]:
        """What the container prints from now on (no longer to the terminal), until it ends."""
        with self._cond:  # now, not at the first next()
            if self._pending is None:
                self._pending = []
        return self._taken()

    def _taken(self) -> Iterator[str]:
        decoder = codecs.getincrementaldecoder("utf-8")("replace")
        while True:
            with self._cond:
                self._cond.wait_for(lambda: self._pending or self.done)
                chunks, self._pending = self._pending, []
                finished = self.done and not chunks
            if chunks:
                yield decoder.decode(b"".join(chunks))
            if finished:
                tail = decoder.decode(b"", final=True)
                if tail:
                    yield tail
                return

    def _close_socket(self) -> None:
        for target in (_raw_socket(self._sock), self._sock):
            try:
                target.shutdown(socket.SHUT_RDWR)
            except Exception:
                pass
            try:
                target.close()
            except Exception:
                pass

    def close(self) -> None:
        """Stop reading (the container is gone but its stream did not end)."""
        if not self.done:
            self._close_socket()
