"""``concurrent.futures`` on fiberlite: a ``ProcessPoolExecutor`` whose workers are jobs.

- :mod:`.executor`: :class:`ProcessPoolExecutor`, built on a context's ``Pool`` (what
  it adds: futures, the hand-over that keeps unstarted tasks cancellable, shutdown);
- :mod:`.mapping`: its ``map``, one pool ``imap`` per call whose input is read as the
  workers take it, so that what was not read yet can still be cancelled.

:class:`BrokenProcessPool` is the standard library's exception of that name; see
docs/from-other-libraries.md for when it is raised here and when a task is retried.
"""
from concurrent.futures.process import BrokenProcessPool

from .executor import ProcessPoolExecutor

__all__ = ["ProcessPoolExecutor", "BrokenProcessPool"]
