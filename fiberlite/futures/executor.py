"""``ProcessPoolExecutor``: ``concurrent.futures``' executor on a fiberlite ``Pool``.

The executor keeps the Pool's guarantees (pull-based dispatch, a dead worker's task run
again elsewhere, a poison task failed with ``WorkerLostError`` naming it, workers packed
into host jobs and shown on the live page) and adds what ``concurrent.futures`` promises:

* ``submit`` returns a :class:`concurrent.futures.Future`. At most ``window`` submitted
  tasks are handed to the pool at once (marked *running*, as the standard library marks
  the tasks it puts in its call queue); the others wait here, where ``cancel()`` still
  removes them. Each finished task hands the next waiting one over.
* ``map`` is one pool ``imap`` per call (:mod:`.mapping`), whose chunks are read as the
  workers take them.
* A task's exception is re-raised by ``result()`` with the remote traceback as its
  ``__cause__``. A pool that breaks (its workers die before taking any work, e.g. the
  initializer raises) fails every pending future with :class:`BrokenProcessPool`.
* ``shutdown(wait, cancel_futures)``: no new task; ``cancel_futures`` cancels what was not
  handed over; the pool is closed and joined once every future is done (in a thread of
  its own when ``wait`` is false).
"""
from __future__ import annotations

import collections
import concurrent.futures
import os
import threading
from concurrent.futures.process import BrokenProcessPool
from typing import Any, Callable, Iterable, Iterator

from ..context import BaseContext, default_context
from ..errors import BrokenPoolError
from .mapping import MapRun

__all__ = ["ProcessPoolExecutor"]

WINDOW_PER_WORKER = 8  # submitted tasks handed to the pool per worker (enough to prefetch)


def _broken(exc: BaseException) -> BaseException:
    """The standard library's exception for a broken pool, caused by fiberlite's."""
    if isinstance(exc, BrokenPoolError):
        broken = BrokenProcessPool(f"the process pool is not usable anymore: {exc}")
        broken.__cause__ = exc
        return broken
    return exc


