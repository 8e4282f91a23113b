"""A connection whose other end goes silent is given up within ``peer_timeout`` seconds.

A machine that loses power, a cut cable, a frozen VM or a paused container closes no
connection: no FIN, no RST, and nng would keep such a connection for ever. So both
ends of every connection of the wire watch it, and one thread per process does it for
all of them (:func:`watch`): every ``peer_timeout / TICKS`` seconds (a *tick*) it
looks at each connection once.

- The dialing end (:class:`~.client.Client`) sends a *probe* (a request flagged
  :data:`~.codec.PING`, which the server's receiving thread answers at once) in every
  tick in which it did not both send a request and receive a reply. It gives the
  server up after ``TICKS`` ticks in a row in which nothing came back.
- The listening end (:class:`~.server.Server`) gives a connection up after ``TICKS``
  ticks in a row in which nothing came on it (an idle client probes every tick).

A busy connection carries no probe; an idle one carries a probe and its answer per
tick. A silent end is given up between ``peer_timeout * (TICKS - 1) / TICKS`` and
``peer_timeout`` after the last thing it sent. Probes are sent by this thread and
answered by the server's receiving thread, never by the threads that run the user's
code: a process busy in Python still answers. One whose interpreter lock is held for
longer than the timeout (by a C extension) is taken for silent.

A tick that comes late (more than ``LATE`` ticks after the one before it: this process
was frozen itself, or starved of CPU) counts for nothing: silence it could not watch
is not held against anyone.
"""
from __future__ import annotations

import logging
import os
import sys
import threading
import time
import weakref
from typing import Protocol

log = logging.getLogger(__name__)

TICKS = 4  # ticks per peer_timeout: silent for this many ticks in a row is given up
LATE = 2.0  # a tick more than this many periods after the one before counts for nothing


class Watched(Protocol):
    def liveness_tick(self, counted: bool, timeout: float) -> bool:
        """One tick (``counted``: silence since the last one counts); False once the
        connection needs no more watching."""


def silence(seconds: float) -> str:
    """How an error says that a peer was given up as silent after ``seconds``."""
    return f"it answered nothing for {seconds:g} s: its machine is gone, cut off or frozen?"


def timeout() -> float:
    """The ``peer_timeout`` setting (0: connections are not watched)."""
    from .. import config
    try:
        return float(config.get("peer_timeout") or 0.0)
    except Exception as exc:   # a bad value is reported where settings are read first
        log.debug("peer_timeout unreadable (%s): connections are not watched", exc)
        return 0.0


class Watch:
    """The one thread of a process that watches its connections."""

    def __init__(self) -> None:
        self._cond = threading.Condition()
        self._members: "weakref.WeakSet[Watched]" = weakref.WeakSet()
        self._thread: threading.Thread | None = None
        self._changed = False
        self._last = 0.0     # when the last tick was, and its period (0: not ticking)
        self._period = 0.0

    def add(self, member: Watched) -> None:
        with self._cond:
            self._members.add(member)
            self._start()

    def discard(self, member: Watched) -> None:
        with self._cond:
            self._members.discard(member)

    def reconfigure(self) -> None:
        """Read ``peer_timeout`` again now (it was changed)."""
        with self._cond:
            self._changed = True
            self._start()
            self._cond.notify()

    def behind(self) -> bool:
        """Whether this process is late for its next tick: it was frozen, or starved of
        CPU, until just now (its peers may have given it up meanwhile)."""
        period = self._period
        return bool(period) and time.monotonic() - self._last > LATE * period

    def _start(self) -> None:
        if self._thread is not None or not self._members or sys.is_finalizing() or not timeout():
            return
        thread = threading.Thread(target=self._run, name="fiberlite-liveness", daemon=True)
        try:
            thread.start()
        except RuntimeError:   # the interpreter is shutting down
            return
        self._thread = thread

    def _run(self) -> None:
        last = time.monotonic()
        while True:
            with self._cond:
                period = timeout() / TICKS
                while True:
                    self._changed = False
                    now = time.monotonic()
                    if period and now >= last + period:
                        break
                    self._cond.wait(last + period - now if period else None)
                    if self._changed:
                        period = timeout() / TICKS
                members = list(self._members)
            counted = now - last <= LATE * period
            last = self._last = now
            self._period = period
            for member in members:
                try:
                    if not member.liveness_tick(counted, period * TICKS):
                        self.discard(member)
                except Exception:
                    log.exception("liveness: watching %r failed", member)


_watch = Watch()


def _forked() -> None:
    global _watch
    _watch = Watch()   # the parent's thread and connections are not this process's


os.register_at_fork(after_in_child=_forked)


def watch(member: Watched) -> None:
    """Tick ``member`` from now on (until its tick returns False, or :func:`unwatch`)."""
    _watch.add(member)


def unwatch(member: Watched) -> None:
    _watch.discard(member)


def behind() -> bool:
    """Whether this process was frozen or starved of CPU until just now (see :class:`Watch`)."""
    return _watch.behind()


def reconfigure() -> None:
    """``peer_timeout`` was changed (a job adopted its parent's settings): use it now."""
    _watch.reconfigure()
