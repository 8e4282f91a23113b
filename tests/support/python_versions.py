"""The other supported Pythons' runs of a named subset of the suite: each in a
virtualenv of its own with fiberlite's dependencies and pytest (not the test extra,
whose torch is for one version), kept in the user's cache, keyed by the interpreter and
those dependencies and shared by every checkout; a new one takes about 20 s. The runs
import this checkout's fiberlite, its C extension built in place for each Python.

:func:`start` launches the three side by side, niced, with their output in files, as
soon as the suite is collected (``conftest.py``), so that they run while the rest of the
suite does; ``tests/test_python_versions.py`` waits for them and reads their results.
"""
from __future__ import annotations

import fcntl
import glob
import hashlib
import os
import re
import shutil
import subprocess
import tempfile
import threading
from dataclasses import dataclass, field

import bytecode
import side_run
from paths import ROOT

VERSIONS = ["3.10", "3.12", "3.13"]

# the subset, by test file (the docker-marked tests in them are left out): what a
# Python version changes, on every version
SUBSET = [
    "tests/test_exit.py",                   # the exit shapes, stderr empty
    "tests/test_examples.py::test_quickstart",  # the README's demo, stderr empty
    "tests/test_cpython_conformance.py",    # CPython's tests, this Python's version of them
]
# fiberlite's own tests of the API CPython's tests cover: on the newest version, whose
# pickling, managers and pools change first (3.11 runs them all)
NEWEST_ONLY = [
    "tests/test_process.py",
    "tests/pool/test_pool.py",
    "tests/test_queues.py",
    "tests/connection/test_pipe.py",
    "tests/managers/test_managers.py",
]
# left out, to keep each run near a minute on its own: CPython's tests of the
# synchronization primitives (a third of the conformance run; the portable leg and
# 3.11 run them) and the pool's two slowest tests (how tasks spread over workers:
# nothing a Python version changes)
LEFT_OUT = [*(f"tests/test_cpython_conformance.py::{name}" for name in
              ("TestLock", "TestSemaphore", "TestCondition", "TestEvent", "TestBarrier")),
            "tests/pool/test_pool.py::test_long_tasks_spread_over_all_workers",
            "tests/pool/test_pool.py::test_maxtasksperchild_replaces_workers"]
MIN_PASSED = 100  # fewer passing means the subset did not really run (each runs 110+)


def tests_for(version: str) -> list[str]:
    """The test files and ids one version runs."""
    return SUBSET + (NEWEST_ONLY if version == VERSIONS[-1] else [])


RUN_SECONDS = 480  # what one version's subset may take, from its start


def find_python(version: str) -> str | None:
    """The newest installed interpreter of ``version`` (pyenv's, else on PATH)."""
    root = os.environ.get("PYENV_ROOT") or os.path.expanduser("~/.pyenv")
    found = glob.glob(os.path.join(root, "versions", f"{version}.*", "bin", f"python{version}"))
    found = [p for p in found if re.fullmatch(rf"{re.escape(version)}\.\d+", p.split(os.sep)[-3])]
    if found:
        return max(found, key=lambda p: int(p.split(os.sep)[-3].rsplit(".", 1)[1]))
    return shutil.which(f"python{version}")


def _project() -> dict:
    try:
        import tomllib
    except ImportError:  # Python 3.10
        import tomli as tomllib
    with open(os.path.join(ROOT, "pyproject.toml"), "rb") as file:
        return tomllib.load(file)


def _requirements() -> list[str]:
    """pytest and pytest-timeout as the test extra pins them."""
    test_extra = _project()["project"]["optional-dependencies"]["test"]
    return [r for r in test_extra if re.match(r"pytest(-timeout)?\b", r)]


def _dependencies() -> list[str]:
    """What a subset's virtualenv holds: the package's dependencies, pytest and
    pytest-timeout as the test extra pins them, and what the package builds with (its
    C extension is built in place)."""
    project = _project()
    return [*project["project"]["dependencies"], *_requirements(), *project["build-system"]["requires"]]


def _usable(venv_python: str) -> bool:
    """Whether the virtualenv's packages import."""
    done = subprocess.run([venv_python, "-c", "import pytest, pytest_timeout, pynng, cloudpickle, "
                           "numpy, psutil, setuptools"], capture_output=True, timeout=60)
    return done.returncode == 0


def virtualenv(python: str, held: list) -> str:
    """The python of a virtualenv for ``python`` with fiberlite's dependencies, built once
    per interpreter and list of dependencies and shared by every checkout (fiberlite is
    not installed there: the subsets import this checkout's, on ``PYTHONPATH``). Its lock
    file stays open in ``held`` (shared) while it is used; older virtualenvs of the same
    interpreter that nobody uses are removed."""
    key = hashlib.sha256(b"\0".join([os.path.realpath(python).encode(),
                                      *(dep.encode() for dep in _dependencies())])).hexdigest()[:16]
    cache = os.path.join(os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache"),
                         "fiberlite-tests")
    os.makedirs(cache, exist_ok=True)
    name = os.path.basename(python)
    home = os.path.join(cache, f"{name}-{key}")
    built = os.path.join(home, "built")
    lock = open(home + ".lock", "w")
    held.append(lock)
    fcntl.flock(lock, fcntl.LOCK_EX)  # another run may build the same one now
    venv_python = os.path.join(home, "bin", "python")
    if not (os.path.exists(built) and _usable(venv_python)):
        shutil.rmtree(home, ignore_errors=True)
        for step in ([python, "-m", "venv", home],
                     [venv_python, "-m", "pip", "install", "-q", *_dependencies()]):
            _run(step)
        open(built, "w").close()
    fcntl.flock(lock, fcntl.LOCK_SH)  # in use: not removed by another run
    _remove_unused(cache, name, keep=home)
    return venv_python


