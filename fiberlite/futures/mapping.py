"""The executor's ``map``: one pool ``imap`` per call over chunks of ``chunksize`` items.

The standard library makes a future per chunk; here one :class:`MapRun` stands for
them all (a future costs microseconds, a tiny task less), with the same behaviour:

* The pool's feeder reads the chunks from :meth:`MapRun.feed` as the workers take them:
  a chunk read is *running*; :meth:`MapRun.cancel` (the result iterator's timeout or
  close, ``shutdown(cancel_futures=True)``) stops the reading, and the chunks not read
  raise :class:`~concurrent.futures.CancelledError` if asked for.
* Several chunks travel together as one pool chunk, sized as ``Pool.map`` sizes its own.
* What a worker runs (:class:`RunChunk`) catches a chunk's exception and returns it as a
  :class:`~fiberlite.failure.Failure`, tagged with the chunk's index. The pool's own
  failures of a task (a worker lost three times, a result that cannot be pickled) arrive
  as exceptions at their place in the ordered results: the index of the next result
  tells which chunks they were.
"""
from __future__ import annotations

import concurrent.futures
import threading
import time
from multiprocessing.pool import MaybeEncodingError
from typing import Any, Callable, Iterator

from ..errors import TimeoutError as PoolTimeout
from ..errors import WorkerLostError
from ..failure import Failure

__all__ = ["MapRun", "RunChunk"]

_MISSING = object()


class RunChunk:
    """In a worker: ``fn`` on each argument tuple of a chunk, as ``(index, ok, value)``."""

    def __init__(self, fn: Callable) -> None:
        self.fn = fn

    def __call__(self, job: tuple[int, list]) -> tuple[int, bool, Any]:
        index, chunk = job
        fn = self.fn
        try:
            return index, True, [fn(*args) for args in chunk]
        except Exception as exc:
            return index, False, Failure.of(exc)


class MapRun:
    """One ``map`` call: its chunks, what the pool read of them, and their outcomes.

    ``finished(run)`` is called once, when nothing of it runs any more."""

    def __init__(self, chunks: list, finished: Callable[["MapRun"], None],
                 translate: Callable[[BaseException], BaseException]) -> None:
        self._chunks = chunks
        self._outcomes: list = [_MISSING] * len(chunks)  # (ok, value) per chunk
        self._fed = 0  # chunks the pool read
        self._settled = 0  # of those, with an outcome
        self._expected = 0  # the index of the next chunk whose result comes
        self._stopped = False  # no more chunks are read
        self._cond = threading.Condition()
        self._finished = finished
        self._translate = translate

    # -- the pool's side ---------------------------------------------------------------------
    def start(self, pool: Any, fn: Callable, workers: int) -> None:
        per_task = max(1, -(-len(self._chunks) // (4 * workers)))
        try:
            results = pool.imap(RunChunk(fn), self.feed(), chunksize=per_task)
        except BaseException as exc:  # fn cannot be pickled, the pool broke
            self._fail_all(self._translate(exc))
            return
        threading.Thread(target=self._collect, args=(results,), name="fiberlite-executor-map",
                         daemon=True).start()

    def feed(self) -> Iterator[tuple[int, list]]:
        """The chunks, as the pool's feeder reads them; each read one is running."""
        chunks, cond = self._chunks, self._cond
        for index in range(len(chunks)):
            with cond:
                if self._stopped:
                    return
                self._fed += 1
                chunk, chunks[index] = chunks[index], None  # the pool holds it now
            yield index, chunk
        with cond:
            self._stopped = True
            self._check_finished()

    def _collect(self, results: Any) -> None:
        """(its own thread) The pool's results, in order, as outcomes: those that are in
        are recorded together, so the caller's thread and this one rarely meet."""
        failed: BaseException = WorkerLostError("the pool gave no result for this task")
        arrived: list = []  # (index, ok, value) not recorded yet
        while True:
            try:
                arrived.append(results.next(timeout=0 if arrived else None))
                continue
            except PoolTimeout:  # nothing more for now
                pass
            except StopIteration:
                self._record(arrived, failed)
                return
            except (WorkerLostError, MaybeEncodingError) as exc:
                self._record(arrived, failed)
                failed = exc
                continue
            except BaseException as exc:  # the pool broke or was terminated
                self._fail_all(self._translate(exc))
                return
            self._record(arrived, failed)

    def _record(self, arrived: list, failed: BaseException) -> None:
        """Record the outcomes that arrived; the chunks skipped before one failed with
        ``failed`` (the pool's error that came in their place)."""
        if not arrived:
            return
        with self._cond:
            expected = self._expected
            for index, ok, value in arrived:
                for lost in range(expected, index):
                    self._settle(lost, (False, failed))
                self._settle(index, (True, value) if ok else (False, value))
                expected = index + 1
            self._expected = expected
            self._cond.notify_all()
            self._check_finished()
        arrived.clear()

    def _settle(self, index: int, outcome: tuple) -> None:
        """(condition held) The outcome of a chunk that ran."""
        self._outcomes[index] = outcome
        self._settled += 1

    def _fail_all(self, error: BaseException) -> None:
        """Every chunk without an outcome fails with ``error`` (the pool broke)."""
        with self._cond:
            self._stopped = True
            self._outcomes[:] = [(False, error) if outcome is _MISSING else outcome
                                 for outcome in self._outcomes]
            self._fed = self._settled = len(self._outcomes)
            self._cond.notify_all()
            self._check_finished()

    def _check_finished(self) -> None:
        """(condition held) Tell the executor once nothing runs and nothing will."""
        if self._stopped and self._settled == self._fed and self._finished is not None:
            finished, self._finished = self._finished, None
            finished(self)

    # -- the caller's side -------------------------------------------------------------------
    def cancel(self) -> bool:
        """Stop reading chunks: those not read yet will not run."""
        with self._cond:
            self._stopped = True
            self._cond.notify_all()
            self._check_finished()
        return True

    def _take(self, index: int, deadline: float | None) -> list:
        """The outcomes from ``index`` on that are in (at least one: wait for it)."""
        with self._cond:
            outcomes = self._outcomes
            while outcomes[index] is _MISSING:
                if self._stopped and index >= self._fed:
                    raise concurrent.futures.CancelledError()
                remaining = None if deadline is None else deadline - time.monotonic()
                if remaining is not None and remaining <= 0:
                    raise TimeoutError()
                self._cond.wait(remaining)
            end = index + 1
            while end < len(outcomes) and outcomes[end] is not _MISSING:
                end += 1
            taken = outcomes[index:end]
            outcomes[index:end] = [None] * (end - index)  # handed out: not kept
            return taken

    def results(self, timeout: float | None) -> Iterator:
        """The values in order (the standard library's map iterator): at a timeout or
        when the iterator is closed, the chunks that did not start are cancelled."""
        deadline = None if timeout is None else time.monotonic() + timeout
        index, count = 0, len(self._outcomes)
        try:
            while index < count:
                taken = self._take(index, deadline)
                index += len(taken)
                for ok, value in taken:
                    if not ok:
                        raise value.rebuild() if isinstance(value, Failure) else value
                    yield from value
                del taken
        finally:
            self.cancel()
