"""The Pool's servant in the master's hub: who waits for work, what each is answered.

The :class:`Dispatcher` keeps the pool's calls and chunks (:class:`~.work.Work`) and its
workers (:class:`~.roster.Roster`) under one lock. Every method runs under it and never
blocks; replies and result deliveries are collected while it is held (an
:class:`~.records.Out`) and sent after it is released. See :mod:`fiberlite.pool` for the
protocol.
"""
from __future__ import annotations

import collections
import time
from typing import Any, Callable

from ... import observe
from ...errors import BrokenPoolError
from ...runtime.hub import LockedServant
from ...runtime.exit_codes import describe_exit
from .records import (BROKEN, CLOSE, LOCAL_ERROR, REMOTE_ERROR, RUN, TERMINATE, VALUE, Chunk,
                      Group, Out, Worker)
from .roster import Roster
from .work import MAX_TRIES, Work

__all__ = ["Dispatcher", "RUN", "CLOSE", "TERMINATE", "BROKEN", "VALUE", "REMOTE_ERROR",
           "LOCAL_ERROR", "MAX_TRIES"]


class Dispatcher(LockedServant):
    """Hands chunks to workers that ask for them; takes results back exactly once."""

    def __init__(self, deliver: Callable[[list], None], max_tries: int = MAX_TRIES,
                 on_idle_change: Callable[[], None] | None = None) -> None:
        super().__init__()
        self._deliver = deliver
        # called when the last call finishes, and when work comes to a released pool
        self._on_idle_change = on_idle_change
        self.state = RUN
        self.broken_error: BaseException | None = None
        self.work = Work(max_tries, on_idle_change)
        self.roster = Roster()
        self.idle: collections.deque[Worker] = collections.deque()  # waiting for work
        self.released = False  # idle too long: every worker was let go until work comes

    # what the dashboard and the tests read
    workers = property(lambda self: self.roster.workers)
    n_ready = property(lambda self: self.roster.n_ready)
    start_failures = property(lambda self: self.roster.start_failures)
    pending = property(lambda self: self.work.pending)

    # -- the master's side ------------------------------------------------------------------
    def new_group(self, kind: str, payload: Any, name: str, sink: Any) -> Group:
        group = self.work.new_group(kind, payload, name, sink)
        observe.notice("batch", self, group)
        return group

    def make_chunk(self, group: Group, start: int, count: int, data: Any) -> Chunk:
        return self.work.make_chunk(group, start, count, data)

    def submit(self, group: Group, chunks: list[Chunk], seal: bool, new: bool = False) -> None:
        """Queue ``chunks`` of ``group`` (a new call needs a running pool)."""
        out = Out()
        woken = False
        with self._lock:
            if new:
                self._check(RUN)
                self.work.open(group)
                woken, self.released = self.released, False
            else:
                self._check(RUN, CLOSE)
            self.work.add(group, chunks, seal)
            self._serve_idle(out)
        self._flush(out)
        if woken and self._on_idle_change is not None:
            self._on_idle_change()

    def seal(self, group: Group) -> None:
        """No more chunks of ``group`` will come (an imap's input is exhausted)."""
        out = Out()
        with self._lock:
            self.work.seal(group)
            self._serve_idle(out)
        self._flush(out)

    def _check(self, *states: str) -> None:
        if self.state in states:
            return
        if self.state == BROKEN and self.broken_error is not None:
            raise self.broken_error
        raise ValueError("Pool not running")

    def add_worker(self, wid: int, hosted: bool = False) -> None:
        """Worker ``wid`` is being started (``hosted``: forked in a host, which reports
        its end)."""
        with self._lock:
            self.roster.add(wid, hosted)

    def add_worker_below(self, wid: int, wanted: int, hosted: bool = False) -> bool:
        """Add worker ``wid`` if fewer than ``wanted`` workers stay (see :meth:`staying`)."""
        with self._lock:
            return self.roster.add_below(wid, wanted, hosted)

    def remove_worker(self, wid: int) -> None:
        """Forget a worker whose job could not be created."""
        with self._lock:
            self.roster.pop(wid)

    def staying(self) -> int:
        """Workers started or starting that the pool keeps (not leaving)."""
        with self._lock:
            return self.roster.staying()

    def ever_ready(self, wid: int) -> bool:
        """Whether worker ``wid`` asked for work once (False once it is forgotten)."""
        with self._lock:
            return self.roster.ever_ready(wid)

    def retire(self, count: int) -> list[int]:
        """Let ``count`` workers go, those that never asked for work first, then idle ones,
        then those holding least: an idle one is told to exit now, a busy one when it
        next asks (after its current task; chunks it holds and has not started go back).
        Returns the ids of those that never asked for work: their jobs may be stopped."""
        out = Out()
        with self._lock:
            chosen = self._retire(count, out)
        self._flush(out)
        return chosen

    def _retire(self, count: int, out: Out) -> list[int]:
        chosen = self.roster.choose_leaving(count)
        for worker in chosen:
            if worker.waiting is not None:
                out.exit(worker)
        return [worker.wid for worker in chosen if not worker.ready]

    def release_if_idle(self, timeout: float) -> tuple[float | None, list[int]]:
        """Let every worker go if the pool has had no work for ``timeout`` seconds.

        Returns the seconds left until that would happen (None: not idle, or already
        released) and, when it happened, the ids of workers that never asked for work.
        Work submitted later clears :attr:`released` and calls ``on_idle_change``."""
        out = Out()
        with self._lock:
            idle_since = self.work.idle_since
            if self.state != RUN or self.released or idle_since is None:
                return None, []
            left = idle_since + timeout - time.monotonic()
            if left > 0:
                return left, []
            self.released = True
            unstarted = self._retire(len(self.roster.workers), out)
        self._flush(out)
        return None, unstarted

    def worker_exited(self, wid: int, exitcode: int | None) -> None:
        """The job of worker ``wid`` ended (reported by the pool's supervisor)."""
        out = Out()
        with self._lock:
            worker = self.roster.pop(wid)
            if worker is None:
                return
            self._lose(worker, describe_exit(exitcode), out)
            if not worker.ready and not worker.leaving and self.state in (RUN, CLOSE):
                reason = (f"its initializer raised:\n{worker.init_error}" if worker.init_error
                          else describe_exit(exitcode))
                killed = exitcode is not None and exitcode < 0 and not worker.init_error
                self._start_failed(reason, out, killed)
            self._serve_idle(out)
        self._flush(out)

    def start_failed(self, reason: str) -> None:
        """A worker could not even be created (the backend refused)."""
        out = Out()
        with self._lock:
            self._start_failed(reason, out)
        self._flush(out)

    def _start_failed(self, reason: str, out: Out, killed: bool = False) -> None:
        if self.roster.start_failed(reason, killed):
            self._break(out)

    def fail(self, error: BaseException) -> None:
        """The pool cannot go on (``error`` says why): every caller gets ``error``."""
        out = Out()
        with self._lock:
            if self.state != BROKEN:
                self._break(out, error)
        self._flush(out)

    def _break(self, out: Out, error: BaseException | None = None) -> None:
        self.state = BROKEN
        self.broken_error = error or BrokenPoolError(self.roster.failed_starts())
        self.work.clear()
        self._release_all(out)

    def needs_workers(self) -> bool:
        """Whether dead workers should be replaced."""
        return self.state == RUN or (self.state == CLOSE and bool(self.work.groups))

    def close(self) -> None:
        out = Out()
        with self._lock:
            if self.state == RUN:
                self.state = CLOSE
            self._serve_idle(out)
        self._flush(out)

    def terminate(self) -> None:
        out = Out()
        with self._lock:
            if self.state != BROKEN:
                self.state = TERMINATE
            self.work.clear()
            self._release_all(out)
        self._flush(out)

    # -- operations of the workers -------------------------------------------------------------
    def op_next(self, request, wid: int, entries: list, values: Any, want: int,
                prefetch: bool = False) -> None:
        """Results of finished chunks, and a request for ``want`` more (0: I am retiring).

        Answered with ``(chunks, functions, forget, more)``, or ``None`` (exit). A worker that
        is idle is held until there is work; a ``prefetch`` (the worker still has work)
        is answered at once, with no chunks if there are none.
        """
        self.next_many([(request, (wid, entries, values, want, prefetch))])

    def next_many(self, calls: list[tuple[Any, tuple]]) -> None:
        """Several :meth:`op_next` calls ``(request, args)`` handled together, as a pool
        host sends them: one pass under the lock, answers and results passed on at once."""
        out = Out()
        with self._lock:
            for request, (wid, entries, values, want, prefetch) in calls:
                self._next(request, wid, entries, values, want, prefetch, out)
            self._serve_idle(out)
        self._flush(out)

    def _next(self, request: Any, wid: int, entries: list, values: Any, want: int,
              prefetch: bool, out: Out) -> None:
        worker = self.roster.asking(wid, request.peer)
        if worker is None:
            out.reply(request, None)
            return
        if entries:
            self.work.accept(worker, entries, values, out)
        if worker.waiting is not None:  # cannot happen; never leave a request unanswered
            out.reply(worker.waiting, self.work.nothing(worker))
            worker.waiting = None
        if want <= 0 or worker.leaving or self.state in (TERMINATE, BROKEN):
            worker.retiring = True
            out.reply(request, None)
        else:
            worker.want = want
            if self._serve(worker, request, out):
                pass
            elif prefetch:
                out.reply(request, self.work.nothing(worker))
            else:
                worker.waiting = request
                self.idle.append(worker)

    def op_done(self, request, wid: int, entries: list, values: Any) -> None:
        """Results sent one-way (a long batch would otherwise delay them)."""
        out = Out()
        with self._lock:
            worker = self.roster.asking(wid, request.peer)
            if worker is not None and entries:
                self.work.accept(worker, entries, values, out)
                self._serve_idle(out)
        out.reply(request, None)
        self._flush(out)

    def op_present(self, request, wid: int) -> None:
        """Worker ``wid``, which asks for work over the nearby socket, is reached over
        this hub connection too: given up (a frozen job), it is lost."""
        with self._lock:
            self.roster.bind(wid, request.peer)
        request.reply(None)

    def op_giveback(self, request, wid: int, cids: list[int]) -> None:
        """Chunks a worker received but will not start soon (a long task is running)."""
        out = Out()
        with self._lock:
            worker = self.roster.workers.get(wid)
            if worker is not None and not worker.gone:
                self.work.give_back(worker, cids)
                self._serve_idle(out)
        out.reply(request, None)
        self._flush(out)

    def op_init_failed(self, request, wid: int, text: str) -> None:
        with self._lock:
            worker = self.roster.workers.get(wid)
            if worker is not None:
                worker.init_error = text
        request.reply(None)

    def peer_lost(self, peer: int) -> None:
        """Connection ``peer`` ended: its worker is lost, unless a host ran it (the host
        says how it ended: killed by a signal, its exit code)."""
        out = Out()
        with self._lock:
            worker = self.roster.by_peer.pop(peer, None)
            if worker is None or worker.hosted:
                return
            self._lose(worker, "connection lost", out)
            self._serve_idle(out)
        self._flush(out)

    # -- internals (lock held) -------------------------------------------------------------------
    def _exit_due(self) -> bool:
        return self.state in (TERMINATE, BROKEN) or (self.state == CLOSE and not self.work.groups)

    def _serve(self, worker: Worker, request: Any, out: Out) -> bool:
        """Answer ``request`` if there is work for ``worker`` (or it should exit)."""
        chunks = self.work.take(worker, self.roster.n_ready)
        if chunks:
            out.reply(request, self.work.message(worker, chunks))
            return True
        if self._exit_due():
            worker.retiring = True
            out.reply(request, None)
            return True
        return False

    def _serve_idle(self, out: Out) -> None:
        if not self.idle or not (self.work.pending or self._exit_due()):
            return
        idle = self.idle
        still: collections.deque[Worker] = collections.deque()
        while idle:
            worker = idle.popleft()
            request = worker.waiting
            if worker.gone or request is None:
                continue
            if self._serve(worker, request, out):
                worker.waiting = None
            else:
                still.append(worker)
            if not self.work.pending and not self._exit_due():
                break
        still.extend(idle)
        self.idle = still

    def _release_all(self, out: Out) -> None:
        for worker in self.idle:
            if worker.waiting is not None and not worker.gone:
                out.exit(worker)
        self.idle.clear()

    def _lose(self, worker: Worker, cause: str, out: Out) -> None:
        """``worker`` is gone: what it held goes back to the front of the queue."""
        if not self.roster.gone(worker):
            return
        if self.state in (TERMINATE, BROKEN):
            worker.held.clear()
            return
        back = self.work.take_back(worker, cause, out)
        if not worker.retiring:
            observe.notice("worker_lost", self, worker.wid, cause, back)

    def _flush(self, out: Out) -> None:
        for request, value in out.replies:
            request.reply(value)
        if out.results:
            self._deliver(out.results)
