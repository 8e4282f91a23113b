"""``Pool``: ``multiprocessing.pool.Pool`` whose workers are jobs on a backend.

Protocol
--------
The master registers a :class:`~fiberlite.pool.master.dispatch.Dispatcher` servant in its
hub and starts ``processes`` worker jobs with ``context.Process``. Dispatch is *pull*:
a worker asks for work when it has little left, so a busy or slow worker never
accumulates tasks that an idle one could run.

* A call (``map``, ``imap``, ``apply_async``...) is a *group*: its function is pickled
  once, and sent to a worker with the first chunk of that group it receives; the worker
  caches it by group id until the master says the group is finished (``forget``).
* Items are cut into *chunks* of ``chunksize`` items, each pickled once in the caller's
  thread (an unpicklable argument fails there, naming it). ``map`` queues them as they
  are pickled, in batches of 1, 2, 4... chunks, so workers start on the first chunks
  while the rest are pickled. ``imap`` reads its input lazily, at most a window of
  items ahead of what the caller consumed.
* ``next(wid, results, values, want)`` is the one round trip of a worker: it carries
  the results of the chunks finished since the last message and asks for ``want``
  more. The reply is ``(chunks, functions, forget, more)``, or ``None`` for *exit*. When no
  work is pending the request is kept (parked) and answered when work arrives: no
  polling, and the hub thread never blocks. A worker that is a job of its own on the
  master's machine sends such a request that waits for work over a Unix socket of the
  master's (:mod:`.nearby`) instead of the hub, and so do the workers forked in the host
  jobs of a pool of at most 64; those of a larger pool, through their host.
* ``want`` adapts: a worker measures its time per chunk; for short tasks it asks for
  about 80 ms of work and sends its next request (a *prefetch*) once less than half of
  that is queued, as long as the master said more work is to come (the reply's
  ``more``), so one batch travels while the other runs; a prefetch is answered at
  once, empty if there is no work, so results never wait behind it. For long tasks it
  asks for one chunk when idle. The master never hands a worker more than a fair share
  of what is pending. If a task overruns 0.1 s while chunks wait behind it, the worker's
  watchdog gives them back (``giveback``), 0.1-0.6 s after the task started: while tasks
  keep finishing it looks twice a second. Results wait at most 40 ms: then they leave
  with a prefetch if one may go, else one-way (``done``).
* The master records, per worker, the chunks it holds. When a worker dies (its
  connection drops, or its job exits) they go back to the front of the queue and a
  replacement is started; results carry chunk ids and are placed by position, so each
  is delivered exactly once and in order. A chunk that was held by a dying worker is
  split into single tasks which then run alone; a task held by ``MAX_TRIES`` (3) dead
  workers fails with :class:`WorkerLostError` naming it. Workers that die before asking
  for work (3 in a row, none alive) make the pool *broken*: every pending result and
  later call raise :class:`BrokenPoolError`, with the initializer's traceback if it raised.
* ``maxtasksperchild``: a worker asks for no more than its remaining budget and retires
  with ``want=0``; the supervisor thread starts a replacement.
* Size: the supervisor keeps ``processes`` workers, counting those whose jobs are still
  starting; calls run on the workers that are up. ``resize`` changes that number: the
  workers too many are marked *leaving* (answered ``None`` when they next ask, at once
  if they wait for work; a job whose workers never asked is stopped). With the
  ``idle_timeout`` setting, a pool whose last call finished that long ago lets every
  worker go; the next call wakes the supervisor, which starts them again.

The master's state and threads are in :mod:`.core`, the format of what travels in
:mod:`..chunks`.
"""
from __future__ import annotations

import operator
import os
import sys
import threading
import warnings
from multiprocessing.pool import MaybeEncodingError
from typing import Any, Callable, Iterable

from ... import observe
from ...errors import BrokenPoolError, WorkerLostError
from ...process import Process
from ...wire.codec import short_repr
from ..chunks import pack_arguments, pack_call
from .core import Core
from .records import BROKEN, CLOSE, RUN, TERMINATE
from .feeding import SLICEABLE, doubling, feed
from .results import (ApplyResult, AsyncResult, IMapIterator, IMapUnorderedIterator,
                      MapResult)
from .view import PoolView

__all__ = ["Pool", "AsyncResult", "ApplyResult", "MapResult", "IMapIterator",
           "IMapUnorderedIterator", "WorkerLostError", "BrokenPoolError", "MaybeEncodingError"]

IMAP_WINDOW = 256  # chunks an imap reads ahead of its consumer (at least 16 per worker)


def _known_length(iterable: Iterable) -> int | None:
    """The length of ``iterable`` if it tells it before it is read (``len`` or
    ``__length_hint__``), else None."""
    try:
        hint = operator.length_hint(iterable, -1)
    except Exception:  # a broken __len__ is the feeder's to report, not this one's
        return None
    return hint if hint >= 0 else None


def _name(func: Any) -> str:
    return getattr(func, "__qualname__", None) or getattr(func, "__name__", None) or short_repr(func)


