"""The Pool's servant in the master's hub: pending chunks, who holds what, who waits.

Every method runs under the servant's lock and never blocks; replies and result
deliveries are collected while the lock is held and sent after it is released.
See :mod:`fiberlite.pool` for the protocol.
"""
from __future__ import annotations

import collections
import itertools
import time
from typing import Any, Callable

from .. import observe
from ..errors import BrokenPoolError, WorkerLostError
from ..runtime.exit_codes import describe_exit
from ..runtime.hub import LockedServant
from .chunks import describe_args, pack, unpack

RUN, CLOSE, TERMINATE, BROKEN = "RUN", "CLOSE", "TERMINATE", "BROKEN"
MAX_TRIES = 3  # workers a task may take down with it before it fails
MAX_BATCH = 512  # chunks in one reply
MESSAGE_BYTES = 4 << 20  # pickled arguments in one reply (at least one chunk)
# workers in a row that end before asking for work, after which the pool is broken:
START_FAILURES = 3  # ... exiting on their own (initializer raised, exit code, import error)
START_KILLS = 10  # ... killed by a signal (someone else may be killing them)

_NOTHING: tuple = ([], {}, [])  # an answer with no work

# how a delivered chunk carries its outcome (see Dispatcher.deliver)
VALUE, REMOTE_ERROR, LOCAL_ERROR = 0, 1, 2


class Group:
    """One call (``map``, ``imap``, ``apply_async``...): its pickled function and its sink."""

    __slots__ = ("gid", "kind", "payload", "name", "sink", "outstanding", "sealed", "workers")

    def __init__(self, gid: int, kind: str, payload: Any, name: str, sink: Any) -> None:
        self.gid = gid
        self.kind = kind  # "map", "star" or "apply" (see fiberlite.pool.chunks)
        self.payload = payload  # Payload of (kind, func)
        self.name = name
        self.sink = sink
        self.outstanding = 0  # chunks submitted and not finished
        self.sealed = False  # no more chunks will be submitted
        self.workers: list[Worker] = []  # workers that were sent the function


class Chunk:
    """Consecutive items of one call, pickled once when submitted."""

    __slots__ = ("cid", "group", "start", "count", "data", "tries", "causes")

    def __init__(self, cid: int, group: Group, start: int, count: int, data: Any) -> None:
        self.cid = cid
        self.group = group
        self.start = start
        self.count = count
        self.data = data  # pickled list of items ((args, kwds) for apply)
        self.tries = 0  # workers that died holding it
        self.causes: tuple[str, ...] = ()  # how those workers died


class Worker:
    """The master's record of one worker job."""

    __slots__ = ("wid", "peer", "ready", "gone", "retiring", "leaving", "held", "groups",
                 "forget", "waiting", "want", "suspect", "init_error")

    def __init__(self, wid: int) -> None:
        self.wid = wid
        self.peer: int | None = None
        self.ready = False  # it asked for work (its initializer succeeded)
        self.gone = False
        self.retiring = False  # it was told to exit: what it still holds is no crash
        self.leaving = False  # the pool shrinks without it: told to exit when it next asks
        self.held: dict[int, Chunk] = {}
        self.groups: set[int] = set()  # functions it has
        self.forget: list[int] = []  # functions it may drop
        self.waiting: Any = None  # its parked request for work
        self.want = 1
        self.suspect: int | None = None  # a chunk that crashed a worker before, run alone
        self.init_error: str | None = None


class _Out:
    """Replies and deliveries gathered under the lock, sent after releasing it."""

    __slots__ = ("replies", "results")

    def __init__(self) -> None:
        self.replies: list[tuple[Any, Any]] = []
        self.results: list[tuple[Any, list]] = []


