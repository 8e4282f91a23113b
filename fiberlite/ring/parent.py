"""The parent side of a ring: :class:`Ring` starts the members, :class:`Rendezvous`
is where they meet.

    def train(ring, epochs):
        grads = ...
        grads = ring.all_reduce(grads, op="mean")     # same on every rank
        ring.print("loss", loss)                       # rank 0 only
        return loss

    losses = fiberlite.Ring(4, train, args=(10,)).run()   # one result per rank

Each member is a job from ``context.Process`` running the ring's
:class:`~fiberlite.ring.job._MemberMain`. Members register their inbox with the
rendezvous servant and learn everyone's, wait there until all are connected, and
report how they ended. A member that dies (or fails) is seen by the parent, which
tells every member (``abort`` on their :class:`~fiberlite.ring.inbox.RingMember`) and
terminates those still running after ``abort_grace`` seconds; ``join()`` raises
:class:`~fiberlite.errors.RingError` naming the rank that failed first.
"""
from __future__ import annotations

import collections
import threading
import time
from dataclasses import dataclass
from typing import Any, Callable

from .. import config, observe
from ..errors import RingError
from ..process import Process
from ..runtime.exit_codes import describe_exit
from ..runtime.hub import ObjectRef, Servant, get_hub, unregister
from ..wire import liveness
from .errors import describe_failure
from .job import _MemberMain
from .report import MemberRates

DEFAULT_TIMEOUT = 1800.0   # seconds a collective may wait (torch.distributed's default)
ABORT_GRACE = 10.0         # seconds members get to stop by themselves after a failure


@dataclass(frozen=True)
class MemberView:
    """A member of a ring as the run's page shows it (:meth:`Ring.view`)."""

    rank: int
    process: Any  # its Process
    machine: str | None  # where it runs, once it joined (None before)
    rates: dict  # its collectives' counts and rates (:meth:`.report.MemberRates.of`)


class Rendezvous(Servant):
    """Where members register their inbox, learn everyone's, and report how they ended."""

    def __init__(self, ring: "Ring") -> None:
        self._ring = ring
        self._lock = threading.Lock()
        self._joined: dict[int, tuple[ObjectRef, str, str | None]] = {}
        self._waiting: dict[str, dict[int, Any]] = {"join": {}, "ready": {}}
        self._rank_of_peer: dict[int, int] = {}
        self.error: RingError | None = None
        self.rates = MemberRates()  # what members report when asked (the run's page)

    def _gather(self, phase: str, request: Any, rank: int) -> list[Any] | None:
        """Keep ``request`` until every rank reached ``phase``; then return all of them."""
        with self._lock:
            error = self.error
            if error is None:
                waiting = self._waiting[phase]
                waiting[rank] = request
                if len(waiting) < self._ring.world_size:
                    return None
                self._waiting[phase] = {}
                return list(waiting.values())
        request.fail(RingError(str(error), error.rank, error.exitcode))
        return None

    def op_join(self, request: Any, rank: int, ref: ObjectRef, machine: str,
                link: str | None = None) -> None:
        with self._lock:
            self._joined[rank] = (ref, machine, link)  # (machine: runtime.machine.machine_id)
            self._rank_of_peer[request.peer] = rank
        everyone = self._gather("join", request, rank)
        if everyone:
            table = self._table()
            for waiter in everyone:
                waiter.reply(table)

    def op_stats(self, request: Any, rank: int, collectives: int, nbytes: int,
                 seconds: float) -> None:
        """A member's counts so far (sent only when the ring asked for reports)."""
        self.rates.add(rank, collectives, nbytes, seconds)
        request.reply()

    def op_ready(self, request: Any, rank: int) -> None:
        for waiter in self._gather("ready", request, rank) or ():
            waiter.reply()

    def _table(self) -> dict:
        n = self._ring.world_size
        refs = [self._joined[r][0] for r in range(n)]
        hosts = [self._joined[r][1] for r in range(n)]
        links = [self._joined[r][2] for r in range(n)]
        counter: dict[str, int] = collections.Counter()
        local_rank = []
        for host in hosts:
            local_rank.append(counter[host])
            counter[host] += 1
        return {"refs": refs, "local_rank": local_rank,
                "local_world_size": [counter[h] for h in hosts], "links": links, "hosts": hosts}

    def refs(self) -> dict[int, ObjectRef]:
        with self._lock:
            return {rank: entry[0] for rank, entry in self._joined.items()}

    def machines(self) -> dict[int, str]:
        """The ranks that joined, and the machine each runs on."""
        with self._lock:
            return {rank: entry[1] for rank, entry in self._joined.items()}

    def op_leave(self, request: Any, rank: int, ok: bool, info: Any) -> None:
        request.reply()
        self._ring._on_leave(rank, ok, info)

    def abort(self, error: RingError) -> None:
        with self._lock:
            if self.error is None:
                self.error = error
            waiting = [w for phase in self._waiting.values() for w in phase.values()]
            self._waiting = {"join": {}, "ready": {}}
        for waiter in waiting:
            waiter.fail(RingError(str(error), error.rank, error.exitcode))

    def peer_lost(self, peer: int) -> None:
        rank = self._rank_of_peer.pop(peer, None)
        if rank is not None:
            self._ring._on_lost(rank)

    def peer_silent(self, peer: int) -> None:
        rank = self._rank_of_peer.get(peer)
        if rank is not None:
            self._ring._on_silent(rank)


