"""What ``Pool`` hands back: ``AsyncResult``, ``MapResult`` and the ``imap`` iterators.

A result object is a *sink*: the pool's result thread calls ``_set(start, count, ok,
value)`` once per finished chunk (``start``/``count`` locate the chunk's items in the
call's input; ``value`` is the chunk's list of results, the single result of an
``apply``, or an exception). Results are placed by position, so a chunk that ran twice
after a worker died, or out of order, still lands exactly once and in order.
"""
from __future__ import annotations

import collections
import itertools
import sys
import threading
import traceback
from multiprocessing.pool import MaybeEncodingError
from typing import Any, Callable, Iterator

from ...errors import BrokenPoolError, TimeoutError, WorkerLostError  # re-exported

__all__ = ["AsyncResult", "ApplyResult", "MapResult", "IMapIterator", "IMapUnorderedIterator",
           "WorkerLostError", "BrokenPoolError", "MaybeEncodingError"]


class _Sink:
    """Shared plumbing of result objects: completion event, callbacks, the pool's cache
    (``Pool._cache``: the results still waiting for some of theirs, by job number)."""

    def __init__(self, core: Any, callback: Callable | None, error_callback: Callable | None) -> None:
        self._core = core
        self._event = threading.Event()
        self._lock = threading.Lock()
        self._callback = callback
        self._error_callback = error_callback
        self._job = core.register_result(self)

    def _finish(self) -> None:
        """Mark ready (called once, without the lock held) and run the callbacks."""
        core, self._core = self._core, None
        try:
            if self._success:
                if self._callback is not None:
                    self._callback(self._value)
            elif self._error_callback is not None:
                self._error_callback(self._value)
        except Exception:
            sys.stderr.write("fiberlite: exception in a Pool result callback:\n")
            traceback.print_exc()
        finally:
            if core is not None:  # out of the pool's cache before anyone sees it ready
                core.forget_result(self._job)
            self._event.set()

    def _abort(self, error: BaseException) -> None:
        """Fail whatever is still missing (the pool was terminated or broke)."""
        raise NotImplementedError

    def _progress(self) -> int:
        """The tasks whose results (values or errors) are in, so far."""
        raise NotImplementedError

    def _total(self) -> int | None:
        """The tasks of the call, None while not known."""
        return 1

    def progress(self) -> tuple[int, int | None]:
        """``(done, total)``: the tasks whose results (values or errors) are in so far,
        and the call's tasks (None while not known: an ``imap`` whose input has not
        ended and did not tell its length), for the run's page."""
        return self._progress(), self._total()


class ApplyResult(_Sink):
    """The result of ``apply_async``: ``get``, ``wait``, ``ready``, ``successful``."""

    def __init__(self, core: Any, callback: Callable | None = None,
                 error_callback: Callable | None = None) -> None:
        self._success = True
        self._value: Any = None
        self._abandoned = False  # failed because the pool was terminated or broke
        super().__init__(core, callback, error_callback)

    def ready(self) -> bool:
        """Whether the call has completed."""
        return self._event.is_set()

    def successful(self) -> bool:
        """Whether the call completed without raising (``ValueError`` if not ready)."""
        if not self.ready():
            raise ValueError(f"{self!r} not ready")
        return self._success

    def wait(self, timeout: float | None = None) -> None:
        """Wait until the result is available or ``timeout`` seconds pass."""
        self._event.wait(timeout)

    def get(self, timeout: float | None = None) -> Any:
        """The result; raises the task's exception, or ``TimeoutError`` after ``timeout``."""
        self.wait(timeout)
        if not self.ready():
            raise TimeoutError
        if self._success:
            return self._value
        raise self._value

    def _set(self, start: int, count: int, ok: bool, value: Any, abandoned: bool = False) -> None:
        with self._lock:
            if self._event.is_set() or self._core is None:
                return
            self._success, self._value = ok, value
            self._abandoned = abandoned
        self._finish()

    def _abort(self, error: BaseException) -> None:
        self._set(0, 1, False, error, abandoned=True)

    def _progress(self) -> int:
        return 1 if self._event.is_set() and not self._abandoned else 0

    def __class_getitem__(cls, item):  # AsyncResult[int] in annotations, as in the stdlib
        return cls


AsyncResult = ApplyResult


class MapResult(ApplyResult):
    """The result of ``map_async``/``starmap_async``: a list, ready once every chunk is in."""

    def __init__(self, core: Any, length: int, callback: Callable | None = None,
                 error_callback: Callable | None = None) -> None:
        super().__init__(core, callback, error_callback)
        self._value = [None] * length
        self._size = length
        self._left = length
        self._given_up = 0  # tasks never done: the pool was terminated or broke
        if length == 0:
            self._finish()

    def _set(self, start: int, count: int, ok: bool, value: Any) -> None:
        with self._lock:
            if self._left <= 0 or self._core is None:
                return
            if ok and self._success:
                self._value[start:start + count] = value
            elif not ok and self._success:  # keep the first error; wait for every chunk
                self._success, self._value = False, value
            self._left -= count
            done = self._left <= 0
        if done:
            self._finish()

    def _abort(self, error: BaseException) -> None:
        with self._lock:
            if self._left <= 0 or self._core is None:
                return
            self._given_up, self._left = self._left, 0
            if self._success:
                self._success, self._value = False, error
        self._finish()

    def _progress(self) -> int:
        return self._size - self._left - self._given_up

    def _total(self) -> int | None:
        return self._size


