"""The worker side of a Pool: runs in every worker job and pulls chunks from the master.

The main thread runs chunks and does all the talking: it asks for more work *before*
its local queue runs dry (when tasks are short), so the next batch travels while the
current one runs. A watchdog thread gives back chunks that wait behind a task that
runs unexpectedly long, so that idle workers can take them. See :mod:`fiberlite.pool`;
what travels is in the format of :mod:`..chunks`.
"""
from __future__ import annotations

import builtins
import collections
import functools
import itertools
import sys
import threading
import time
import traceback
import types
from typing import Any

from ...errors import ConnectionLost
from ...wire.codec import dumps_bytes, short_repr
from ..chunks import MAX_BATCH, MESSAGE_BYTES, encoding_error, pack, pack_failure, unpack

BATCH_SECONDS = 0.08  # ask for about this much work at a time (docs/performance.md, "Thousands of workers")
PREFETCH_LIMIT = 0.02  # tasks shorter than this: keep the next batch in flight
PREFETCH_BELOW = BATCH_SECONDS / 2  # ... asked for once the queue holds less work than this
GIVEBACK_AFTER = 0.1  # a task running longer than this gives back the chunks queued behind it
WATCH_PERIOD = 0.5  # while tasks keep finishing, the watchdog looks at most this often
RESULT_DELAY = BATCH_SECONDS / 2  # results wait at most about this long to share a message
LOADED_FUNCTIONS = 64  # unpickled functions kept for reuse by later calls


# -- functions that travelled by value ------------------------------------------------------------
_namespaces: dict[str, dict] = {}


def _namespace(module: str) -> dict:
    if module == "__main__":
        return sys.modules["__main__"].__dict__
    namespace = _namespaces.get(module)
    if namespace is None:
        namespace = _namespaces[module] = {"__name__": module, "__builtins__": builtins}
    return namespace


def adopt(obj: Any, memo: dict | None = None) -> Any:
    """Give a function that travelled by value the worker's one namespace of its module.

    cloudpickle gives every function it unpickles by value (those of ``__main__``) a
    private globals dict per pickle, so a global set by the initializer would be
    invisible to the tasks, which arrive in other pickles. Re-homed here, they share
    one namespace, as functions of an imported module do: names it already has keep
    their value (a global the initializer set is not reset by a later task's copy).
    """
    memo = {} if memo is None else memo
    if isinstance(obj, types.FunctionType):
        return _adopt_function(obj, memo)
    if isinstance(obj, functools.partial):
        return functools.partial(adopt(obj.func, memo), *obj.args, **obj.keywords)
    if isinstance(obj, types.MethodType):
        return types.MethodType(adopt(obj.__func__, memo), obj.__self__)
    return obj


def _adopt_function(func: types.FunctionType, memo: dict) -> types.FunctionType:
    module = func.__module__ or "__main__"
    imported = sys.modules.get(module)
    private = func.__globals__
    if imported is not None and private is imported.__dict__:
        return func  # imported by reference: already shared
    namespace = _namespace(module)
    if private is namespace:
        return func
    if id(func) in memo:
        return memo[id(func)]
    new = types.FunctionType(func.__code__, namespace, func.__name__, func.__defaults__,
                             func.__closure__)
    memo[id(func)] = new
    new.__kwdefaults__ = func.__kwdefaults__
    new.__qualname__ = func.__qualname__
    new.__module__ = func.__module__
    new.__doc__ = func.__doc__
    new.__annotations__ = func.__annotations__
    new.__dict__.update(func.__dict__)
    for name, value in private.items():
        if name in namespace or name == "__builtins__":
            continue
        if isinstance(value, types.FunctionType) and value.__globals__ is private:
            value = _adopt_function(value, memo)  # a helper from the same pickle
        namespace[name] = value
    return new


