"""``Pool``: ``multiprocessing.pool.Pool`` whose workers are jobs on a backend.

Protocol
--------
The master registers a :class:`~fiberlite.pool.dispatch.Dispatcher` servant in its
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
  more. The reply is ``(chunks, functions, forget)``, or ``None`` for *exit*. When no
  work is pending the request is kept (parked) and answered when work arrives: no
  polling, and the hub thread never blocks.
* ``want`` adapts: a worker measures its time per chunk; for short tasks it asks for
  about 5 ms of work and sends its next request (a *prefetch*) as soon as it starts a
  batch, so one batch travels while the other runs; a prefetch is answered at once,
  empty if there is no work, so results never wait behind it. For long tasks it asks
  for one chunk when idle. The master never hands a worker more than a fair share of
  what is pending. If a task overruns 0.1 s while chunks wait behind it, the worker's
  watchdog gives them back (``giveback``). Results a long batch would delay are sent
  one-way (``done``) after 20 ms.
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

Threads in the master: the hub's (dispatch), a supervisor (waits on the workers'
sentinels, starts replacements), a result thread (unpickles results, runs callbacks),
and one feeder per ``imap`` call.
"""
from __future__ import annotations

import atexit
import itertools
import os
import threading
import warnings
import weakref
from multiprocessing.connection import wait as wait_for
from typing import Any, Callable, Iterable

from ..errors import BrokenPoolError, ProcessError, WorkerLostError
from ..process import Process
from ..runtime.hub import get_hub
from .chunks import pack_arguments, pack_call, pack_items, unpack, unpack_failure
from .dispatch import BROKEN, CLOSE, REMOTE_ERROR, RUN, TERMINATE, VALUE, Dispatcher
from .results import (ApplyResult, AsyncResult, IMapIterator, IMapUnorderedIterator,
                      MapResult, MaybeEncodingError)
from .worker import worker_main
from ..wire.codec import short_repr

__all__ = ["Pool", "AsyncResult", "ApplyResult", "MapResult", "IMapIterator",
           "IMapUnorderedIterator", "WorkerLostError", "BrokenPoolError", "MaybeEncodingError"]

IMAP_WINDOW = 256  # chunks an imap reads ahead of its consumer (at least 16 per worker)
_cores: "weakref.WeakSet[_Core]" = weakref.WeakSet()


def _name(func: Any) -> str:
    return getattr(func, "__qualname__", None) or getattr(func, "__name__", None) or short_repr(func)


