"""Globals of the main script that cannot be pickled: made again where they are needed.

A function of ``__main__`` travels by value, with the globals it uses as they are when
it is pickled. A script may rebind one of them to something that cannot be pickled (a
manager, a lock, a socket, a database connection): under the standard library's spawn
start method that script still works, because the child runs the script again and
makes its own. So does fiberlite: when pickling fails, :func:`~fiberlite.wire.codec.dumps`
tries again with each such global replaced by a :class:`MainGlobal`, which names it.
Where it is unpickled, the global is taken from the main script run there as
``__mp_main__`` (by the loader a job installs, :func:`set_loader`; the parent's own
``__main__`` when it comes back there). Where the script cannot run, or does not define
the name, the error names the global and says why.

Only the failing globals are replaced; the others still travel by value. A script with
no file (an interactive session, ``python -c``) has nothing to run again: its
unpicklable globals fail in the parent, named (:func:`culprit`).
"""
from __future__ import annotations

import os
import sys
import types
from typing import Any, Callable, Iterator

__all__ = ["MainGlobal", "main_file", "stand_in", "culprit", "set_loader"]

_loader: Callable[[str], types.ModuleType] | None = None


def set_loader(loader: Callable[[str], types.ModuleType]) -> None:
    """How this process runs the main script at a path (a job's bootstrap sets it)."""
    global _loader
    _loader = loader


def main_file() -> str | None:
    """The main script's file, if it has one."""
    main = sys.modules.get("__main__")
    path = getattr(main, "__file__", None)
    return os.path.abspath(path) if isinstance(path, str) else None


class MainGlobal:
    """Stands for the global ``name`` of the main script at ``path``, which could not be
    pickled (``reason``); its value in the parent was a ``type_name``."""

    __slots__ = ("name", "type_name", "path", "reason")

    def __init__(self, name: str, type_name: str, path: str, reason: str) -> None:
        self.name, self.type_name, self.path, self.reason = name, type_name, path, reason

    def __reduce__(self):
        return (load_global, (self.name, self.type_name, self.path, self.reason))


def load_global(name: str, type_name: str, path: str, reason: str) -> Any:
    """The global ``name`` of the main script at ``path``, as that script makes it here."""
    what = (f"the global {name!r} of the main script ({type_name} in the parent, which cannot "
            f"be pickled: {reason})")
    main = sys.modules.get("__main__")
    if main_file() == path and hasattr(main, name):
        return getattr(main, name)  # back in the process whose script it is
    if _loader is None:
        raise RuntimeError(f"{what} is made again by running the main script in a job; this "
                           f"process is not a job")
    if not os.path.exists(path):
        raise RuntimeError(f"{what} is made again by running the main script where it is "
                           f"used, but {path} is not there (mount the working directory, or "
                           f"pass the object as an argument, or make it inside the function)")
    module = _loader(path)
    if not hasattr(module, name):
        raise RuntimeError(f"{what}: running the main script here does not define it (it is "
                           f"set under `if __name__ == '__main__':` or inside a function): "
                           f"pass it as an argument, or make it inside the function")
    return getattr(module, name)


def stand_in(func: types.FunctionType, globals_: dict, picklable: Callable[[Any], Exception | None]) -> None:
    """In ``globals_`` (the globals of ``func``, a function of the main script, as they
    are pickled), replace each value that cannot be pickled (``picklable(value)``
    returns the error) by a :class:`MainGlobal`."""
    path = main_file()
    if path is None or func.__module__ != "__main__":
        return
    for name, value in list(globals_.items()):
        if isinstance(value, types.ModuleType):
            continue  # modules travel by reference
        error = picklable(value)
        if error is not None:
            globals_[name] = MainGlobal(name, type(value).__name__, path, str(error) or
                                        type(error).__name__)


def referenced(func: types.FunctionType) -> Iterator[str]:
    """The global names ``func`` (and the functions and classes it defines) refers to."""
    codes = [func.__code__]
    while codes:
        code = codes.pop()
        yield from code.co_names
        codes.extend(c for c in code.co_consts if isinstance(c, types.CodeType))


def culprit(func: Any, picklable: Callable[[Any], Exception | None]) -> str | None:
    """``"its global 'x' (a T)"`` for the first global of ``func`` (a function of the
    main script) that cannot be pickled, or None."""
    if not isinstance(func, types.FunctionType) or func.__module__ != "__main__":
        return None
    seen = set()
    for name in referenced(func):
        if name in seen or name not in func.__globals__:
            continue
        seen.add(name)
        value = func.__globals__[name]
        if not isinstance(value, types.ModuleType) and picklable(value) is not None:
            return f"its global {name!r} (a {type(value).__name__})"
    return None
