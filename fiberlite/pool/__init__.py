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

``WorkerLostError`` and ``BrokenPoolError`` are defined in :mod:`fiberlite.errors`.
"""
from ..errors import BrokenPoolError, WorkerLostError
from .pool import CLOSE, RUN, TERMINATE, MaybeEncodingError, Pool
from .results import (ApplyResult, AsyncResult, IMapIterator, IMapUnorderedIterator,
                      MapResult)

__all__ = ["Pool", "AsyncResult", "ApplyResult", "MapResult", "IMapIterator",
           "IMapUnorderedIterator", "MaybeEncodingError", "BrokenPoolError", "WorkerLostError",
           "RUN", "CLOSE", "TERMINATE"]
