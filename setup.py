"""The build of fiberlite's optional C extension, ``fiberlite.runtime.shm._sync``.

Everything else about the package is declared in ``pyproject.toml`` (the extension too:
its name and sources). This file only makes the extension optional: it is built on
Linux (it waits on futexes) where a C compiler works; on any other platform, without a
compiler, or when its build fails for any reason, the install goes on without it and
says so in one line, and fiberlite uses its portable path
(``fiberlite/runtime/shm/portable.py``, POSIX semaphores through the standard library).
"""
import sys

from setuptools import setup
from setuptools.command.build_ext import build_ext

PORTABLE = "the portable path (POSIX semaphores) is used for locks and semaphores"


class OptionalBuildExt(build_ext):
    """``build_ext`` that never fails the install: an extension it cannot build is left out."""

    def run(self) -> None:
        if not sys.platform.startswith("linux"):
            self._left_out(f"it needs Linux (this is {sys.platform})")
            return
        try:
            super().run()
        except Exception as exc:  # no compiler found, a compiler that cannot run, ...
            self._left_out(_one_line(exc))

    def build_extension(self, ext) -> None:
        try:
            super().build_extension(ext)
        except Exception as exc:
            compiling = type(exc).__name__ in ("CompileError", "LinkError", "CCompilerError")
            self._left_out("the C compiler failed" if compiling else _one_line(exc), [ext])

    def _left_out(self, why: str, extensions=None) -> None:
        for ext in extensions or self.extensions:
            print(f"fiberlite: {ext.name} was not built ({why}): {PORTABLE}", file=sys.stderr, flush=True)


def _one_line(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    line = f"{type(exc).__name__}: {text[0]}" if text else type(exc).__name__
    return line if len(line) <= 100 else line[:97] + "..."


setup(cmdclass={"build_ext": OptionalBuildExt})