class Pool:
    """A pool of worker jobs with ``multiprocessing.pool.Pool``'s API.

    ``processes`` defaults to ``os.cpu_count()``; workers are started with
    ``context.Process`` (default: the configured backend).
    """

    def __init__(self, processes: int | None = None, initializer: Callable | None = None,
                 initargs: Iterable[Any] = (), maxtasksperchild: int | None = None,
                 context: Any = None) -> None:
        self._state = RUN
        self._core: Core | None = None
        if processes is None:
            processes = os.cpu_count() or 1
        if processes < 1:
            raise ValueError("Number of processes must be at least 1")
        if maxtasksperchild is not None:
            if not isinstance(maxtasksperchild, int) or isinstance(maxtasksperchild, bool) \
                    or maxtasksperchild <= 0:
                raise ValueError("maxtasksperchild must be a positive int or None")
        if initializer is not None and not callable(initializer):
            raise TypeError("initializer must be a callable")
        self._processes = processes
        self._ctx = context
        self._core = Core(processes, initializer, tuple(initargs), maxtasksperchild,
                           Process if context is None else context.Process)
        observe.notice("pool", self)

    def _page_view(self) -> PoolView | None:
        """A read-only view of the pool's workers and queue, for the run's page (None
        once the pool is gone; :func:`fiberlite.observe.view_of`)."""
        core = getattr(self, "_core", None)
        return None if core is None else PoolView(core)

    # -- state -----------------------------------------------------------------------------
    def _check_running(self) -> Core:
        core = self._core
        if self._state != RUN or core is None:
            raise ValueError("Pool not running")
        if core.dispatcher.state == BROKEN:
            raise core.dispatcher.broken_error
        return core

    @property
    def _pool(self) -> list:
        """The worker processes alive now (``multiprocessing`` exposes the same); workers
        forked in a host are shown by their pid."""
        core = self._core
        return core.worker_processes() if core is not None else []

    @property
    def _cache(self) -> dict:
        """The results still waiting for some of their values, by job number, as in
        ``multiprocessing`` (empty when no task is outstanding)."""
        core = self._core
        return core.results if core is not None else {}

    def _repopulate_pool(self) -> None:
        """Replacements start on their own; this only nudges the supervisor."""
        if self._core is not None:
            self._core.wake()

    def __reduce__(self):
        raise NotImplementedError("pool objects cannot be passed between processes or pickled")

    def __repr__(self) -> str:
        """State and size without waiting for workers still starting; a pool terminated
        by the exit hook (its core ended) says so."""
        core = self._core
        state = TERMINATE if core is not None and core.state == TERMINATE else self._state
        size = core.processes if core is not None and state != TERMINATE else 0
        return f"<{type(self).__module__}.{type(self).__qualname__} state={state} pool_size={size}>"

    def __enter__(self) -> "Pool":
        self._check_running()
        return self

    def __exit__(self, *exc_info: Any) -> None:
        self.terminate()

    def __del__(self, _warn=warnings.warn, RUN=RUN, _finalizing=sys.is_finalizing) -> None:
        core = getattr(self, "_core", None)
        if getattr(self, "_state", None) != RUN or core is None or core.state == TERMINATE:
            return
        _warn(f"unclosed running multiprocessing pool {self!r}", ResourceWarning, source=self)
        if not _finalizing():  # else the exit hook stopped it (no thread starts any more)
            threading.Thread(target=core.terminate, name="fiberlite-pool-collected",
                             daemon=True).start()

    # -- size ----------------------------------------------------------------------------------
    def resize(self, processes: int) -> None:
        """Grow or shrink the running pool to ``processes`` workers.

        New workers take work as soon as their jobs start. Of the workers too many, those
        whose jobs have not started yet are stopped, idle ones exit at once and busy ones
        after their current task; chunks they received and did not start go back to the
        queue. No task is lost or run twice.
        """
        if not isinstance(processes, int) or isinstance(processes, bool) or processes < 1:
            raise ValueError(f"Pool.resize needs a whole number of workers of at least 1, "
                             f"not {processes!r} (the idle_timeout setting lets idle workers go)")
        self._check_running().resize(processes)
        self._processes = processes

    # -- submitting ----------------------------------------------------------------------------
    def apply(self, func: Callable, args: tuple = (), kwds: dict = {}) -> Any:
        """Call ``func(*args, **kwds)`` in a worker and return its result."""
        return self.apply_async(func, args, kwds).get()

    def apply_async(self, func: Callable, args: tuple = (), kwds: dict = {},
                    callback: Callable | None = None,
                    error_callback: Callable | None = None) -> ApplyResult:
        """Like :meth:`apply`, returning an :class:`AsyncResult` at once."""
        core = self._check_running()
        payload = pack_call("apply", func, "apply_async")
        data = pack_arguments(tuple(args), dict(kwds), "apply_async")
        sink = ApplyResult(core, callback, error_callback)
        dispatcher = core.dispatcher
        group = dispatcher.new_group("apply", payload, _name(func), sink)
        self._submit(core, sink, group, [dispatcher.make_chunk(group, 0, 1, data)])
        return sink

    def map(self, func: Callable, iterable: Iterable, chunksize: int | None = None) -> list:
        """``list(map(func, iterable))`` computed by the workers, in order."""
        return self._map_async(func, iterable, chunksize, "map", "map").get()

    def map_async(self, func: Callable, iterable: Iterable, chunksize: int | None = None,
                  callback: Callable | None = None,
                  error_callback: Callable | None = None) -> MapResult:
        return self._map_async(func, iterable, chunksize, "map", "map_async", callback,
                               error_callback)

    def starmap(self, func: Callable, iterable: Iterable, chunksize: int | None = None) -> list:
        """Like :meth:`map`, calling ``func(*item)`` for each item."""
        return self._map_async(func, iterable, chunksize, "star", "starmap").get()

    def starmap_async(self, func: Callable, iterable: Iterable, chunksize: int | None = None,
                      callback: Callable | None = None,
                      error_callback: Callable | None = None) -> MapResult:
        return self._map_async(func, iterable, chunksize, "star", "starmap_async", callback,
                               error_callback)

    def _map_async(self, func: Callable, iterable: Iterable, chunksize: int | None, kind: str,
                   method: str, callback: Callable | None = None,
                   error_callback: Callable | None = None) -> MapResult:
        core = self._check_running()
        if type(iterable) not in SLICEABLE:
            iterable = list(iterable)
        length = len(iterable)
        if chunksize is None:
            chunksize, extra = divmod(length, self._processes * 4)
            if extra:
                chunksize += 1
        if length and chunksize < 1:
            raise ValueError(f"Chunksize must be 1+, not {chunksize:n}")
        if length == 0:
            return MapResult(core, 0, callback, error_callback)
        payload = pack_call(kind, func, method)
        sink = MapResult(core, length, callback, error_callback)
        group = core.dispatcher.new_group(kind, payload, _name(func), sink)
        self._submit(core, sink, group, [], seal=False)
        try:
            feed(core.dispatcher, group, iterable, chunksize, method, doubling())
        except BaseException:
            core.forget_result(sink._job)  # the caller gets the error; nobody waits for the sink
            core.dispatcher.seal(group)  # the chunks already queued run, their results are dropped
            raise
        return sink

    @staticmethod
    def _submit(core: Core, sink: Any, group: Any, chunks: list, seal: bool = True) -> None:
        try:
            core.dispatcher.submit(group, chunks, seal=seal, new=True)
        except BaseException:
            core.forget_result(sink._job)
            raise

    def imap(self, func: Callable, iterable: Iterable, chunksize: int = 1) -> IMapIterator:
        """Results in order, computed as the input is read (lazily, with bounded memory)."""
        return self._imap(IMapIterator, func, iterable, chunksize, "imap")

    def imap_unordered(self, func: Callable, iterable: Iterable,
                       chunksize: int = 1) -> IMapUnorderedIterator:
        """Like :meth:`imap`, results in the order they finish."""
        return self._imap(IMapUnorderedIterator, func, iterable, chunksize, "imap_unordered")

    def _imap(self, cls: type, func: Callable, iterable: Iterable, chunksize: int,
              method: str) -> Any:
        core = self._check_running()
        if chunksize < 1:
            raise ValueError(f"Chunksize must be 1+, not {chunksize:n}")
        payload = pack_call("map", func, method)
        window = max(IMAP_WINDOW, 16 * self._processes) * chunksize
        sink = cls(core, window, _known_length(iterable))
        group = core.dispatcher.new_group("map", payload, _name(func), sink)
        self._submit(core, sink, group, [], seal=False)
        threading.Thread(target=_feed_imap, args=(core, group, sink, iterable, chunksize, method),
                         name="fiberlite-pool-feeder", daemon=True).start()
        return sink

    # -- shutdown ------------------------------------------------------------------------------
    def close(self) -> None:
        """No more work will be submitted; workers exit once what was submitted is done."""
        if self._state == RUN:
            self._state = CLOSE
        if self._core is not None:
            self._core.close()

    def terminate(self) -> None:
        """Stop the workers now; unfinished results raise ``ProcessError``."""
        self._state = TERMINATE
        if self._core is not None:
            self._core.terminate()

    def join(self) -> None:
        """Wait for the workers to exit (after :meth:`close` or :meth:`terminate`)."""
        if self._state == RUN:
            raise ValueError("Pool is still running")
        if self._core is not None:
            self._core.join()


def _feed_imap(core: Core, group: Any, sink: IMapIterator, source: Iterable, chunksize: int,
               method: str) -> None:
    """An imap's feeder thread: its input is read as its consumer makes room."""
    def failed(start: int, count: int, exc: Exception) -> None:
        sink._set(start, count, False, exc)
    try:
        length = feed(core.dispatcher, group, source, chunksize, method,
                      lambda: sink._reserve(chunksize, core), failed)
        if length is not None:
            sink._set_length(length)
    except BaseException as exc:  # the pool stopped under us
        sink._abort(exc)


observe.provides_view(Pool, Pool._page_view)
