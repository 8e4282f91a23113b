"""Every supported Python: the whole suite runs on this interpreter (3.11), and a named
subset runs on each other one (3.10, 3.12, 3.13), from here, in a virtualenv of its own.

The subset is what differs between versions: how a script exits (the exit shapes, whose
stderr must stay empty: Python 3.12.0 and 3.12.1 refuse threads at exit) and CPython's own
multiprocessing tests (each Python runs its own version of them); the newest version also
runs fiberlite's own tests of Process, Pool, Queue, Pipe and Manager. The three start side by side as soon as the suite is collected and run
while the rest of it does (:mod:`python_versions`); these tests collect their results.
A version that is not installed is skipped, loudly: pyenv puts them in
``$(pyenv root)/versions``.
"""
from __future__ import annotations

import re

import pytest

import python_versions
import side_run
from python_versions import MIN_PASSED, RUN_SECONDS, VERSIONS

pytestmark = pytest.mark.timeout(RUN_SECONDS + 240)  # and the first build of each virtualenv


@pytest.fixture(scope="module")
def runs():
    """Each version's run of the subset (started by conftest.py when the suite was
    collected, or now when this file runs alone)."""
    subsets = python_versions.start()
    yield subsets.runs
    subsets.stop()


@pytest.mark.parametrize("version", VERSIONS)
def test_the_subset_passes_on(version, runs):
    assert runs[version].launched.wait(RUN_SECONDS), f"the subset on {version} was not started"
    assert not runs[version].error, f"the subset on {version} could not start: {runs[version].error}"
    proc = runs[version].process
    if proc is None:
        pytest.skip(f"PYTHON {version} IS NOT INSTALLED: the cross-version subset did NOT run "
                    f"on it (pyenv install {version})")
    if not side_run.wait_for(proc, RUN_SECONDS, f"Python {version}"):
        pytest.fail(f"the subset did not finish on Python {version} within {RUN_SECONDS} s of this "
                    f"test's start:\n{runs[version].output()[-6000:]}")
    output = runs[version].output()
    tail = output[-6000:]
    assert proc.returncode == 0, f"the subset failed on Python {version}:\n{tail}"
    passed = re.search(r"(\d+) passed", output)
    assert passed and int(passed.group(1)) >= MIN_PASSED, f"too few tests ran on {version}:\n{tail}"
