"""joblib on fiberlite: ``fiberlite.joblib.register()``, then
``joblib.parallel_config(backend="fiberlite", n_jobs=N)`` runs ``joblib.Parallel`` (and
scikit-learn's ``n_jobs``) on fiberlite workers.

The backend submits joblib's batches of calls to a :class:`fiberlite.futures.ProcessPoolExecutor`
that is kept for the next ``Parallel`` call with the same number of workers and context
(as joblib's default, loky, keeps its executor), so that a loop of ``Parallel`` calls
starts its workers once. Arguments travel by value, as fiberlite pickles them: joblib's
memory-mapping of large numpy arrays (a file on this machine) is not used, since
workers may run on other machines. Workers limit the threads of OpenMP and BLAS
libraries to their share of the CPUs, as joblib's process backends do.

This module's ``import joblib`` is absolute: it is the joblib package, not this module.
"""
from __future__ import annotations

import os
import threading
from typing import Any, Callable

try:
    import joblib
    from joblib._parallel_backends import (AutoBatchingMixin, FallbackToBackend,
                                           ParallelBackendBase, SequentialBackend)
except ImportError as missing:
    raise ImportError(f"fiberlite.joblib needs joblib ({missing}): pip install joblib") from None

from .context import BaseContext, default_context
from .futures import ProcessPoolExecutor

__all__ = ["register", "FiberliteBackend", "shutdown"]

NAME = "fiberlite"

_kept: dict[tuple, ProcessPoolExecutor] = {}  # (n_jobs, backend, thread limits) -> executor
_kept_lock = threading.Lock()


def _limit_threads(env: dict[str, str]) -> None:
    """In a worker: thread-pool sizes of native libraries, before and after they load."""
    os.environ.update(env)
    try:
        from threadpoolctl import threadpool_limits
    except ImportError:
        return
    threadpool_limits(int(env["OMP_NUM_THREADS"]))


def _executor(n_jobs: int, context: BaseContext, env: dict[str, str]) -> ProcessPoolExecutor:
    """The kept executor for these workers; one of other workers is shut down first."""
    key = (n_jobs, context.backend, tuple(sorted(env.items())))
    with _kept_lock:
        executor = _kept.get(key)
        if executor is None:
            for other in _kept.values():
                other.shutdown(wait=False)
            _kept.clear()
            executor = _kept[key] = ProcessPoolExecutor(n_jobs, mp_context=context,
                                                        initializer=_limit_threads,
                                                        initargs=(env,))
        return executor


def shutdown() -> None:
    """Let the kept workers go (they are also ended when this process exits)."""
    with _kept_lock:
        for executor in _kept.values():
            executor.shutdown(wait=True)
        _kept.clear()


def _drop(executor: ProcessPoolExecutor) -> None:
    with _kept_lock:
        for key, kept in list(_kept.items()):
            if kept is executor:
                del _kept[key]


class FiberliteBackend(AutoBatchingMixin, ParallelBackendBase):
    """joblib's backend of fiberlite workers: ``mp_context`` (a fiberlite context or a
    backend name, given to ``register`` or ``parallel_config``) picks their backend."""

    supports_retrieve_callback = True  # return_as="generator", timeout
    supports_inner_max_num_threads = True

    def __init__(self, nesting_level: int | None = None, inner_max_num_threads: int | None = None,
                 mp_context: BaseContext | str | None = None, **backend_kwargs: Any) -> None:
        super().__init__(nesting_level=nesting_level, inner_max_num_threads=inner_max_num_threads,
                         **backend_kwargs)
        if isinstance(mp_context, str):
            mp_context = default_context.get_context(mp_context)
        self.mp_context = mp_context or default_context
        self._workers: ProcessPoolExecutor | None = None

    def effective_n_jobs(self, n_jobs: int | None) -> int:
        if n_jobs == 0:
            raise ValueError("n_jobs == 0 in Parallel has no meaning")
        if n_jobs is None:
            return 1
        if n_jobs < 0:
            return max((os.cpu_count() or 1) + 1 + n_jobs, 1)
        return n_jobs

    def configure(self, n_jobs: int = 1, parallel: Any = None, **backend_kwargs: Any) -> int:
        n_jobs = self.effective_n_jobs(n_jobs)
        if n_jobs == 1:
            raise FallbackToBackend(SequentialBackend(nesting_level=self.nesting_level))
        self.parallel = parallel
        self._workers = _executor(n_jobs, self.mp_context, self._prepare_worker_env(n_jobs))
        return n_jobs

    def submit(self, func: Callable, callback: Callable | None = None) -> Any:
        future = self._workers.submit(func)
        if callback is not None:
            future.add_done_callback(callback)
        return future

    def retrieve_result_callback(self, future: Any) -> Any:
        return future.result()

    def terminate(self) -> None:
        self._workers = None  # kept for the next call
        self.reset_batch_stats()

    def abort_everything(self, ensure_ready: bool = True) -> None:
        """A call failed: its other tasks are stopped with the workers that run them."""
        workers, self._workers = self._workers, None
        if workers is not None:
            _drop(workers)
            workers.terminate_workers()
        if ensure_ready:
            self.configure(n_jobs=self.parallel.n_jobs, parallel=self.parallel)


def register(name: str = NAME, mp_context: BaseContext | str | None = None) -> None:
    """Make ``name`` a joblib backend of fiberlite workers on ``mp_context``'s backend
    (default: the configured one)."""
    def factory(**kwargs: Any) -> FiberliteBackend:
        kwargs.setdefault("mp_context", mp_context)
        return FiberliteBackend(**kwargs)
    joblib.register_parallel_backend(name, factory)