class _Core:
    """The state and threads of one pool; the ``Pool`` object is its facade."""

    def __init__(self, processes: int, initializer: Any, initargs: tuple,
                 maxtasks: int | None, process_type: type) -> None:
        self.processes = processes
        self.initializer = initializer
        self.initargs = tuple(initargs)
        self.maxtasks = maxtasks
        self.process_type = process_type  # the context's Process: a job on its backend
        self.state = RUN
        self.results: dict[int, Any] = {}
        self._job_ids = itertools.count()
        self.procs: dict[int, Any] = {}
        self._wids = itertools.count(1)
        self._state_lock = threading.Lock()
        self._results_cond = threading.Condition()
        self._deliveries: list = []
        self._results_stop = False
        self.dispatcher = Dispatcher(self._deliver)
        self.ref = get_hub().register(self.dispatcher)
        self._wake_r, self._wake_w = os.pipe()
        self._retry_delay = 0.0
        try:
            for _ in range(processes):
                self._start_worker()
        except BaseException:
            self.terminate()
            raise
        self._result_thread = threading.Thread(target=self._result_loop, daemon=True,
                                               name="fiberlite-pool-results")
        self._supervisor = threading.Thread(target=self._supervise, daemon=True,
                                            name="fiberlite-pool-supervisor")
        self._result_thread.start()
        self._supervisor.start()
        _cores.add(self)

    # -- results ---------------------------------------------------------------------------
    def register_result(self, sink: Any) -> int:
        job = next(self._job_ids)
        self.results[job] = sink
        return job

    def forget_result(self, job: int) -> None:
        self.results.pop(job, None)

    def _deliver(self, values: Any, entries: list) -> None:
        with self._results_cond:
            self._deliveries.append((values, entries))
            if len(self._deliveries) == 1:
                self._results_cond.notify()

    def _result_loop(self) -> None:
        cond = self._results_cond
        while True:
            with cond:
                while not self._deliveries:
                    if self._results_stop:
                        return
                    cond.wait()
                batch, self._deliveries = self._deliveries, []
            for values, entries in batch:
                self._apply(values, entries)
            del batch

    @staticmethod
    def _apply(values: Any, entries: list) -> None:
        loaded: Any = None
        error: BaseException | None = None
        if values is not None:
            try:
                loaded = unpack(values)
            except Exception as exc:
                error = MaybeEncodingError(repr(exc), "results sent by a worker")
        for sink, start, count, status, data in entries:
            try:
                if status == VALUE:
                    if error is None:
                        sink._set(start, count, True, loaded[data])
                    else:
                        sink._set(start, count, False, error)
                elif status == REMOTE_ERROR:
                    sink._set(start, count, False, unpack_failure(data))
                else:
                    sink._set(start, count, False, data)
            except Exception:  # a sink must never stop the result thread
                import traceback
                traceback.print_exc()

    def _stop_results(self, wait: bool) -> None:
        with self._results_cond:
            self._results_stop = True
            self._results_cond.notify()
        thread = getattr(self, "_result_thread", None)
        if wait and thread is not None and thread is not threading.current_thread():
            thread.join()

    def abort_results(self, error: BaseException) -> None:
        for sink in list(self.results.values()):
            sink._abort(error)

    # -- workers ---------------------------------------------------------------------------
    def _start_worker(self) -> None:
        wid = next(self._wids)
        process = self.process_type(
            target=worker_main, name=f"PoolWorker-{wid}", daemon=True,
            args=(self.ref, wid, self.initializer, self.initargs, self.maxtasks))
        self.dispatcher.add_worker(wid)
        try:
            process.start()
        except BaseException:
            self.dispatcher.remove_worker(wid)
            raise
        self.procs[wid] = process

    def wake(self) -> None:
        try:
            os.write(self._wake_w, b"x")
        except OSError:
            pass

    def _supervise(self) -> None:
        """Reap workers that exit, start replacements; stop when the pool is done."""
        dispatcher = self.dispatcher
        while True:
            sentinels = {process.sentinel: wid for wid, process in list(self.procs.items())}
            ready = wait_for(list(sentinels) + [self._wake_r], self._retry_delay or None)
            if self._wake_r in ready:
                try:
                    os.read(self._wake_r, 4096)
                except OSError:
                    pass
            if self.state == TERMINATE:
                return
            for fd in ready:
                wid = sentinels.get(fd)
                if wid is None:
                    continue
                process = self.procs.pop(wid)
                process.join()
                code = process.exitcode
                try:
                    process.close()
                except Exception:
                    pass
                dispatcher.worker_exited(wid, code)
            if dispatcher.state == BROKEN:
                self.abort_results(dispatcher.broken_error)
                for process in list(self.procs.values()):
                    process.kill()
                if not self.procs:
                    return
                continue
            self._replace()
            if not self.procs and not dispatcher.needs_workers():
                return

    def _replace(self) -> None:
        self._retry_delay = 0.0
        while len(self.procs) < self.processes and self.dispatcher.needs_workers():
            with self._state_lock:
                if self.state == TERMINATE:
                    return
                try:
                    self._start_worker()
                except Exception as exc:
                    self.dispatcher.start_failed(f"could not be created: {exc}")
                    self._retry_delay = 1.0  # try again later
                    return

    # -- shutdown ----------------------------------------------------------------------------
    def close(self) -> None:
        with self._state_lock:
            if self.state == RUN:
                self.state = CLOSE
        self.dispatcher.close()
        for sink in list(self.results.values()):
            if isinstance(sink, IMapIterator):
                sink._wake()  # feeders stop waiting for room
        self.wake()

    def terminate(self) -> None:
        with self._state_lock:
            if self.state == TERMINATE:
                return
            self.state = TERMINATE
        _cores.discard(self)
        self.dispatcher.terminate()
        self.wake()
        supervisor = getattr(self, "_supervisor", None)
        if supervisor is not None and supervisor is not threading.current_thread():
            supervisor.join()
        procs = list(self.procs.values())
        for process in procs:
            try:
                process.terminate()
            except Exception:
                pass
        for process in procs:
            try:
                process.join(5)
                if process.exitcode is None:
                    process.kill()
                    process.join()
                process.close()
            except Exception:
                pass
        self.procs.clear()
        self.abort_results(ProcessError("the pool was terminated before this result was ready"))
        self._stop_results(wait=True)
        self._release()

    def join(self) -> None:
        supervisor = getattr(self, "_supervisor", None)
        if supervisor is not None and supervisor is not threading.current_thread():
            supervisor.join()
        for process in list(self.procs.values()):
            process.join()
        self._stop_results(wait=True)
        self._release()

    def _release(self) -> None:
        hub = get_hub()
        hub.unregister(self.ref.oid)
        for fd in (self._wake_r, self._wake_w):
            try:
                os.close(fd)
            except OSError:
                pass
        self._wake_r = self._wake_w = -1