class IMapIterator(_Sink):
    """The iterator of ``imap``: results in input order, as soon as each is ready.

    The pool reads the input only as far as ``window`` items ahead of what has been
    consumed, so memory stays bounded and an endless input works.
    """

    def __init__(self, core: Any, window: int, expected: int | None = None) -> None:
        #: the input's length as known before it is read (``operator.length_hint``), or
        #: None; what shows progress uses it until the input ends
        self.expected = expected
        self._success = True
        self._value = None
        super().__init__(core, None, None)
        self._cond = threading.Condition(self._lock)
        self._length: int | None = None  # known once the input is exhausted
        self._window = window
        self._taken = 0  # input items read so far (``_index``: items handed out or skipped)
        self._waiting = False  # the feeder waits for room
        self._received = 0  # results in (values or errors), handed out or not
        self._init_store()

    # -- store, in order ------------------------------------------------------------------
    # A chunk counts as handed out (``_index``) when its first value is; the rest of its
    # values are then in ``_current``, which only the consumer reads, without the lock.
    def _init_store(self) -> None:
        self._chunks: dict[int, tuple[int, bool, Any]] = {}
        self._index = 0  # position after the last chunk handed out (or skipped)
        self._current: Iterator | None = None  # the other values of the chunk handed out

    def _put(self, start: int, count: int, ok: bool, value: Any) -> None:
        self._chunks[start] = (count, ok, value)

    def _next_chunk(self) -> tuple[int, bool, Any] | None:
        return self._chunks.pop(self._index, None)

    def _pop(self) -> tuple[bool, Any] | None:
        """(lock held) The next (ok, value) to hand out, or None if it is not here yet."""
        current = self._current
        if current is not None:
            for value in current:
                return True, value
            self._current = None
        entry = self._next_chunk()
        if entry is None:
            return None
        count, ok, value = entry
        self._index += count
        if not ok:
            return False, value
        rest = iter(value)
        first = next(rest)
        self._current = rest
        return True, first

    # -- the sink side ----------------------------------------------------------------------
    def _set(self, start: int, count: int, ok: bool, value: Any) -> None:
        with self._cond:
            if self._core is None:
                return
            self._put(start, count, ok, value)
            self._received += count
            self._cond.notify_all()
            complete = self._length is not None and self._received >= self._length
        if complete:
            self._uncache()

    def _set_length(self, length: int) -> None:
        with self._cond:
            self._length = length
            self._cond.notify_all()
            done = self._index >= length
            complete = self._received >= length
        if done:
            self._close()
        elif complete:
            self._uncache()

    def _abort(self, error: BaseException) -> None:
        with self._cond:
            if self._core is None:
                return
            self._success, self._value = False, error
            self._cond.notify_all()
        self._close()

    def _progress(self) -> int:
        return self._received

    def _total(self) -> int | None:
        return self._length if self._length is not None else self.expected

    def _close(self) -> None:
        self._uncache()
        self._core = None
        self._event.set()

    def _uncache(self) -> None:
        """Every result is in: out of the pool's cache (they may not all be consumed)."""
        core = self._core
        if core is not None:
            core.forget_result(self._job)

    def _reserve(self, chunksize: int, core: Any) -> int:
        """Called by the feeder: wait for room, then claim it; how many chunks it may read.

        The feeder refills the window once half of it is free, so that chunks are
        submitted (and sent to the workers) in batches. Once the pool is closed the
        window no longer applies (``close(); join()`` then reading the results must
        work, as in multiprocessing). 0 means stop.
        """
        with self._cond:
            window = max(self._window, chunksize)
            while True:
                if core.state == "TERMINATE" or self._core is None:
                    return 0
                room = window - (self._taken - self._index)
                if core.state != "RUN":
                    room = max(room, window)
                if room >= max(chunksize, window // 2) or (room >= chunksize and
                                                            self._taken == self._index):
                    break
                self._waiting = True
                self._cond.wait()
            chunks = max(1, room // chunksize)
            self._taken += chunks * chunksize
            return chunks

    def _wake(self) -> None:
        with self._cond:
            self._cond.notify_all()

    # -- the caller side ---------------------------------------------------------------------
    def __iter__(self) -> Iterator:
        """The results from here on; the values of a chunk come without a call each."""
        return itertools.chain.from_iterable(self._runs())

    def _runs(self) -> Iterator:
        """The results from here on, as runs: the rest of a chunk, or one value."""
        while True:
            current = self._current
            if current is not None:
                yield current
            try:
                value = self.next()
            except StopIteration:
                return
            yield (value,)

    def next(self, timeout: float | None = None) -> Any:
        """The next result; ``TimeoutError`` if none arrives within ``timeout`` seconds."""
        current = self._current
        if current is not None:  # the rest of a chunk: no lock (only consumers touch it)
            for value in current:
                return value
        with self._cond:
            while True:
                entry = self._pop()
                if entry is not None:
                    break
                if self._length is not None and self._index >= self._length:
                    break  # the end
                if not self._success:  # terminated or broken
                    raise self._value
                if not self._cond.wait(timeout):
                    raise TimeoutError from None
            if self._waiting and self._taken - self._index <= self._window // 2:
                self._waiting = False
                self._cond.notify_all()  # room for the feeder
            done = self._length is not None and self._index >= self._length
        if done:
            self._close()  # (out of the pool's cache before the caller sees the end)
        if entry is None:
            raise StopIteration
        ok, value = entry
        if ok:
            return value
        raise value

    __next__ = next


class IMapUnorderedIterator(IMapIterator):
    """The iterator of ``imap_unordered``: results in the order they finish."""

    def _init_store(self) -> None:
        self._done: collections.deque = collections.deque()
        self._index = 0  # items of the chunks handed out (or skipped by a failed chunk)
        self._current = None

    def _put(self, start: int, count: int, ok: bool, value: Any) -> None:
        self._done.append((count, ok, value))

    def _next_chunk(self) -> tuple[int, bool, Any] | None:
        return self._done.popleft() if self._done else None
