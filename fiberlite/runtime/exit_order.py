"""The order in which a process leaves, owned here and nowhere else.

Each layer registers what it must do at exit under one of :data:`STAGES`; one
``atexit`` hook (and a job's bootstrap, which leaves by ``os._exit``) runs the stages
in that order, each once:

1. ``pools``: pools still running are terminated (their workers stopped);
2. ``managers``: managers still running are shut down;
3. ``children``: daemonic children terminated, the others joined (as ``multiprocessing``);
4. ``watchers``: the threads watching the ended jobs finish their clean-up;
5. ``links``: what links received and nobody read goes back to its pipe or queue;
6. ``backends``: backends closed (watches stopped, the run's Secrets removed), and the
   names of the portable path's semaphores removed;
7. ``sockets``: this process's connections and hub closed.

The hook runs while the interpreter finalizes: finalizers (``__del__``) leave the work
to it, and a stage starts no thread of its own (Python 3.12.0 and 3.12.1 refuse one
then); work that reacts to the network meanwhile goes through
:mod:`fiberlite.wire.threads`, which has a thread ready for it there.
"""
from __future__ import annotations

import atexit
import sys
import threading
from typing import Callable

STAGES = ("pools", "managers", "children", "watchers", "links", "backends", "sockets")

_steps: dict[str, list[Callable[[], None]]] = {stage: [] for stage in STAGES}
_done: set[str] = set()
_lock = threading.RLock()


def at_exit(stage: str, step: Callable[[], None]) -> Callable[[], None]:
    """Run ``step()`` when this process leaves, in ``stage`` (one of :data:`STAGES`)."""
    if stage not in _steps:
        raise ValueError(f"unknown exit stage {stage!r}; one of {', '.join(STAGES)}")
    with _lock:
        _steps[stage].append(step)
    return step


def leave(through: str = STAGES[-1]) -> None:
    """Run the stages not run yet, in order, up to and including ``through``."""
    with _lock:
        for stage in STAGES[:STAGES.index(through) + 1]:
            if stage in _done:
                continue
            _done.add(stage)
            for step in list(_steps[stage]):
                try:
                    step()
                except Exception as exc:  # one failing step must not keep the others from running
                    sys.stderr.write(f"fiberlite: at exit ({stage}): {exc!r}\n")


atexit.register(leave)
