"""The master's end of its pool hosts (:mod:`..job.host`): many workers, one conversation.

A host posts what its workers sent in one message, one post at a time; each worker's
request goes to the :class:`~.dispatch.Dispatcher` as if that worker had sent it over a
connection of its own (a :class:`HostedRequest` stands for that connection), so the
dispatcher's bookkeeping — who holds which chunk, what goes back when a worker dies —
is the same for hosted workers as for workers that are jobs of their own. Answers to a
host's workers gather in its outbox. A post is answered with the whole outbox, the
answers to its own requests included; for what becomes ready between posts the host
keeps one ``poll`` request here, answered as soon as the outbox holds anything.

A worker that ends is reported by its host; the pool decides whether a new worker takes
its place (:attr:`replace` gives the new worker's id, or None). A host that ends, or
whose connection drops, loses every worker it still ran.
"""
from __future__ import annotations

import logging
import threading
from typing import Any, Callable

from ...runtime.hub import Servant
from ..job.upstream import dump_answer, load_message
from .dispatch import Dispatcher

log = logging.getLogger(__name__)


class _HostState:
    __slots__ = ("hid", "workers", "outbox", "parked", "peer", "gone", "holding")

    def __init__(self, hid: int, wids: list[int]) -> None:
        self.hid = hid
        self.workers: dict[int, int | None] = dict.fromkeys(wids)  # wid -> pid, once known
        self.outbox: list[tuple] = []
        self.parked: Any = None  # the host's poll request, when nothing was ready
        self.peer: int | None = None
        self.gone = False
        self.holding = 0  # posts being handled: answers wait to leave together


class HostedRequest:
    """A hosted worker's request, answered into its host's outbox."""

    __slots__ = ("relay", "host", "wid", "seq", "peer")

    def __init__(self, relay: "HostRelay", host: _HostState, wid: int, seq: int) -> None:
        self.relay = relay
        self.host = host
        self.wid = wid
        self.seq = seq
        self.peer = -wid  # one connection per worker, as far as the dispatcher can tell

    def reply(self, value: Any = None) -> None:
        if self.seq:  # framed here: the host passes the frame on as it is
            self.relay.answer(self.host, ("reply", self.wid, dump_answer(self.seq, True, value)))

    def fail(self, exc: BaseException) -> None:
        if self.seq:
            self.relay.answer(self.host, ("reply", self.wid, dump_answer(self.seq, False, exc)))


class HostedWorker:
    """A worker forked in a host, as ``Pool._pool`` shows it: its ``pid``, and
    ``is_alive()`` while its host runs it."""

    __slots__ = ("pid", "_relay")

    def __init__(self, pid: int, relay: "HostRelay") -> None:
        self.pid = pid
        self._relay = relay

    def is_alive(self) -> bool:
        return self._relay.runs(self.pid)

    def __repr__(self) -> str:
        return f"<HostedWorker pid={self.pid}{'' if self.is_alive() else ' ended'}>"


