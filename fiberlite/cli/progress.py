"""The start-up view of a run on stderr: how many of its jobs are pending, running, done.

On a terminal one line is rewritten in place and erased when the run's output begins;
otherwise a few plain lines are printed, one per change. The jobs are asked for less
and less often (up to every ``MAX_INTERVAL`` seconds), and not at all after
``MAX_SECONDS``: for a remote backend each look is an API call.
"""
from __future__ import annotations

import sys
import threading
import time
from collections import Counter
from typing import Callable, TextIO

PLAIN_LINES = 5
MAX_INTERVAL = 10.0
MAX_SECONDS = 600.0


class Progress:
    """Shows ``jobs()`` (``[(name, run, state)]``) every ``interval`` seconds until :meth:`stop`."""

    def __init__(self, label: str, jobs: Callable[[], list[tuple[str, str, str]]],
                 stream: TextIO | None = None, interval: float = 0.5) -> None:
        self.label = label
        self.jobs = jobs
        self.stream = stream or sys.stderr
        self.interval = interval
        self.tty = _isatty(self.stream)
        self._stopped = threading.Event()
        self._lock = threading.Lock()
        self._shown = ""
        self._lines = 0
        self._thread = threading.Thread(target=self._loop, name="fiberlite-progress", daemon=True)

    def start(self) -> "Progress":
        self._thread.start()
        return self

    def stop(self) -> None:
        """Stop updating and erase the line (call before writing the run's output)."""
        if self._stopped.is_set():
            return
        with self._lock:
            self._stopped.set()
            if self.tty and self._shown:
                self._write("\r\x1b[K")

    def _loop(self) -> None:
        failures, interval = 0, self.interval
        end = time.monotonic() + MAX_SECONDS
        while not self._stopped.is_set() and time.monotonic() < end:
            try:
                counts = Counter(state.split()[0] for _, _, state in self.jobs())
            except Exception:
                failures += 1
                if failures >= 3:
                    return
            else:
                self._show(f"{self.label}: {counts['pending']} pending, {counts['running']} "
                           f"running, {counts['exited']} done")
            self._stopped.wait(interval)
            interval = min(interval * 1.2, MAX_INTERVAL)

    def _show(self, text: str) -> None:
        with self._lock:
            if self._stopped.is_set() or text == self._shown:
                return
            if self.tty:
                self._write("\r\x1b[K" + text)
            elif self._lines < PLAIN_LINES:
                self._write(text + "\n")
                self._lines += 1
            self._shown = text

    def _write(self, text: str) -> None:
        try:
            self.stream.write(text)
            self.stream.flush()
        except (OSError, ValueError):
            pass


def _isatty(stream: TextIO) -> bool:
    try:
        return stream.isatty()
    except (AttributeError, ValueError):
        return False