class Ring:
    """``processes`` jobs running ``target(ring, *args, **kwargs)`` as the ranks of a ring.

    ``initializer(*initargs)`` runs in each member first. ``timeout`` (seconds, None for
    no limit) bounds every collective; after a member fails, the others get
    ``abort_grace`` seconds to stop before they are terminated. ``@fiberlite.meta`` on
    ``target`` sets each member's resources.

    ``start()``, ``join(timeout)`` (raises :class:`RingError` if a member failed),
    ``run()`` (start + join, returns the results by rank), ``results``, ``exitcodes``,
    ``is_alive()``, ``terminate()``; as a context manager, members still running at
    exit are terminated.
    """

    def __init__(self, processes: int, target: Callable[..., Any], args: tuple = (),
                 kwargs: dict | None = None, initializer: Callable[..., Any] | None = None, *,
                 context: Any = None, timeout: float | None = DEFAULT_TIMEOUT, initargs: tuple = (),
                 abort_grace: float = ABORT_GRACE, name: str = "Ring") -> None:
        if isinstance(processes, bool) or not isinstance(processes, int) or processes < 1:
            raise ValueError(f"processes must be a positive number of members, not {processes!r}")
        if not callable(target):
            raise TypeError(f"target must be callable, not {target!r}")
        if initializer is not None and not callable(initializer):
            raise TypeError(f"initializer must be callable, not {initializer!r}")
        if timeout is not None and timeout <= 0:
            raise ValueError("timeout must be a positive number of seconds or None")
        self.world_size = processes
        self._context = context
        self._target = target
        self._args = tuple(args)
        self._kwargs = dict(kwargs or {})
        self._initializer = initializer
        self._initargs = tuple(initargs)
        self.timeout = timeout
        self.abort_grace = abort_grace
        self.name = name
        self.processes: list[Any] = []
        self._lock = threading.Lock()
        self._reports: dict[int, tuple[bool, Any]] = {}
        self._events: list[int] = []          # ranks in the order they failed or were lost
        self._silent: dict[int, float] = {}   # ranks given up as silent, after so many seconds
        self._error: RingError | None = None  # what the members were told
        self._rendezvous: Rendezvous | None = None
        self._ref: ObjectRef | None = None
        self._results: list[Any] | None = None
        self._closed = False
        self._grace_timer: threading.Timer | None = None
        self._report_every: float | None = None

    def _page_view(self) -> list[MemberView]:
        """Its members now, for the run's page (none before :meth:`start`;
        :func:`fiberlite.observe.view_of`)."""
        rendezvous = self._rendezvous
        if rendezvous is None:
            return []
        machines = rendezvous.machines()
        return [MemberView(rank, process, machines.get(rank),
                           rendezvous.rates.of(rank, ended=process.exitcode is not None))
                for rank, process in enumerate(list(self.processes))]

    def __repr__(self) -> str:
        state = "initial" if not self.processes else ("running" if self.is_alive() else "stopped")
        return f"<{self.name} world_size={self.world_size} {state}>"

    # -- control ---------------------------------------------------------------------------------
    def ask_reports(self, every: float) -> None:
        """Have the members report their collectives every ``every`` seconds
        (:mod:`.report`); before :meth:`start` (the run's page asks when it sees the ring)."""
        self._report_every = every

    def start(self) -> None:
        """Start the members' jobs."""
        if self.processes or self._closed:
            raise ValueError("a Ring can be started once")
        self._rendezvous = Rendezvous(self)
        self._ref = get_hub().register(self._rendezvous)
        observe.notice("ring", self)
        try:
            for rank in range(self.world_size):
                main = _MemberMain(self._ref, rank, self.world_size, self._target, self._args,
                                   self._kwargs, self._initializer, self._initargs, self.timeout,
                                   self._report_every)
                process = (Process if self._context is None else self._context.Process)(target=main, name=f"{self.name}-{rank}")
                process.start()
                self.processes.append(process)
        except BaseException:
            for process in self.processes:
                process.kill()
                process.join()
            unregister(self._ref.oid)
            raise
        threading.Thread(target=self._watch, name=f"fiberlite-{self.name}-watch", daemon=True).start()

    def join(self, timeout: float | None = None) -> None:
        """Wait until every member ended (or ``timeout`` passed: check :meth:`is_alive`);
        raise :class:`RingError` naming the rank that failed first if any failed."""
        if not self.processes:
            raise ValueError("the Ring was not started")
        deadline = None if timeout is None else time.monotonic() + timeout
        for process in self.processes:
            process.join(None if deadline is None else max(0.0, deadline - time.monotonic()))
            if process.exitcode is None:
                return
        self._finish()
        error = self._failure()
        if error is not None:
            raise error

    def run(self) -> list[Any]:
        """Start, join and return each rank's return value, by rank."""
        self.start()
        self.join()
        return self.results

    @property
    def results(self) -> list[Any]:
        """Each rank's return value, by rank (after a successful :meth:`join`)."""
        if self._results is None:
            raise ValueError("results are available once every member finished successfully")
        return list(self._results)

    def is_alive(self) -> bool:
        return any(p.is_alive() for p in self.processes)

    @property
    def exitcodes(self) -> list[int | None]:
        return [p.exitcode for p in self.processes]

    def terminate(self) -> None:
        """Stop every member now (SIGTERM) and wait for them."""
        self._abort(RingError("the ring was terminated by its parent"))
        for process in self.processes:
            if process.is_alive():
                process.terminate()
        for process in self.processes:
            process.join()
        self._finish()

    def __enter__(self) -> "Ring":
        return self

    def __exit__(self, *exc: Any) -> None:
        if self.processes and self.is_alive():
            self.terminate()
        self._finish()

    # -- what members report ---------------------------------------------------------------------
    def _on_leave(self, rank: int, ok: bool, info: Any) -> None:
        with self._lock:
            self._reports[rank] = (ok, info)
            if not ok:
                self._events.append(rank)
        if not ok:
            culprit = info.get("culprit")
            if culprit is not None:
                # it stopped because of another rank: pass that rank's story on
                self._abort(RingError(info["failure"].message, culprit))
            else:
                failure = info["failure"]
                self._abort(RingError(f"rank {rank} failed: {failure.type_name}: {failure.message}",
                                      rank))

    def _on_silent(self, rank: int) -> None:
        with self._lock:
            self._silent[rank] = config.get("peer_timeout")

    def _on_lost(self, rank: int) -> None:
        with self._lock:
            if rank in self._reports:
                return
            self._events.append(rank)
        self._abort(RingError(f"rank {rank} left the ring ({self._how_lost(rank)})", rank))

    def _how_lost(self, rank: int) -> str:
        silent = self._silent.get(rank)
        if silent is None:
            return "connection lost"
        return liveness.silence(silent)

    def _on_exit(self, rank: int, code: int | None) -> None:
        with self._lock:
            report = self._reports.get(rank)
            if report is not None and report[0]:
                return
            if report is None:
                self._events.append(rank)
        if report is None:
            self._abort(RingError(f"rank {rank} left the ring ({describe_exit(code)})", rank, code))

    def _abort(self, error: RingError) -> None:
        """Tell every member still running that the ring is broken (once)."""
        with self._lock:
            if self._error is not None:
                return
            self._error = error
        if self._rendezvous is not None:
            self._rendezvous.abort(error)
            refs = self._rendezvous.refs()
        else:
            refs = {}
        targets = [ref for rank, ref in refs.items()
                   if rank not in self._reports and rank != error.rank]

        def tell() -> None:
            for ref in targets:
                try:  # a call, not a cast: nothing is left in flight if the member ends
                    ref.call("abort", str(error), error.rank, error.exitcode)
                except Exception:
                    pass  # it ended meanwhile
        threading.Thread(target=tell, name="fiberlite-ring-abort", daemon=True).start()
        if self.abort_grace is not None and self.processes:
            timer = threading.Timer(self.abort_grace, self._stop_stragglers)
            timer.daemon = True
            self._grace_timer = timer
            timer.start()

    def _stop_stragglers(self) -> None:
        for process in self.processes:
            try:
                if process.exitcode is None:
                    process.terminate()
            except Exception:
                pass

    def _watch(self) -> None:
        """Notice members that end (by their sentinels) and report those that failed."""
        from multiprocessing.connection import wait
        pending = {}
        for rank, process in enumerate(self.processes):
            try:
                pending[process.sentinel] = rank
            except Exception:
                pass
        while pending:
            for sentinel in wait(list(pending), timeout=1.0):
                rank = pending.pop(sentinel)
                process = self.processes[rank]
                code = process.exitcode
                while code is None:  # the sentinel fired: the exit code is a moment away
                    time.sleep(0.01)
                    code = process.exitcode
                self._on_exit(rank, code)
            if self._closed:
                return

    # -- outcome ---------------------------------------------------------------------------------
    def _finish(self) -> None:
        if self._closed:
            return
        self._closed = True
        if self._grace_timer is not None:
            self._grace_timer.cancel()
        if self._ref is not None:
            unregister(self._ref.oid)
        if all(self._reports.get(r, (False,))[0] for r in range(self.world_size)):
            results = []
            for rank in range(self.world_size):
                try:
                    results.append(self._reports[rank][1].unpack())
                except Exception as exc:
                    self._reports[rank] = (False, describe_failure(exc, rank))
                    self._events.append(rank)
                    return
            self._results = results

    def _failure(self) -> RingError | None:
        # members that did not finish their target
        failed = [r for r in range(len(self.processes)) if not self._reports.get(r, (False,))[0]]
        if not failed:
            return None
        codes = self.exitcodes
        primary = [r for r in failed if (self._reports.get(r, (False, None))[1] or {}).get("culprit") is None]
        order = {rank: i for i, rank in reversed(list(enumerate(self._events)))}
        candidates = primary or failed
        first = min(candidates, key=lambda r: (order.get(r, len(order)), r))
        info = self._reports.get(first, (False, None))[1]
        code = codes[first]
        if info is None and first in self._silent:
            message = (f"{self.name} rank {first} was given up: {self._how_lost(first)} "
                       f"({describe_exit(code)})")
        elif info is None:
            message = f"{self.name} rank {first} died ({describe_exit(code)})"
        else:
            failure = info["failure"]
            message = (f"{self.name} rank {first} failed with {failure.type_name}: "
                       f"{failure.message} ({describe_exit(code)})")
        others = [r for r in failed if r != first]
        if others:
            message += (f"; rank{'s' if len(others) > 1 else ''} "
                        f"{', '.join(map(str, others))} stopped because of it")
        error = RingError(message, first, code)
        if info is not None:  # the exception with its remote traceback, or that traceback alone
            error.__cause__ = info["failure"].rebuild()
        return error


observe.provides_view(Ring, Ring._page_view)
