"""The ``multiprocessing`` API backed by threads of this process
(``multiprocessing.dummy``): no jobs, no backend, nothing pickled.

It is the standard library's module, re-exported, so that ``import fiberlite.dummy``
works where scripts import ``multiprocessing.dummy``.
"""
from multiprocessing.dummy import *  # noqa: F401,F403
from multiprocessing.dummy import __all__, connection  # noqa: F401