class ProcessPoolExecutor(concurrent.futures.Executor):
    """``concurrent.futures.ProcessPoolExecutor`` whose workers are fiberlite jobs.

    ``mp_context`` is a fiberlite context (``fiberlite.get_context("docker")``...): it
    picks the backend of the workers. ``max_workers`` defaults to ``os.cpu_count()``.
    """

    def __init__(self, max_workers: int | None = None, mp_context: BaseContext | None = None,
                 initializer: Callable | None = None, initargs: tuple = (), *,
                 max_tasks_per_child: int | None = None) -> None:
        if max_workers is None:
            max_workers = os.cpu_count() or 1
        elif not isinstance(max_workers, int) or isinstance(max_workers, bool) or max_workers <= 0:
            raise ValueError(f"max_workers must be a whole number greater than 0, not {max_workers!r}")
        if mp_context is None:
            mp_context = default_context
        elif not isinstance(mp_context, BaseContext) or not hasattr(mp_context, "backend"):
            raise TypeError(f"mp_context must be a fiberlite context (fiberlite.get_context(...)), "
                            f"not {mp_context!r}: the standard library's contexts go with "
                            f"concurrent.futures.ProcessPoolExecutor")
        if initializer is not None and not callable(initializer):
            raise TypeError("initializer must be a callable")
        if max_tasks_per_child is not None and (
                not isinstance(max_tasks_per_child, int) or isinstance(max_tasks_per_child, bool)
                or max_tasks_per_child < 1):
            raise ValueError(f"max_tasks_per_child must be >= 1, not {max_tasks_per_child!r}")
        self._max_workers = max_workers
        self._mp_context = mp_context
        self._window = WINDOW_PER_WORKER * max_workers
        self._lock = threading.Lock()  # the hand-over: queue, count, state
        self._queued: collections.deque = collections.deque()
        self._in_flight = 0
        self._shutdown = False
        self._live: set = set()  # futures and maps (MapRun) not done yet
        self._idle = threading.Condition()  # guards _live; notified when it empties
        self._closer_lock = threading.Lock()
        self._closed = False
        self._pool = mp_context.Pool(max_workers, initializer, tuple(initargs),
                                     max_tasks_per_child)

    def __repr__(self) -> str:
        state = "shut down" if self._shutdown else "running"
        return (f"<fiberlite ProcessPoolExecutor max_workers={self._max_workers} "
                f"backend={self._mp_context.backend!r} {state}>")

    # -- futures -----------------------------------------------------------------------------
    def _new_future(self) -> concurrent.futures.Future:
        """(hand-over lock held) A future counted until it is done."""
        self._check_open()
        future: concurrent.futures.Future = concurrent.futures.Future()
        with self._idle:
            self._live.add(future)
        future.add_done_callback(self._forget)
        return future

    def _check_open(self) -> None:
        if self._shutdown:
            raise RuntimeError("cannot schedule new futures after shutdown")

    def _forget(self, done: Any) -> None:
        """A future or a map is done."""
        with self._idle:
            self._live.discard(done)
            if not self._live:
                self._idle.notify_all()

    # -- submit ------------------------------------------------------------------------------
    def submit(self, fn: Callable, /, *args: Any, **kwargs: Any) -> concurrent.futures.Future:
        """Schedule ``fn(*args, **kwargs)``; its :class:`~concurrent.futures.Future`."""
        with self._lock:
            future = self._new_future()
            if self._in_flight < self._window and not self._queued:
                self._in_flight += 1
                future.set_running_or_notify_cancel()
                item = (future, fn, args, kwargs)
            else:
                self._queued.append((future, fn, args, kwargs))
                item = None
        if item is not None:
            self._hand_over(item)
        return future

    def _hand_over(self, item: tuple | None) -> None:
        """Give the pool ``item`` and, while that fails at once, the next waiting ones."""
        while item is not None:
            future, fn, args, kwargs = item
            try:
                self._pool.apply_async(fn, args, kwargs,
                                       callback=lambda value, f=future: self._settled(f, True, value),
                                       error_callback=lambda exc, f=future: self._settled(f, False, exc))
                return
            except BaseException as exc:  # unpicklable, pool broken or closed
                future.set_exception(_broken(exc))
                item = self._next_waiting()

    def _settled(self, future: concurrent.futures.Future, ok: bool, value: Any) -> None:
        """The pool's callback: the future's outcome, then the next waiting task."""
        if ok:
            future.set_result(value)
        else:
            future.set_exception(_broken(value))
        self._hand_over(self._next_waiting())

    def _next_waiting(self) -> tuple | None:
        """A slot is free: the next waiting task not cancelled, marked running (or None)."""
        with self._lock:
            while self._queued:
                item = self._queued.popleft()
                if item[0].set_running_or_notify_cancel():
                    return item
            self._in_flight -= 1
            return None

    # -- map ---------------------------------------------------------------------------------
    def map(self, fn: Callable, *iterables: Iterable, timeout: float | None = None,
            chunksize: int = 1) -> Iterator:
        """``map(fn, *iterables)`` computed by the workers, results in order; ``chunksize``
        items travel together; ``TimeoutError`` if the results are not all in within
        ``timeout`` seconds of this call."""
        if not isinstance(chunksize, int) or chunksize < 1:
            raise ValueError("chunksize must be >= 1.")
        items = list(zip(*iterables))
        if not items:
            return iter(())
        run = MapRun([items[start:start + chunksize] for start in range(0, len(items), chunksize)],
                     self._forget, _broken)
        with self._lock:
            self._check_open()
            with self._idle:
                self._live.add(run)
        run.start(self._pool, fn, self._max_workers)
        return run.results(timeout)

    # -- shutdown ----------------------------------------------------------------------------
    def shutdown(self, wait: bool = True, *, cancel_futures: bool = False) -> None:
        """No new task; ``cancel_futures`` cancels what no worker took yet; ``wait``
        waits for the rest to finish and the workers to exit."""
        with self._lock:
            self._shutdown = True
        if cancel_futures:
            with self._idle:
                live = list(self._live)
            for future in live:
                future.cancel()  # false for those handed over: they run to the end
        if wait:
            self._close_when_idle()
        else:
            threading.Thread(target=self._close_when_idle, name="fiberlite-executor-shutdown",
                             daemon=True).start()

    def terminate_workers(self) -> None:
        """Stop now (as Python 3.14's executor): what no worker took is cancelled, the
        workers are ended, and the futures of what they ran fail."""
        self.shutdown(wait=False, cancel_futures=True)
        with self._closer_lock:
            if not self._closed:
                self._pool.terminate()
                self._pool.join()
                self._closed = True

    def __del__(self) -> None:
        """Dropped without ``shutdown``: as the standard library's, the workers are let go
        (nothing runs any more: a running task's callback holds the executor)."""
        pool = getattr(self, "_pool", None)
        if pool is not None and not self._closed:
            try:
                pool.close()
            except Exception:
                pass

    def _close_when_idle(self) -> None:
        with self._idle:
            while self._live:
                self._idle.wait()
        with self._closer_lock:
            if not self._closed:
                self._pool.close()
                self._pool.join()
                self._closed = True
