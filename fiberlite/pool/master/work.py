"""The calls under way and their chunks: what is pending, what a worker is sent, what
comes back, and what goes back to the queue when a worker dies.

:class:`Work` has no lock of its own: the dispatcher (:mod:`.dispatch`) calls it under its
lock. A chunk is *pending* until a worker is given it, then *held* by that worker
(``Worker.held``) until its result comes back or the worker dies; a call (a group) is
done when it is sealed (no more chunks will come) and none of its chunks is outstanding.
"""
from __future__ import annotations

import collections
import itertools
import time
from typing import Any, Callable

from ...errors import WorkerLostError
from ..chunks import MAX_BATCH, MESSAGE_BYTES, describe_args, pack, unpack
from .records import LOCAL_ERROR, REMOTE_ERROR, VALUE, Chunk, Group, Out, Worker, order

MAX_TRIES = 3  # workers a task may take down with it before it fails


class Work:
    """The calls of one pool and their chunks not finished yet."""

    def __init__(self, max_tries: int = MAX_TRIES,
                 on_idle_change: Callable[[], None] | None = None) -> None:
        self.max_tries = max_tries
        self._on_idle_change = on_idle_change  # called when the last call finishes
        self.pending: collections.deque[Chunk] = collections.deque()
        self.groups: dict[int, Group] = {}
        self.idle_since: float | None = time.monotonic()  # when the last call finished
        self._cids = itertools.count(1)
        self._gids = itertools.count(1)

    # -- calls ------------------------------------------------------------------------------
    def new_group(self, kind: str, payload: Any, name: str, sink: Any) -> Group:
        return Group(next(self._gids), kind, payload, name, sink)

    def make_chunk(self, group: Group, start: int, count: int, data: Any) -> Chunk:
        return Chunk(next(self._cids), group, start, count, data)

    def open(self, group: Group) -> None:
        """A new call: chunks of ``group`` may come."""
        self.groups[group.gid] = group
        self.idle_since = None

    def add(self, group: Group, chunks: list[Chunk], seal: bool) -> None:
        group.outstanding += len(chunks)
        self.pending.extend(chunks)
        if seal:
            self.seal(group)

    def seal(self, group: Group) -> None:
        """No more chunks of ``group`` will come."""
        group.sealed = True
        if group.outstanding == 0 and group.gid in self.groups:
            self._group_done(group)

    def clear(self) -> None:
        """Drop every call and chunk (the pool was terminated or broke)."""
        self.pending.clear()
        self.groups.clear()

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

    # -- handing out ------------------------------------------------------------------------
    def take(self, worker: Worker, ready: int) -> list[Chunk]:
        """Up to ``worker.want`` chunks, at most a fair share of what is pending among
        ``ready`` workers; ``worker`` holds them from now on.

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
        share = -(-len(pending) // max(1, ready))
        limit = min(worker.want, MAX_BATCH, share)
        taken: list[Chunk] = []
        size = 0
        while pending and len(taken) < limit and size < MESSAGE_BYTES:
            chunk = pending[0]
            size += chunk.size()
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

    def message(self, worker: Worker, chunks: list[Chunk]) -> tuple:
        """What ``worker`` is sent with ``chunks``: ``(chunks, functions, forget, more)``,
        the functions of the calls it has not had yet, those it may drop, and whether
        more work is to come (chunks pending, or a call still adding them): only then
        is a request sent ahead worth it (a prefetch)."""
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
        return items, functions, forget, bool(self.pending) or not chunks[-1].group.sealed

    @staticmethod
    def nothing(worker: Worker) -> tuple:
        """An answer with no work (and the functions ``worker`` may drop)."""
        forget, worker.forget = worker.forget, []
        return [], {}, forget, False

    def give_back(self, worker: Worker, cids: list[int]) -> None:
        """Chunks ``worker`` received but will not start soon: first in the queue again."""
        back = [worker.held.pop(cid) for cid in cids if cid in worker.held]
        if worker.suspect in cids:
            worker.suspect = None
        back.sort(key=order)
        self.pending.extendleft(reversed(back))

    # -- results ----------------------------------------------------------------------------
    def accept(self, worker: Worker, entries: list, values: Any, out: Out) -> None:
        """Results of chunks ``worker`` held (``(cid, failure)`` entries, the values of
        those without failure in ``values``), for delivery; a result of a chunk it no
        longer holds is a duplicate (the chunk went to another worker) and is dropped."""
        accepted = []
        index = 0
        for cid, failure in entries:
            chunk = worker.held.pop(cid, None)
            if failure is None:
                position, index = index, index + 1
            if chunk is None:
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

    # -- a worker that died -----------------------------------------------------------------
    def take_back(self, worker: Worker, cause: str, out: Out) -> int:
        """What ``worker``, gone, held goes back to the front of the queue: each chunk of a
        worker that did not retire counts a try, is split into single tasks, and fails
        with :class:`WorkerLostError` after ``max_tries``. Returns how many went back."""
        held = sorted(worker.held.values(), key=order)
        worker.held.clear()
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
        return len(back)

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