class Dispatcher(LockedServant):
    """Hands chunks to workers that ask for them; takes results back exactly once."""

    def __init__(self, deliver: Callable[[list], None], max_tries: int = MAX_TRIES,
                 on_idle_change: Callable[[], None] | None = None) -> None:
        super().__init__()
        self._deliver = deliver
        # called when the last call finishes, and when work comes to a released pool
        self._on_idle_change = on_idle_change
        self.max_tries = max_tries
        self.state = RUN
        self.broken_error: BaseException | None = None
        self.pending: collections.deque[Chunk] = collections.deque()
        self.workers: dict[int, Worker] = {}
        self.by_peer: dict[int, Worker] = {}
        self.idle: collections.deque[Worker] = collections.deque()
        self.groups: dict[int, Group] = {}
        self.n_ready = 0
        self.start_failures = self.start_kills = 0
        self.last_failure = ""
        self.leaving = 0  # workers marked leaving and not yet gone
        self.idle_since: float | None = time.monotonic()  # when the last call finished
        self.released = False  # idle too long: every worker was let go until work comes
        self._cids = itertools.count(1)
        self._gids = itertools.count(1)

    # -- the master's side ------------------------------------------------------------------
    def new_group(self, kind: str, payload: Any, name: str, sink: Any) -> Group:
        group = Group(next(self._gids), kind, payload, name, sink)
        observe.notice("batch", self, group)
        return group

    def make_chunk(self, group: Group, start: int, count: int, data: Any) -> Chunk:
        return Chunk(next(self._cids), group, start, count, data)

    def submit(self, group: Group, chunks: list[Chunk], seal: bool, new: bool = False) -> None:
        """Queue ``chunks`` of ``group`` (a new call needs a running pool)."""
        out = _Out()
        woken = False
        with self._lock:
            if new:
                self._check(RUN)
                self.groups[group.gid] = group
                self.idle_since = None
                woken, self.released = self.released, False
            else:
                self._check(RUN, CLOSE)
            group.outstanding += len(chunks)
            self.pending.extend(chunks)
            if seal:
                group.sealed = True
                if group.outstanding == 0:
                    self._group_done(group)
            self._serve_idle(out)
        self._flush(out)
        if woken and self._on_idle_change is not None:
            self._on_idle_change()

    def _check(self, *states: str) -> None:
        if self.state in states:
            return
        if self.state == BROKEN and self.broken_error is not None:
            raise self.broken_error
        raise ValueError("Pool not running")

    def add_worker(self, wid: int) -> None:
        with self._lock:
            self.workers[wid] = Worker(wid)

    def add_worker_below(self, wid: int, wanted: int) -> bool:
        """Add worker ``wid`` if fewer than ``wanted`` workers stay (see :meth:`staying`)."""
        with self._lock:
            if len(self.workers) - self.leaving >= wanted:
                return False
            self.workers[wid] = Worker(wid)
            return True

    def remove_worker(self, wid: int) -> None:
        """Forget a worker whose job could not be created."""
        with self._lock:
            self._pop_worker(wid)

    def _pop_worker(self, wid: int) -> Worker | None:
        worker = self.workers.pop(wid, None)
        if worker is not None and worker.leaving:
            self.leaving -= 1
        return worker

    def staying(self) -> int:
        """Workers started or starting that the pool keeps (not leaving)."""
        with self._lock:
            return len(self.workers) - self.leaving

    def retire(self, count: int) -> list[int]:
        """Let ``count`` workers go, those that never asked for work first, then idle ones,
        then those holding least: an idle one is told to exit now, a busy one when it
        next asks (after its current task; chunks it holds and has not started go back).
        Returns the ids of those that never asked for work: their jobs may be stopped."""
        out = _Out()
        with self._lock:
            chosen = self._retire(count, out)
        self._flush(out)
        return chosen

    def _retire(self, count: int, out: _Out) -> list[int]:
        candidates = [w for w in self.workers.values()
                      if not (w.gone or w.leaving or w.retiring)]
        candidates.sort(key=lambda w: (w.ready, w.waiting is None, len(w.held)))
        chosen = candidates[:max(0, count)]
        for worker in chosen:
            worker.leaving = True
            self.leaving += 1
            if worker.waiting is not None:
                worker.retiring = True
                out.replies.append((worker.waiting, None))
                worker.waiting = None
        return [worker.wid for worker in chosen if not worker.ready]

    def release_if_idle(self, timeout: float) -> tuple[float | None, list[int]]:
        """Let every worker go if the pool has had no work for ``timeout`` seconds.

        Returns the seconds left until that would happen (None: not idle, or already
        released) and, when it happened, the ids of workers that never asked for work.
        Work submitted later clears :attr:`released` and calls ``on_idle_change``."""
        out = _Out()
        with self._lock:
            if self.state != RUN or self.released or self.idle_since is None:
                return None, []
            left = self.idle_since + timeout - time.monotonic()
            if left > 0:
                return left, []
            self.released = True
            unstarted = self._retire(len(self.workers), out)
        self._flush(out)
        return None, unstarted

    def ever_ready(self, wid: int) -> bool:
        """Whether worker ``wid`` asked for work once (False once it is forgotten)."""
        with self._lock:
            worker = self.workers.get(wid)
            return worker is not None and worker.ready

    def worker_exited(self, wid: int, exitcode: int | None) -> None:
        """The job of worker ``wid`` ended (reported by the pool's supervisor)."""
        out = _Out()
        with self._lock:
            worker = self._pop_worker(wid)
            if worker is None:
                return
            if worker.peer is not None and self.by_peer.get(worker.peer) is worker:
                del self.by_peer[worker.peer]
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
        out = _Out()
        with self._lock:
            self._start_failed(reason, out)
        self._flush(out)

    def _start_failed(self, reason: str, out: _Out, killed: bool = False) -> None:
        if killed:
            self.start_kills += 1
        else:
            self.start_failures += 1
        self.last_failure = reason
        if self.n_ready == 0 and (self.start_failures >= START_FAILURES
                                  or self.start_kills >= START_KILLS):
            self._break(out)

    def fail(self, error: BaseException) -> None:
        """The pool cannot go on (``error`` says why): every caller gets ``error``."""
        out = _Out()
        with self._lock:
            if self.state != BROKEN:
                self._break(out, error)
        self._flush(out)

    def _break(self, out: _Out, error: BaseException | None = None) -> None:
        self.state = BROKEN
        self.broken_error = error or BrokenPoolError(
            f"the pool's workers cannot start: "
            f"{self.start_failures + self.start_kills} in a row ended before asking for work; "
            f"the last one: {self.last_failure.rstrip()}")
        self.pending.clear()
        self.groups.clear()
        self._release_all(out)

    def needs_workers(self) -> bool:
        """Whether dead workers should be replaced."""
        return self.state == RUN or (self.state == CLOSE and bool(self.groups))

    def close(self) -> None:
        out = _Out()
        with self._lock:
            if self.state == RUN:
                self.state = CLOSE
            self._serve_idle(out)
        self._flush(out)

    def terminate(self) -> None:
        out = _Out()
        with self._lock:
            if self.state != BROKEN:
                self.state = TERMINATE
            self.pending.clear()
            self.groups.clear()
            self._release_all(out)
        self._flush(out)

    def seal(self, group: Group) -> None:
        """No more chunks of ``group`` will come (an imap's input is exhausted)."""
        out = _Out()
        with self._lock:
            group.sealed = True
            if group.outstanding == 0 and group.gid in self.groups:
                self._group_done(group)
            self._serve_idle(out)
        self._flush(out)

    # -- operations of the workers -------------------------------------------------------------
    def op_next(self, request, wid: int, entries: list, values: Any, want: int,
                prefetch: bool = False) -> None:
        """Results of finished chunks, and a request for ``want`` more (0: I am retiring).

        Answered with ``(chunks, functions, forget)``, or ``None`` (exit). A worker that
        is idle is held until there is work; a ``prefetch`` (the worker still has work)
        is answered at once, with no chunks if there are none.
        """
        self.next_many([(request, (wid, entries, values, want, prefetch))])

    def next_many(self, calls: list[tuple[Any, tuple]]) -> None:
        """Several :meth:`op_next` calls ``(request, args)`` handled together, as a pool
        host sends them: one pass under the lock, answers and results passed on at once."""
        out = _Out()
        with self._lock:
            for request, (wid, entries, values, want, prefetch) in calls:
                self._next(request, wid, entries, values, want, prefetch, out)
            self._serve_idle(out)
        self._flush(out)

    def _next(self, request: Any, wid: int, entries: list, values: Any, want: int,
              prefetch: bool, out: _Out) -> None:
        worker = self._worker(wid, request.peer)
        if worker is None:
            out.replies.append((request, None))
            return
        if entries:
            self._accept(worker, entries, values, out)
        if worker.waiting is not None:  # cannot happen; never leave a request unanswered
            out.replies.append((worker.waiting, _NOTHING))
            worker.waiting = None
        if want <= 0 or worker.leaving or self.state in (TERMINATE, BROKEN):
            worker.retiring = True
            out.replies.append((request, None))
        else:
            worker.want = want
            if self._serve(worker, request, out):
                pass
            elif prefetch:
                out.replies.append((request, self._nothing(worker)))
            else:
                worker.waiting = request
                self.idle.append(worker)

    def op_done(self, request, wid: int, entries: list, values: Any) -> None:
        """Results sent one-way (a long batch would otherwise delay them)."""
        out = _Out()
        with self._lock:
            worker = self._worker(wid, request.peer)
            if worker is not None and entries:
                self._accept(worker, entries, values, out)
                self._serve_idle(out)
        out.replies.append((request, None))
        self._flush(out)

    def op_giveback(self, request, wid: int, cids: list[int]) -> None:
        """Chunks a worker received but will not start soon (a long task is running)."""
        out = _Out()
        with self._lock:
            worker = self.workers.get(wid)
            if worker is not None and not worker.gone:
                back = [worker.held.pop(cid) for cid in cids if cid in worker.held]
                if worker.suspect in cids:
                    worker.suspect = None
                back.sort(key=_order)
                self.pending.extendleft(reversed(back))
                self._serve_idle(out)
        out.replies.append((request, None))
        self._flush(out)

    def op_init_failed(self, request, wid: int, text: str) -> None:
        with self._lock:
            worker = self.workers.get(wid)
            if worker is not None:
                worker.init_error = text
        request.reply(None)

    def peer_lost(self, peer: int) -> None:
        out = _Out()
        with self._lock:
            worker = self.by_peer.pop(peer, None)
            if worker is None:
                return
            self._lose(worker, "connection lost", out)
            self._serve_idle(out)
        self._flush(out)

    # -- internals (lock held) ---------------------------------------------------------------------
    def _worker(self, wid: int, peer: int) -> Worker | None:
        worker = self.workers.get(wid)
        if worker is None or worker.gone:
            return None
        if worker.peer is None:
            worker.peer = peer
            self.by_peer[peer] = worker
        if not worker.ready:
            worker.ready = True
            self.n_ready += 1
            self.start_failures = self.start_kills = 0
        return worker

    def _accept(self, worker: Worker, entries: list, values: Any, out: _Out) -> None:
        accepted = []
        index = 0
        for cid, failure in entries:
            chunk = worker.held.pop(cid, None)
            if failure is None:
                position, index = index, index + 1
            if chunk is None:  # a duplicate (the chunk was given to another worker): drop it
                continue
            if worker.suspect == cid:
                worker.suspect = None
            group = chunk.group
            if failure is None:
                accepted.append((group.sink, chunk.start, chunk.count, VALUE, position))
            else:
                accepted.append((group.sink, chunk.start, chunk.count, REMOTE_ERROR, failure))
            self._chunk_done(group)
        if accepted:
            out.results.append((values, accepted))

    def _chunk_done(self, group: Group) -> None:
        group.outstanding -= 1
        if group.outstanding <= 0 and group.sealed and group.gid in self.groups:
            self._group_done(group)

    def _group_done(self, group: Group) -> None:
        del self.groups[group.gid]
        if not self.groups:
            self.idle_since = time.monotonic()
            if self._on_idle_change is not None:
                self._on_idle_change()  # never blocks (the pool's wake-up pipe)
        for worker in group.workers:
            if not worker.gone:
                worker.groups.discard(group.gid)
                worker.forget.append(group.gid)
        group.workers = []

    def _exit_due(self) -> bool:
        return self.state in (TERMINATE, BROKEN) or (self.state == CLOSE and not self.groups)

    def _serve(self, worker: Worker, request: Any, out: _Out) -> bool:
        """Answer ``request`` if there is work for ``worker`` (or it should exit)."""
        chunks = self._take(worker)
        if chunks:
            out.replies.append((request, self._message(worker, chunks)))
            return True
        if self._exit_due():
            worker.retiring = True
            out.replies.append((request, None))
            return True
        return False

    def _serve_idle(self, out: _Out) -> None:
        if not self.idle or not (self.pending or self._exit_due()):
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
            if not self.pending and not self._exit_due():
                break
        still.extend(idle)
        self.idle = still

    def _release_all(self, out: _Out) -> None:
        for worker in self.idle:
            if worker.waiting is not None and not worker.gone:
                worker.retiring = True
                out.replies.append((worker.waiting, None))
                worker.waiting = None
        self.idle.clear()

    def _take(self, worker: Worker) -> list[Chunk]:
        """Up to ``worker.want`` chunks, at most a fair share of what is pending.

        A chunk that was held by a worker that died (a suspect) travels alone, to a
        worker that holds nothing else, so that the next death is blamed on it only.
        """
        pending = self.pending
        if worker.suspect is not None or not pending:
            return []
        if worker.want == 1 and not pending[0].tries:  # the common case of short tasks
            chunk = pending.popleft()
            worker.held[chunk.cid] = chunk
            return [chunk]
        share = -(-len(pending) // max(1, self.n_ready))
        limit = min(worker.want, MAX_BATCH, share)
        taken: list[Chunk] = []
        size = 0
        while pending and len(taken) < limit and size < MESSAGE_BYTES:
            chunk = pending[0]
            data = chunk.data
            size += len(data) if type(data) is bytes else data.nbytes()
            if chunk.tries:
                if taken or worker.held:
                    break
                pending.popleft()
                taken.append(chunk)
                worker.suspect = chunk.cid
                break
            pending.popleft()
            taken.append(chunk)
        held = worker.held
        for chunk in taken:
            held[chunk.cid] = chunk
        return taken

    def _nothing(self, worker: Worker) -> tuple:
        forget, worker.forget = worker.forget, []
        return [], {}, forget

    def _message(self, worker: Worker, chunks: list[Chunk]) -> tuple:
        functions = {}
        known = worker.groups
        items = []
        for chunk in chunks:
            group = chunk.group
            gid = group.gid
            if gid not in known:
                known.add(gid)
                group.workers.append(worker)
                functions[gid] = group.payload
            items.append((chunk.cid, gid, chunk.data))
        forget, worker.forget = worker.forget, []
        return items, functions, forget

    def _lose(self, worker: Worker, cause: str, out: _Out) -> None:
        """``worker`` is gone: what it held goes back to the front of the queue."""
        if worker.gone:
            return
        worker.gone = True
        worker.waiting = None
        if worker.ready:
            self.n_ready -= 1
        held = sorted(worker.held.values(), key=_order)
        worker.held.clear()
        worker.suspect = None
        if self.state in (TERMINATE, BROKEN):
            return
        back: list[Chunk] = []
        for chunk in held:
            if chunk.group.gid not in self.groups:
                continue
            if not worker.retiring:
                chunk.tries += 1
                chunk.causes += (cause,)
                if chunk.tries >= self.max_tries:
                    error = self._lost_error(chunk)
                    out.results.append((None, [(chunk.group.sink, chunk.start, chunk.count,
                                                 LOCAL_ERROR, error)]))
                    self._chunk_done(chunk.group)
                    continue
                if chunk.count > 1:
                    back.extend(self._split(chunk))
                    continue
            back.append(chunk)
        self.pending.extendleft(reversed(back))
        if not worker.retiring:
            observe.notice("worker_lost", self, worker.wid, cause, len(back))

    def _split(self, chunk: Chunk) -> list[Chunk]:
        """One chunk per item, so that a task that kills its worker is found alone."""
        try:
            items = unpack(chunk.data)
            parts = []
            for offset, item in enumerate(items):
                part = self.make_chunk(chunk.group, chunk.start + offset, 1, pack([item]))
                part.tries, part.causes = chunk.tries, chunk.causes
                parts.append(part)
        except Exception:
            return [chunk]
        chunk.group.outstanding += len(parts) - 1
        return parts

    def _lost_error(self, chunk: Chunk) -> WorkerLostError:
        task = f"{chunk.group.name}({describe_args(chunk.group.kind, chunk.data)})"
        return WorkerLostError(
            f"task {task} failed: each of the {chunk.tries} workers that ran it died "
            f"({'; '.join(chunk.causes)}). A task that kills its worker (os._exit, a signal, "
            f"running out of memory) is given up after {self.max_tries} tries.")

    def _flush(self, out: _Out) -> None:
        for request, value in out.replies:
            request.reply(value)
        if out.results:
            self._deliver(out.results)


def _order(chunk: Chunk) -> tuple[int, int]:
    return chunk.group.gid, chunk.start
