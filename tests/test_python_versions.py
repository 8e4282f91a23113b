"""Every supported Python: the whole suite runs on this interpreter (3.11), and a named
subset runs on each other one (3.10, 3.12, 3.13) from here, in a virtualenv of its own.

The subset is what differs between versions: how a script exits (the exit shapes, whose
stderr must stay empty: Python 3.12.0 and 3.12.1 refuse threads at exit), CPython's own
multiprocessing tests (each Python runs its own version of them), and Pool, Queue, Pipe
and Manager. The three run side by side. Each virtualenv is built once (the project installed editable, with
pytest; not the test extra, whose torch is for one version) and kept in the user's
cache, keyed by the interpreter, this checkout, pyproject.toml and the sources of the C
extensions (built in place for each Python); a new one takes about 20 s. A version that is not installed is skipped, loudly: pyenv puts them in
``$(pyenv root)/versions``.
"""
from __future__ import annotations

import fcntl
import glob
import hashlib
import os
import re
import shutil
import subprocess

import pytest

from paths import ROOT

VERSIONS = ["3.10", "3.12", "3.13"]

# the subset, by test file (the docker-marked tests in them are left out)
SUBSET = [
    "tests/test_exit.py",                   # the exit shapes, stderr empty
    "tests/test_examples.py::test_quickstart",  # the README's demo, stderr empty
    "tests/test_cpython_conformance.py",    # CPython's tests, this Python's version of them
    "tests/test_process.py",
    "tests/pool/test_pool.py",
    "tests/test_queues.py",
    "tests/connection/test_pipe.py",
    "tests/managers/test_managers.py",
]
# left out, to keep the subset near a minute: CPython's tests of the synchronization
# primitives (a third of the conformance run) and the pool's two slowest tests (how
# tasks spread over workers: nothing a Python version changes); 3.11 runs them all
LEFT_OUT = [*(f"tests/test_cpython_conformance.py::{name}" for name in
              ("TestLock", "TestSemaphore", "TestCondition", "TestEvent", "TestBarrier")),
            "tests/pool/test_pool.py::test_long_tasks_spread_over_all_workers",
            "tests/pool/test_pool.py::test_maxtasksperchild_replaces_workers"]
MIN_PASSED = 150  # fewer passing means the subset did not really run (each runs 200+)

RUN_SECONDS = 480

# the versions run side by side (most of a run is waiting for jobs, not computing)
pytestmark = pytest.mark.timeout(RUN_SECONDS + 240)  # and the first build of each virtualenv


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


def _extensions() -> list[dict]:
    """The C extensions the install builds (in place, for each Python)."""
    return _project().get("tool", {}).get("setuptools", {}).get("ext-modules", [])


def _build_inputs() -> bytes:
    """What an install builds from: pyproject.toml and the extensions' sources."""
    parts = []
    for path in ["pyproject.toml", *(s for ext in _extensions() for s in ext["sources"])]:
        with open(os.path.join(ROOT, path), "rb") as file:
            parts.append(file.read())
    return b"\0".join(parts)


def _usable(venv_python: str) -> bool:
    """Whether the package and its built extensions import there (a checkout cleaned of
    the in-place builds, or moved, needs a new install)."""
    modules = ["fiberlite", *(ext["name"] for ext in _extensions())]
    done = subprocess.run([venv_python, "-c", f"import {', '.join(modules)}"], cwd=ROOT,
                          capture_output=True, timeout=60)
    return done.returncode == 0


def virtualenv(python: str, held: list) -> str:
    """The python of a virtualenv for ``python`` with this checkout installed, built once.
    Its lock file stays open in ``held`` (shared) while it is used; older virtualenvs of
    the same interpreter that nobody uses are removed."""
    key = hashlib.sha256(b"\0".join([os.path.realpath(python).encode(), ROOT.encode(),
                                      _build_inputs()])).hexdigest()[:16]
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
                     [venv_python, "-m", "pip", "install", "-q",
                      "-e", ROOT, *_requirements()]):
            done = subprocess.run(step, capture_output=True, text=True, timeout=600)
            assert done.returncode == 0, f"{' '.join(step)} failed:\n{done.stdout}{done.stderr}"
        open(built, "w").close()
    fcntl.flock(lock, fcntl.LOCK_SH)  # in use: not removed by another run
    _remove_unused(cache, name, keep=home)
    return venv_python


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


@pytest.fixture(scope="module")
def runs() -> dict:
    """Each installed version's subset, started side by side: version -> its process, or
    None when that Python is not installed."""
    started: dict = {}
    held: list = []  # the virtualenvs' lock files, held while the subsets run
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("FIBERLITE_", "PYTEST_")) and k != "PYTHONPATH"}
    for version in VERSIONS:
        python = find_python(version)
        if python is None:
            started[version] = None
            continue
        command = [virtualenv(python, held), "-m", "pytest", "-q", "-p", "no:cacheprovider",
                   "-m", "not docker and not kubernetes", *SUBSET,
                   *(arg for test in LEFT_OUT for arg in ("--deselect", test))]
        started[version] = subprocess.Popen(command, cwd=ROOT, env=env, text=True,
                                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    yield started
    for proc in started.values():
        if proc is not None and proc.poll() is None:
            proc.kill()
            proc.wait()
    for lock in held:
        lock.close()


@pytest.mark.parametrize("version", VERSIONS)
def test_the_subset_passes_on(version, runs):
    proc = runs[version]
    if proc is None:
        pytest.skip(f"PYTHON {version} IS NOT INSTALLED: the cross-version subset did NOT run "
                    f"on it (pyenv install {version})")
    try:
        output, _ = proc.communicate(timeout=RUN_SECONDS)
    except subprocess.TimeoutExpired:
        proc.kill()
        output, _ = proc.communicate()
        pytest.fail(f"the subset did not finish on Python {version} within {RUN_SECONDS} s:\n"
                    f"{output[-6000:]}")
    tail = output[-6000:]
    assert proc.returncode == 0, f"the subset failed on Python {version}:\n{tail}"
    passed = re.search(r"(\d+) passed", output)
    assert passed and int(passed.group(1)) >= MIN_PASSED, f"too few tests ran on {version}:\n{tail}"