def build_extensions(venv_python: str) -> None:
    """Build fiberlite's C extension in this checkout for ``venv_python``'s version, as an
    install does (left out where it cannot be built; nothing to do where it is built and
    newer than its sources)."""
    _run([venv_python, "setup.py", "-q", "build_ext", "--inplace"], cwd=ROOT)


def _run(step: list[str], cwd: str | None = None) -> None:
    done = subprocess.run(step, cwd=cwd, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, f"{' '.join(step)} failed:\n{done.stdout}{done.stderr}"


def _remove_unused(cache: str, name: str, keep: str) -> None:
    """Remove the virtualenvs of ``name`` other than ``keep`` that no run holds."""
    for other in glob.glob(os.path.join(cache, f"{name}-*.lock")):
        if other == keep + ".lock":
            continue
        with open(other, "a") as lock:
            try:
                fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except OSError:
                continue  # another run uses or builds it
            shutil.rmtree(other[:-len(".lock")], ignore_errors=True)
            os.unlink(other)




@dataclass
class Subset:
    """One version's run of the subset: its process (None: that Python is not
    installed, or the run failed to start: ``error``) and the file its output goes to.
    ``launched`` is set once its virtualenv is ready and the run started (or could not)."""
    version: str
    process: subprocess.Popen | None = None
    output_path: str = ""
    error: str = ""
    launched: threading.Event = field(default_factory=threading.Event)

    def output(self) -> str:
        with open(self.output_path, errors="replace") as file:
            return file.read()


@dataclass
class Subsets:
    """The runs started by :func:`start`, and the virtualenvs' locks held while they run."""
    runs: dict[str, Subset] = field(default_factory=dict)
    held: list = field(default_factory=list)
    folder: str = ""
    stopped: bool = False
    lock: threading.Lock = field(default_factory=threading.Lock)

    def stop(self) -> None:
        """Kill what still runs, release the virtualenvs."""
        with self.lock:
            self.stopped = True  # a run still being launched is not started
        for run in self.runs.values():
            if run.process is not None and run.process.poll() is None:
                run.process.kill()
                run.process.wait()
        for lock in self.held:
            lock.close()
        self.held.clear()
        shutil.rmtree(self.folder, ignore_errors=True)


_started: Subsets | None = None


def start() -> Subsets:
    """Start each installed version's subset (once per session), side by side: each
    builds its virtualenv first if it must (about 20 s), in a thread of its own, so that
    the suite's first tests do not wait for it."""
    global _started
    if _started is not None:
        return _started
    subsets = Subsets(folder=tempfile.mkdtemp(prefix="fiberlite-versions-"))
    for version in VERSIONS:
        run = subsets.runs[version] = Subset(version)
        python = find_python(version)
        if python is None:
            run.launched.set()
            continue
        threading.Thread(target=_launch, args=(subsets, run, python), daemon=True,
                         name=f"subset-{version}").start()
    _started = subsets
    return subsets


def _launch(subsets: Subsets, run: Subset, python: str) -> None:
    try:
        env = {k: v for k, v in os.environ.items()
               if not k.startswith(("FIBERLITE_", "PYTEST_")) and k != "PYTHONPATH"}
        env["PYTHONPATH"] = ROOT  # this checkout's fiberlite
        venv_python = virtualenv(python, subsets.held)
        build_extensions(venv_python)
        bytecode.compile_package(venv_python)
        command = ["nice", "-n", "5", venv_python, "-m", "pytest", "-q",
                   "-p", "no:cacheprovider", "-m", "not docker and not kubernetes",
                   *tests_for(run.version), *(arg for test in LEFT_OUT for arg in ("--deselect", test))]
        run.output_path = os.path.join(subsets.folder, f"{run.version}.log")
        with subsets.lock:
            if subsets.stopped:
                return
            with open(run.output_path, "w") as output:  # a file, not a pipe: nothing held open here
                run.process = subprocess.Popen(command, cwd=ROOT, env=env, text=True,
                                               stdin=subprocess.DEVNULL, stdout=output,
                                               stderr=subprocess.STDOUT)
            side_run.started(run.process)
    except BaseException as exc:  # the test reports it
        run.error = f"{type(exc).__name__}: {exc}"
    finally:
        run.launched.set()


def started() -> Subsets | None:
    """The runs :func:`start` launched in this session, if it did."""
    return _started
