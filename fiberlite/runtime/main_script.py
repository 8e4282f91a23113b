"""Running the main script again in a job, as the standard library's spawn does.

Needed only for a global of the main script that could not be pickled (see
:mod:`fiberlite.wire.main_globals`): the job runs the script once, as ``__mp_main__``, so
that ``if __name__ == "__main__":`` keeps its main part out, and takes the global from
there. While it runs, starting a process is an error (:func:`check_not_running`), as in
the standard library: a script that starts processes outside that guard would otherwise
start them again in every job.
"""
from __future__ import annotations

import runpy
import sys
import threading
import types

__all__ = ["load", "check_not_running"]

MODULE = "__mp_main__"
_lock = threading.RLock()
_running = threading.local()


def load(path: str, module_name: str | None = None) -> types.ModuleType:
    """The main script at ``path``, run here once as ``__mp_main__``; by its module's
    name, when the parent ran it as a module (``python -m package.module``: its relative
    imports need its package), as the standard library's spawn does."""
    with _lock:
        module = sys.modules.get(MODULE)
        if module is not None and getattr(module, "__file__", None) == path:
            return module
        module = types.ModuleType(MODULE)
        module.__file__ = path
        sys.modules[MODULE] = module  # as an import does: the script may import itself
        _running.now = True
        try:
            if module_name and module_name != "__main__" and not module_name.endswith(".__main__"):
                module.__dict__.update(runpy.run_module(module_name, run_name=MODULE))
            else:
                module.__dict__.update(runpy.run_path(path, run_name=MODULE))
        except BaseException:
            del sys.modules[MODULE]
            raise
        finally:
            _running.now = False
        return module


def check_not_running() -> None:
    """Raise the standard library's error if the main script is being run again here."""
    if getattr(_running, "now", False):
        raise RuntimeError(
            "An attempt has been made to start a new process before the current process has "
            "finished its bootstrapping phase: the main script, run again in a job to make a "
            "global it needs, starts processes outside `if __name__ == '__main__':`. Guard "
            "the part of the script that starts processes with it.")
