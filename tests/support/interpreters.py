"""New interpreters the tests start: a script, ``-c`` code or a ``-m`` module, run by this
Python with this checkout and tests/support importable, and never inside this process's
run (a new one: no run id, key or job name of this one)."""
from __future__ import annotations

import os
import subprocess
import sys
from typing import Any, Mapping, Sequence

from paths import ROOT, SUPPORT

THIS_RUN = ("FIBERLITE_RUN_ID", "FIBERLITE_AUTHKEY", "FIBERLITE_JOB_NAME")


def python_env(changes: Mapping[str, str | None] | None = None, clean: bool = False) -> dict[str, str]:
    """This process's environment for a new interpreter, with ``changes`` made (None:
    removed); ``clean``: no ``FIBERLITE_*`` setting at all (a process outside any run)."""
    env = {k: v for k, v in os.environ.items()
           if k not in THIS_RUN and not (clean and k.startswith("FIBERLITE_"))}
    env["PYTHONPATH"] = os.pathsep.join([ROOT, SUPPORT, *filter(None, [os.environ.get("PYTHONPATH")])])
    for name, value in (changes or {}).items():
        if value is None:
            env.pop(name, None)
        else:
            env[name] = value
    return env


def run_python(*args: Any, timeout: float, cwd: Any = None, env: Mapping[str, str | None] | None = None,
               clean: bool = False, prefix: Sequence[str] = (), **run: Any) -> subprocess.CompletedProcess:
    """Run ``python *args`` to its end (``prefix``: a command that runs it, as ``unshare``;
    ``run``: more of ``subprocess.run``'s arguments); its output captured as text."""
    return subprocess.run([*prefix, sys.executable, *map(str, args)], cwd=cwd,
                          env=python_env(env, clean), capture_output=True, text=True,
                          timeout=timeout, **run)


def start_python(*args: Any, cwd: Any = None, env: Mapping[str, str | None] | None = None,
                 clean: bool = False, **popen: Any) -> subprocess.Popen:
    """Start ``python *args``; ``popen``: its pipes (``stdout=subprocess.PIPE``, ...), as
    text unless said otherwise."""
    popen.setdefault("text", True)
    return subprocess.Popen([sys.executable, *map(str, args)], cwd=cwd, env=python_env(env, clean),
                            **popen)
