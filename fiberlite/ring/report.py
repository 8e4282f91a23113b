"""How busy a ring's members are, for the run's page: each member counts its collectives
and their bytes, and reports the counts to the rendezvous every ``every`` seconds (a
thread of its own) and once more before it leaves. Only when the page asks for it
(:meth:`~fiberlite.ring.parent.Ring.ask_reports`): otherwise no member counts or sends
anything.

A collective's bytes are its data on the reporting rank: the input of ``all_reduce``,
``reduce_scatter`` and ``all_gather`` (pickled for the latter), the object of
``broadcast``; a barrier has none.
"""
from __future__ import annotations

import threading
import time
from typing import Any

REPORT_EVERY = 1.0  # seconds between a member's reports while the page watches


class CollectiveCounter:
    """A member's collectives and their bytes, so far."""

    __slots__ = ("collectives", "bytes")

    def __init__(self) -> None:
        self.collectives = 0
        self.bytes = 0

    def add(self, nbytes: int) -> None:
        self.collectives += 1
        self.bytes += nbytes


def payload_size(payload: Any) -> int:
    """Bytes of a :class:`~fiberlite.wire.codec.Payload`: its pickle and its buffers."""
    return len(payload.data) + sum(memoryview(b).nbytes for b in payload.buffers or ())


class Reporter:
    """Sends ``counter`` to the rendezvous every ``every`` seconds, as
    ``stats(rank, collectives, bytes, seconds since the member started counting)``."""

    def __init__(self, rendezvous: Any, rank: int, counter: CollectiveCounter,
                 every: float) -> None:
        self._rendezvous = rendezvous
        self._rank = rank
        self._counter = counter
        self._every = every
        self._started = time.monotonic()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="fiberlite-ring-report",
                                        daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.wait(self._every):
            self.send()

    def send(self) -> None:
        counter = self._counter
        try:
            self._rendezvous.cast("stats", self._rank, counter.collectives, counter.bytes,
                                  time.monotonic() - self._started)
        except Exception:
            pass  # the parent is gone: the member learns it from its collectives

    def stop(self) -> None:
        """Stop reporting; the last report (the final counts) is sent now."""
        self._stop.set()
        self._thread.join()
        self.send()


class MemberRates:
    """The parent's side: the last two reports of each rank, and the rates they give."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._reports: dict[int, list[tuple[int, int, float]]] = {}

    def add(self, rank: int, collectives: int, nbytes: int, seconds: float) -> None:
        with self._lock:
            last = self._reports.setdefault(rank, [])
            last.append((collectives, nbytes, seconds))
            del last[:-2]

    def of(self, rank: int, ended: bool) -> dict[str, float | int | None]:
        """Counts of ``rank`` and its rates (per second) over its last report period, or
        over its whole life once it ended; None before its first report."""
        with self._lock:
            last = list(self._reports.get(rank, ()))
        if not last:
            return {"collectives": None, "bytes": None, "collectives_per_s": None,
                    "bytes_per_s": None}
        collectives, nbytes, seconds = last[-1]
        before = (0, 0, 0.0) if ended or len(last) < 2 else last[0]
        span = max(seconds - before[2], 1e-9)
        return {"collectives": collectives, "bytes": nbytes,
                "collectives_per_s": (collectives - before[0]) / span,
                "bytes_per_s": (nbytes - before[1]) / span}
