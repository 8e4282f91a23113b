"""``Pool``: ``multiprocessing.pool`` whose workers are jobs on a backend.

One subpackage per process a line runs in, and the format both share:

- :mod:`.master`: what runs in the process that made the pool: the user's ``Pool``
  (protocol in its docstring), the workers, the dispatcher, the result objects, the
  master's end of the pool hosts;
- :mod:`.job`: what runs in the pool's jobs: the worker, how it reaches the master,
  and the host job that runs many workers forked from its template;
- :mod:`.chunks`: the format of calls, chunks, results and failures, shared by both sides.

``WorkerLostError``, ``BrokenPoolError`` and ``RemoteTraceback`` (the ``__cause__`` of
an exception re-raised from a task) are defined in :mod:`fiberlite.errors`.
``ThreadPool`` is the standard library's: threads of this process, no jobs.
"""
from multiprocessing.pool import ThreadPool

from ..errors import BrokenPoolError, RemoteTraceback, WorkerLostError
from .master.pool import CLOSE, RUN, TERMINATE, MaybeEncodingError, Pool
from .master.results import (ApplyResult, AsyncResult, IMapIterator, IMapUnorderedIterator,
                             MapResult)

__all__ = ["Pool", "AsyncResult", "ApplyResult", "MapResult", "IMapIterator",
           "IMapUnorderedIterator", "MaybeEncodingError", "BrokenPoolError", "WorkerLostError",
           "RUN", "CLOSE", "TERMINATE", "RemoteTraceback", "ThreadPool"]
