"""Local jobs' output, kept while the run's page is on.

A local job writes to its parent's stdout and stderr, as with ``multiprocessing``. When
the ``dashboard`` setting is on, a job writes into two pipes instead, and one thread of
this process (:class:`OutputCopier`, for all jobs) copies what comes out of them to this
process's own stdout and stderr, where it would have gone, and keeps the last
``KEEP`` bytes of each job (:class:`OutputTail`) for ``LocalBackend.logs``.
"""
from __future__ import annotations

import collections
import os
import select
import selectors
import threading

KEEP = 64 * 1024  # bytes of a job's output kept
READ = 64 * 1024  # bytes read at once
ATOMIC = getattr(select, "PIPE_BUF", 512)  # a write to a pipe this small is never cut by another's


class OutputTail:
    """The last ``keep`` bytes a job wrote to its stdout and stderr, line by line in the
    order the lines came (a line of one stream is never cut by the other's);
    :meth:`wait_closed` returns once both streams ended (the job and whatever it forked
    are gone) and all they wrote was copied."""

    def __init__(self, keep: int = KEEP) -> None:
        self._keep = keep
        self._chunks: collections.deque[bytes] = collections.deque()
        self._size = 0
        self._partial = {1: b"", 2: b""}  # by stream: the start of a line still being written
        self._lock = threading.Lock()
        self._open = 2
        self._closed = threading.Event()

    def add(self, stream: int, data: bytes) -> None:
        """``data`` came out of ``stream`` (1: stdout, 2: stderr)."""
        with self._lock:
            data = self._partial[stream] + data
            end = data.rfind(b"\n") + 1
            self._partial[stream] = data[end:][-self._keep:]
            if end:
                self._append(data[:end])

    def _append(self, lines: bytes) -> None:
        self._chunks.append(lines[-self._keep:])
        self._size += len(self._chunks[-1])
        while self._size - len(self._chunks[0]) >= self._keep:
            self._size -= len(self._chunks.popleft())

    def text(self) -> str:
        """The kept lines, then the lines being written (a first line cut by the
        trimming is left out)."""
        with self._lock:
            data = b"".join([*self._chunks, *(p for p in self._partial.values() if p)])
        if len(data) > self._keep:
            data = data[-self._keep:]
            data = data[data.find(b"\n") + 1:]
        return data.decode("utf-8", "replace")

    def stream_ended(self, stream: int) -> None:
        with self._lock:
            if self._partial[stream]:
                self._append(self._partial[stream])
                self._partial[stream] = b""
            self._open -= 1
            if self._open == 0:
                self._closed.set()

    def wait_closed(self, timeout: float) -> bool:
        return self._closed.wait(timeout)


class OutputCopier:
    """One thread that copies the pipes of every followed job to this process's stdout
    (fd 1) or stderr (fd 2) and into the job's :class:`OutputTail`."""

    def __init__(self) -> None:
        self._selector = selectors.DefaultSelector()
        self._wake_r, self._wake_w = os.pipe()
        self._selector.register(self._wake_r, selectors.EVENT_READ, None)
        self._lock = threading.Lock()
        self._new: list[tuple[int, int, OutputTail]] = []
        self.pid = os.getpid()
        self._thread = threading.Thread(target=self._run, name="fiberlite-local-output",
                                        daemon=True)
        self._thread.start()

    def follow(self, out_fd: int, err_fd: int, tail: OutputTail) -> None:
        """Copy ``out_fd`` to stdout and ``err_fd`` to stderr from now on (both are
        closed once they end)."""
        with self._lock:
            self._new += [(out_fd, 1, tail), (err_fd, 2, tail)]
        os.write(self._wake_w, b"x")

    def _run(self) -> None:
        while True:
            for key, _ in self._selector.select():
                if key.data is None:
                    self._take_new()
                else:
                    self._copy(key.fd, *key.data)

    def _take_new(self) -> None:
        os.read(self._wake_r, READ)
        with self._lock:
            new, self._new = self._new, []
        for fd, target, tail in new:
            self._selector.register(fd, selectors.EVENT_READ, (target, tail))

    def _copy(self, fd: int, target: int, tail: OutputTail) -> None:
        try:
            data = os.read(fd, READ)
        except OSError:
            data = b""
        if not data:
            self._selector.unregister(fd)
            os.close(fd)
            tail.stream_ended(target)
            return
        tail.add(target, data)
        write_lines(target, data)


def write_lines(fd: int, data: bytes) -> None:
    """Write ``data`` in pieces of at most :data:`ATOMIC` bytes that end where a line does,
    so that another writer of the same pipe (this process's own messages) never lands in
    the middle of a line, as it could not in the job's own writes of its lines."""
    start = 0
    while len(data) - start > ATOMIC:
        cut = data.rfind(b"\n", start, start + ATOMIC) + 1
        if cut <= start:  # a line longer than that: it cannot be kept whole anyway
            cut = start + ATOMIC
        write_all(fd, data[start:cut])
        start = cut
    write_all(fd, data[start:])


def write_all(fd: int, data: bytes) -> None:
    """Write ``data`` to ``fd``; an output that is gone (a closed terminal) drops it."""
    view = memoryview(data)
    while view:
        try:
            view = view[os.write(fd, view):]
        except InterruptedError:
            continue
        except OSError:
            return


_copier: OutputCopier | None = None
_copier_lock = threading.Lock()


def copier() -> OutputCopier:
    """This process's copier, started on first use."""
    global _copier
    with _copier_lock:
        if _copier is None or _copier.pid != os.getpid():  # not the one of a forked parent
            _copier = OutputCopier()
        return _copier