# -- the worker ---------------------------------------------------------------------------------
def worker_main(upstream: Any, wid: int, initializer: Any, initargs: tuple,
                maxtasks: int | None) -> None:
    """What every pool worker runs, whether a job of its own or forked in a host;
    ``upstream`` reaches the master (:mod:`fiberlite.pool.job.upstream`)."""
    if initializer is not None:
        try:
            adopt(initializer)(*initargs)
        except BaseException:
            try:
                upstream.call("init_failed", wid, traceback.format_exc())
            except Exception:
                pass
            raise
    try:
        _Worker(upstream, wid, maxtasks).run()
    except ConnectionLost:
        raise SystemExit(1) from None  # the master or the host is gone: nobody to report to


class _Worker:
    def __init__(self, upstream: Any, wid: int, maxtasks: int | None) -> None:
        self.up = upstream
        self.wid = wid
        self.budget = maxtasks  # chunks it may still receive (None: no limit)
        self.functions: dict[int, tuple] = {}  # call id -> (kind, function)
        self.loaded: dict[bytes, tuple] = {}  # pickled function -> (kind, function)
        self.queue: collections.deque = collections.deque()
        self.outstanding: Any = None  # the request for work in flight
        self.more = False  # the master said more work is to come: worth asking ahead
        self.exiting = False
        self.entries: list = []  # (cid, None | pickled failure) not yet sent
        self.values: list = []  # results of the entries whose failure is None
        self.oldest = 0.0  # when the oldest unsent result was made
        self.ema: float | None = None  # seconds per chunk, smoothed
        self.ema_gid = 0  # the call whose chunks it was measured on
        self.result_size = 0.0  # pickled bytes of a chunk's result, smoothed
        self.lock = threading.Lock()  # queue and outstanding, shared with the watchdog
        self.current: tuple | None = None  # (chunk, start time) of the running chunk
        self.watch_idle = False  # the watchdog sleeps until woken (no chunk started for a while)
        self.started = 0  # chunks started so far: the watchdog's sign that tasks keep coming
        self.wake = threading.Event()
        self.halt = threading.Event()
        threading.Thread(target=self._watch, name="fiberlite-pool-watchdog", daemon=True).start()

    # -- transport: a request sent now and answered later --------------------------------
    def _begin(self, method: str, *args: Any) -> Any:
        return self.up.begin(method, *args)

    def _finish(self, handle: Any) -> Any:
        return self.up.finish(handle)

    # -- results -----------------------------------------------------------------------------
    def _take_results(self) -> tuple[list, Any]:
        entries, values = self.entries, self.values
        self.entries, self.values = [], []
        if not values:
            return entries, None
        try:
            packed = pack(values)
        except Exception:
            return self._repair(entries, values)
        size = (len(packed) if type(packed) is bytes else packed.nbytes()) / len(values)
        self.result_size = size if not self.result_size else 0.7 * self.result_size + 0.3 * size
        return entries, packed

    def _repair(self, entries: list, values: list) -> tuple[list, Any]:
        """Replace the results that cannot be pickled by errors naming them."""
        fixed, kept = [], []
        it = iter(values)
        for cid, failure in entries:
            if failure is None:
                value = next(it)
                try:
                    dumps_bytes(value)
                except Exception as exc:
                    error = encoding_error(repr(exc), short_repr(value))
                    failure = pack_failure(error, "Traceback: the result could not be pickled\n")
                else:
                    kept.append(value)
            fixed.append((cid, failure))
        return fixed, (pack(kept) if kept else None)

    def _ask(self, want: int, prefetch: bool = False) -> None:
        """Send our results and ask for ``want`` chunks: a prefetch (we still have work) is
        answered at once, empty if there is none; otherwise the master holds the request
        until there is work."""
        entries, values = self._take_results()
        self.outstanding = self._begin("next", self.wid, entries, values, want, prefetch)

    def _flush(self) -> None:
        if self.entries:
            entries, values = self._take_results()
            self.up.cast("done", self.wid, entries, values)

    def _hand_in(self) -> None:
        """(exiting) Send the results not sent yet and wait until the master has taken
        them, and those sent one-way before. The master may hear of this worker's end
        another way (its host, its job's exit) and would take back, to run again, the
        chunks whose results had not reached it yet."""
        entries, values = self._take_results()
        try:
            self.up.call("done", self.wid, entries, values)
        except ConnectionLost:
            pass  # (the master is gone: nothing to hand in to)

    def _want(self) -> int:
        ema = self.ema
        if ema is None or ema >= PREFETCH_LIMIT:
            want = 1
        else:
            want = int(BATCH_SECONDS / max(ema, 1e-7)) + 1
        want = min(want, MAX_BATCH)
        if self.result_size:
            want = max(1, min(want, int(MESSAGE_BYTES / self.result_size)))
        if self.budget is not None:
            want = min(want, self.budget)
        return want

    def _absorb(self, reply: Any) -> None:
        """Take a reply to a request for work (by the main thread with the lock held, or by
        the watchdog for chunks it gives back)."""
        if reply is None:
            self.exiting = True
            return
        chunks, functions, forget, self.more = reply
        for gid in forget:
            self.functions.pop(gid, None)
        for gid, payload in functions.items():
            self.functions[gid] = self._load(payload)
        self.queue.extend(chunks)
        if self.budget is not None:
            self.budget -= len(chunks)

    def _load(self, payload: Any) -> tuple:
        """``(kind, function)`` of a call; the same pickle twice gives the same function."""
        key = payload.data if type(payload.data) is bytes and not payload.buffers else None
        loaded = self.loaded.get(key) if key is not None else None
        if loaded is None:
            try:
                kind, func = payload.unpack()
                loaded = (kind, adopt(func))
            except Exception as exc:
                return ("error", RuntimeError(
                    f"the function could not be loaded in this worker: {exc!r}\n"
                    f"{traceback.format_exc()}"))
            if key is not None:
                if len(self.loaded) >= LOADED_FUNCTIONS:
                    del self.loaded[next(iter(self.loaded))]
                self.loaded[key] = loaded
        return loaded

    # -- the main loop ------------------------------------------------------------------------
    def run(self) -> None:
        try:
            while True:
                chunk = self._next()
                if chunk is None:
                    break
                self._run(chunk)
        finally:
            self.halt.set()
            self.wake.set()

    def _next(self) -> tuple | None:
        lock = self.lock
        lock.acquire()
        try:
            queue = self.queue
            while not queue:
                if self.exiting:
                    self._hand_in()
                    return None
                if self.outstanding is None:
                    self._ask(self._want())  # with our results; want 0: out of budget, retire
                elif self.entries and self.up.direct:  # idle until the prefetch's answer:
                    self._flush()  # results go first, where a message more is cheap
                ctx, self.outstanding = self.outstanding, None
                self._absorb(self._finish(ctx))  # a prefetch's answer is prompt (maybe empty)
            chunk = queue.popleft()
            if self._may_prefetch() and len(queue) * self.ema < PREFETCH_BELOW:
                self._ask(self._want(), prefetch=True)  # the next batch travels while these run
            self.current = (chunk, time.monotonic())
            self.started += 1
            if self.watch_idle and (queue or self.outstanding is not None):
                self.wake.set()
            return chunk
        finally:
            lock.release()

    def _run(self, chunk: tuple) -> None:
        cid, gid, data = chunk
        started = time.perf_counter()
        try:
            kind, func = self.functions[gid]
            if kind == "map":
                value = list(map(func, unpack(data)))
            elif kind == "star":
                value = list(itertools.starmap(func, unpack(data)))
            elif kind == "apply":
                args, kwds = unpack(data)
                value = func(*args, **kwds)
            else:  # the function could not be unpickled here
                raise func
        except Exception as exc:
            failure = pack_failure(exc, traceback.format_exc())
            del exc
            with self.lock:  # (the watchdog may take the results of a long chunk's wait)
                self.entries.append((cid, failure))
                self.current = None
        else:
            with self.lock:
                self.entries.append((cid, None))
                self.values.append(value)
                self.current = None
            del value
        now = time.perf_counter()
        elapsed = now - started
        ema = self.ema  # a new call's first chunk starts the estimate afresh: its tasks
        fresh = ema is None or gid != self.ema_gid  # may take nothing like the last call's
        self.ema = elapsed if fresh else 0.7 * ema + 0.3 * elapsed
        self.ema_gid = gid
        if len(self.entries) == 1:
            self.oldest = now
        elif now - self.oldest > RESULT_DELAY:
            self._send_results()

    def _may_prefetch(self) -> bool:
        """Whether a request for more work may go before the queue runs dry (lock held)."""
        ema = self.ema
        return (self.outstanding is None and self.more and ema is not None and ema < PREFETCH_LIMIT
                and not self.exiting and (self.budget is None or self.budget > 0))

    def _send_results(self) -> None:
        """Results that waited long enough: with a request for the next batch when one
        may go (one message instead of two), else on their own."""
        with self.lock:
            if self._may_prefetch():
                self._ask(self._want(), prefetch=True)
                return
        self._flush()

    # -- the watchdog -------------------------------------------------------------------------
    def _exposed(self) -> bool:
        """Whether the running chunk keeps anything waiting behind it: chunks queued, a
        request for more, or results of chunks done."""
        return self.current is not None and (
            bool(self.queue) or self.outstanding is not None or bool(self.entries))

    def _watch(self) -> None:
        """Give back queued chunks, and send the results that wait, when the running one
        overruns ``GIVEBACK_AFTER``.

        A chunk seen running at one look is watched until its deadline; one not seen
        before waits for the next look, ``WATCH_PERIOD`` later. While chunks keep
        starting, a look that finds nothing exposed is followed by the next one a period
        later; only after a period in which none started does the watchdog sleep until
        the main thread wakes it. So a long task gives back what waits behind it 0.1-0.6 s
        after it started, and a worker whose tasks are short wakes its watchdog twice a
        second, not at every task."""
        watched = None
        seen = -1  # self.started at the last look
        while not self.halt.is_set():
            if not self._exposed():
                if self.started != seen:
                    seen = self.started
                    self.halt.wait(WATCH_PERIOD)
                    continue
                self.watch_idle = True
                if not self._exposed():
                    self.wake.wait()
                    self.wake.clear()
                self.watch_idle = False
            seen = self.started
            current = self.current
            if current is None or not self._exposed():
                continue
            delay = current[1] + GIVEBACK_AFTER - time.monotonic()
            if delay > 0:
                self.halt.wait(delay if current is watched else max(delay, WATCH_PERIOD))
                watched = current
                continue
            if self.current is current:
                try:
                    self._give_back(current)
                except Exception:
                    return  # the connection is gone; the job is about to exit

    def _give_back(self, current: tuple) -> None:
        """Send the results that wait, hand back the queued chunks, and those our prefetch
        brings (its answer is prompt). The lock is not held while waiting: the main
        thread may need it."""
        with self.lock:
            if self.current is not current:
                return
            results = self._take_results() if self.entries else None
            cids = [chunk[0] for chunk in self.queue]
            self.queue.clear()
            if self.budget is not None:
                self.budget += len(cids)
            ctx, self.outstanding = self.outstanding, None
        if results is not None:  # (the master may be waiting for them to go on)
            self.up.cast("done", self.wid, *results)
        if cids:
            self._finish(self._begin("giveback", self.wid, cids))
        if ctx is None:
            return
        reply = self._finish(ctx)
        if reply is None:
            self.exiting = True
            return
        chunks, functions, forget, more = reply
        self._absorb(([], functions, forget, more))  # atomic updates; known before chunks return
        if chunks:
            self._finish(self._begin("giveback", self.wid, [chunk[0] for chunk in chunks]))
