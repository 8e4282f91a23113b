"""``Pool``: ``multiprocessing.pool`` whose workers are jobs on a backend.

- :mod:`.pool`: the user's ``Pool`` (protocol in its docstring);
- :mod:`.core`: the master's machinery of one pool: workers, result thread, imap feeders;
- :mod:`.dispatch`: the master's servant: pending chunks, who holds what, retries;
- :mod:`.results`: ``AsyncResult``, ``MapResult`` and the ``imap`` iterators;
- :mod:`.chunks`: the format of calls, chunks, results and failures, shared by both sides;
- :mod:`.worker`: what runs in every worker, and :mod:`.upstream`: how it reaches the
  master, over its own connection or through its host;
- :mod:`.packing`: how many workers one job runs; :mod:`.host`: a job that runs many,
  forked from its :mod:`.template`; :mod:`.relay`: the master's end of the hosts.

``WorkerLostError``, ``BrokenPoolError`` and ``RemoteTraceback`` (the ``__cause__`` of
an exception re-raised from a task) are defined in :mod:`fiberlite.errors`.
``ThreadPool`` is the standard library's: threads of this process, no jobs.
"""
from multiprocessing.pool import ThreadPool

from ..errors import BrokenPoolError, RemoteTraceback, WorkerLostError
from .pool import CLOSE, RUN, TERMINATE, MaybeEncodingError, Pool
from .results import (ApplyResult, AsyncResult, IMapIterator, IMapUnorderedIterator,
                      MapResult)

__all__ = ["Pool", "AsyncResult", "ApplyResult", "MapResult", "IMapIterator",
           "IMapUnorderedIterator", "MaybeEncodingError", "BrokenPoolError", "WorkerLostError",
           "RUN", "CLOSE", "TERMINATE", "RemoteTraceback", "ThreadPool"]