class Pool:
    """A pool of worker jobs with ``multiprocessing.pool.Pool``'s API.

    ``processes`` defaults to ``os.cpu_count()``; workers are started with
    ``context.Process`` (default: the configured backend).
    """

    def __init__(self, processes: int | None = None, initializer: Callable | None = None,
                 initargs: Iterable[Any] = (), maxtasksperchild: int | None = None,
                 context: Any = None) -> None:
        self._state = RUN
        self._core: _Core | None = None
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
        self._core = _Core(processes, initializer, tuple(initargs), maxtasksperchild,
                           Process if context is None else context.Process)

    # -- state -----------------------------------------------------------------------------
    def _check_running(self) -> _Core:
        core = self._core
        if self._state != RUN or core is None:
            raise ValueError("Pool not running")
        if core.dispatcher.state == BROKEN:
            raise core.dispatcher.broken_error
        return core

    @property
    def _pool(self) -> list:
        """The worker processes alive now (``multiprocessing`` exposes the same)."""
        return list(self._core.procs.values()) if self._core is not None else []

    def _repopulate_pool(self) -> None:
        """Replacements start on their own; this only nudges the supervisor."""
        if self._core is not None:
            self._core.wake()

    def __reduce__(self):
        raise NotImplementedError("pool objects cannot be passed between processes or pickled")

    def __repr__(self) -> str:
        return (f"<{type(self).__module__}.{type(self).__qualname__} state={self._state} "
                f"pool_size={len(self._pool)}>")

    def __enter__(self) -> "Pool":
        self._check_running()
        return self

    def __exit__(self, *exc_info: Any) -> None:
        self.terminate()

    def __del__(self, _warn=warnings.warn, RUN=RUN) -> None:
        core = getattr(self, "_core", None)
        if getattr(self, "_state", None) == RUN and core is not None:
            _warn(f"unclosed running multiprocessing pool {self!r}", ResourceWarning, source=self)
            threading.Thread(target=core.terminate, daemon=True).start()

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
        if not isinstance(iterable, (list, tuple, range)):  # sliceable, and its length is exact
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
        dispatcher = core.dispatcher
        group = dispatcher.new_group(kind, payload, _name(func), sink)
        chunks: list = []
        batch = 1  # chunks are queued as they are pickled, 1, 2, 4... at a time: workers
        #            start on the first ones while the others are pickled
        submitted = False
        try:
            for start in range(0, length, chunksize):
                items = iterable[start:start + chunksize]  # a range slice is a range
                data = pack_items(items, start, method)
                chunks.append(dispatcher.make_chunk(group, start, len(items), data))
                if len(chunks) >= batch and start + chunksize < length:
                    self._submit(core, sink, group, chunks, seal=False, new=not submitted)
                    submitted, chunks, batch = True, [], 2 * batch
        except BaseException:
            core.forget_result(sink._job)  # the caller gets the error; nobody waits for the sink
            if submitted:
                dispatcher.seal(group)  # the chunks already queued run, their results are dropped
            raise
        self._submit(core, sink, group, chunks, new=not submitted)
        return sink

    @staticmethod
    def _submit(core: _Core, sink: Any, group: Any, chunks: list, seal: bool = True,
                new: bool = True) -> None:
        try:
            core.dispatcher.submit(group, chunks, seal=seal, new=new)
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
        sink = cls(core, window)
        group = core.dispatcher.new_group("map", payload, _name(func), sink)
        self._submit(core, sink, group, [], seal=False)
        threading.Thread(target=_feed, args=(core, group, sink, iter(iterable), chunksize, method),
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


def _feed(core: _Core, group: Any, sink: IMapIterator, source: Any, chunksize: int,
          method: str) -> None:
    """Read an imap's input as its consumer makes room, and submit it chunk by chunk."""
    dispatcher = core.dispatcher
    start = 0
    try:
        exhausted = False
        while not exhausted:
            allowed = sink._reserve(chunksize, core)
            if not allowed:
                return  # the pool was terminated
            chunks = []
            for _ in range(allowed):
                try:
                    items = list(itertools.islice(source, chunksize))
                except Exception as exc:  # the input raised: that is the result at this position
                    sink._set(start, 1, False, exc)
                    start += 1
                    exhausted = True
                    break
                if not items:
                    exhausted = True
                    break
                try:
                    data = pack_items(items, start, method)
                except Exception as exc:
                    sink._set(start, len(items), False, exc)
                else:
                    chunks.append(dispatcher.make_chunk(group, start, len(items), data))
                start += len(items)
                if len(items) < chunksize:
                    exhausted = True
                    break
            if chunks:
                dispatcher.submit(group, chunks, seal=False)
        dispatcher.seal(group)
        sink._set_length(start)
    except BaseException as exc:  # the pool stopped under us
        sink._abort(exc)


@atexit.register
def _terminate_all() -> None:
    """At exit, stop the pools still running (before their daemonic workers are reaped)."""
    for core in list(_cores):
        try:
            core.terminate()
        except Exception:
            pass