class HostRelay(Servant):
    """Serves the hosts of one pool, in front of its dispatcher."""

    def __init__(self, dispatcher: Dispatcher, replace: Callable[[int], int | None],
                 changed: Callable[[], None]) -> None:
        self.dispatcher = dispatcher
        self.replace = replace  # host id -> the id of a worker to start there, or None
        self.changed = changed  # wakes the pool's supervisor (a worker ended)
        self._lock = threading.Lock()
        self._started = threading.Condition(self._lock)  # a worker's pid became known
        self.hosts: dict[int, _HostState] = {}
        self._by_peer: dict[int, _HostState] = {}

    # -- the pool's side ----------------------------------------------------------------------
    def add_host(self, hid: int, wids: list[int]) -> None:
        with self._lock:
            self.hosts[hid] = _HostState(hid, wids)

    def forget_host(self, hid: int) -> None:
        """Host ``hid`` could not be started: its workers never were."""
        with self._lock:
            host = self.hosts.pop(hid, None)
        for wid in host.workers if host is not None else ():
            self.dispatcher.remove_worker(wid)

    def hosts_of_only(self, wids: set[int]) -> list[int]:
        """The live hosts all of whose workers are among ``wids``."""
        with self._lock:
            return [hid for hid, host in self.hosts.items()
                    if host.workers and wids.issuperset(host.workers)]

    def pids(self, timeout: float = 0.0) -> list[int]:
        """Pids of the workers of live hosts, waiting up to ``timeout`` seconds for those
        being started."""
        with self._started:
            self._started.wait_for(lambda: all(
                pid is not None for host in self.hosts.values() for pid in host.workers.values()),
                timeout)
            return [pid for host in self.hosts.values() for pid in host.workers.values()
                    if pid is not None]

    def runs(self, pid: int) -> bool:
        """Whether a live host runs a worker of pid ``pid``."""
        with self._lock:
            return any(pid in host.workers.values() for host in self.hosts.values())

    def pids_by_host(self) -> dict[int, list[int]]:
        """The known pids of each live host's workers, by host id (for the dashboard)."""
        with self._lock:
            return {hid: [pid for pid in host.workers.values() if pid is not None]
                    for hid, host in self.hosts.items()}

    def host_gone(self, hid: int, exitcode: int | None) -> None:
        """Host ``hid`` ended (or cannot be reached): its workers are lost."""
        with self._lock:
            host = self.hosts.pop(hid, None)
            if host is None:
                return
            host.gone = True
            if host.peer is not None:
                self._by_peer.pop(host.peer, None)
            wids, host.workers = list(host.workers), {}
            parked, host.parked = host.parked, None
            self._started.notify_all()
        counted = False  # a host whose workers never asked for work is one failed start
        for wid in wids:
            if counted and not self.dispatcher.ever_ready(wid):
                self.dispatcher.remove_worker(wid)  # it held nothing
                continue
            counted = counted or not self.dispatcher.ever_ready(wid)
            self.dispatcher.worker_exited(wid, exitcode)
        if parked is not None:
            parked.reply(None)
        self.changed()

    # -- operations of the hosts -------------------------------------------------------------------
    def op_post(self, request: Any, hid: int, messages: list) -> None:
        """What a host's workers sent, ``(wid, frame)`` each as the worker framed
        ``(seq, method, args)``, and what the host saw of them, ``(wid, 0, method,
        args)``. Answered with the host's outbox (which the answers to these messages
        are in), or None if the host is gone."""
        with self._lock:
            host = self.hosts.get(hid)
            if host is not None:
                host.holding += 1
                if host.peer is None:
                    host.peer = request.peer
                    self._by_peer[request.peer] = host
        if host is None:
            request.reply(None)
            return
        nexts: list = []  # consecutive requests for work, handed to the dispatcher together
        try:
            for message in messages:
                if len(message) == 2:
                    wid, frame = message
                    try:
                        seq, method, args = load_message(frame)
                    except Exception:  # never from a worker of ours: nothing to act on
                        log.exception("pool host %s: a frame of worker %s could not be loaded",
                                      hid, wid)
                        continue
                else:
                    wid, seq, method, args = message
                if method == "next":
                    nexts.append((HostedRequest(self, host, wid, seq), args))
                    continue
                if nexts:
                    self.dispatcher.next_many(nexts)
                    nexts = []
                if method == "started":
                    with self._started:
                        if wid in host.workers:
                            host.workers[wid] = args[0]
                            self._started.notify_all()
                elif method in ("exited", "fork_failed"):
                    self._ended(host, wid, method, args[0])
                else:
                    self.dispatcher.dispatch(HostedRequest(self, host, wid, seq), method, args)
            if nexts:
                self.dispatcher.next_many(nexts)
        finally:
            with self._lock:
                host.holding -= 1
                items, host.outbox = host.outbox, []
        request.reply(items)

    def op_poll(self, request: Any, hid: int) -> None:
        """The host waits here for its outbox (None: the host is to end)."""
        stale = None
        with self._lock:
            host = self.hosts.get(hid)
            if host is not None and not host.outbox:
                stale, host.parked = host.parked, request
                request = None
            elif host is not None:
                items, host.outbox = host.outbox, []
        if stale is not None:
            stale.reply([])
        if request is not None:
            request.reply(items if host is not None else None)

    def peer_lost(self, peer: int) -> None:
        with self._lock:
            host = self._by_peer.get(peer)
        if host is not None:
            self.host_gone(host.hid, None)

    # -- internals -----------------------------------------------------------------------------------
    def answer(self, host: _HostState, item: tuple) -> None:
        with self._lock:
            if host.gone:
                return
            host.outbox.append(item)
            parked = self._take_parked(host)
        if parked is not None:
            parked[0].reply(parked[1])

    def _take_parked(self, host: _HostState) -> tuple | None:
        """The parked poll and what to answer it with, when it is time (lock held)."""
        if host.holding or host.parked is None or not host.outbox:
            return None
        parked, host.parked = host.parked, None
        items, host.outbox = host.outbox, []
        return parked, items

    def _ended(self, host: _HostState, wid: int, how: str, detail: Any) -> None:
        with self._started:
            known = host.workers.pop(wid, "gone") != "gone"
            self._started.notify_all()
        if how == "exited":
            self.dispatcher.worker_exited(wid, detail)
        else:
            self.dispatcher.remove_worker(wid)
            self.dispatcher.start_failed(f"could not be forked: {detail}")
        new = self.replace(host.hid) if known else None
        with self._lock:
            if new is not None:
                host.workers[new] = None
        self.answer(host, ("start", new) if new is not None else ("retire",))
        self.changed()
