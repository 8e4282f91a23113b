"""The side leg: the tests that wait on clusters (Docker containers, pods of the
Kubernetes double, Slurm jobs) and the benchmark scripts' quick runs, in a pytest of
their own beside the rest of the suite.

Those tests spend most of their time waiting for an engine, a scheduler or a script,
not on this machine's CPUs, so the whole suite ends sooner when they run beside
the rest. In the leg, the tests that need the project's image run last, while the
image builds. When a run selects them together with ``tests/test_side_leg.py``, ``conftest.py``
takes them out of it (:func:`belongs`) and :func:`start` launches them, with their
output in a file; ``tests/test_side_leg.py`` waits for the leg and checks that every one
of them passed or was skipped by its own condition. A run of those files alone
(``pytest tests/backends``) runs them in its own pytest, as any other test.
"""
from __future__ import annotations

import os
import sys
import tempfile
from dataclasses import dataclass, field

from side_run import SideRun, launch

ENV = "FIBERLITE_TEST_SIDE_LEG"  # set in the leg's own pytest: it does not split again
MARKERS = ("docker", "kubernetes", "slurm")
FILES = ("tests/test_benchmarks_smoke.py",)  # the benchmark scripts' runs
CONTAINERS = ("docker", "kubernetes")  # in the leg, these come last: the image builds meanwhile
COLLECTOR = "tests/test_side_leg.py::test_the_side_leg_passes"
RUN_SECONDS = 1200  # what the leg may take, from its start (it takes about 7 minutes)


def belongs(item) -> bool:
    """Whether a test runs in the side leg of a whole run."""
    return (any(item.get_closest_marker(name) for name in MARKERS)
            or item.nodeid.split("::", 1)[0] in FILES)


def needs_image(item) -> bool:
    """Whether a test waits for the project's image (built when the leg starts)."""
    return any(item.get_closest_marker(name) for name in CONTAINERS)


def in_leg() -> bool:
    """Whether this pytest is the side leg itself."""
    return os.environ.get(ENV) == "1"


@dataclass
class Leg(SideRun):
    """The leg's run and the test ids it was given."""
    ids: list[str] = field(default_factory=list)


_started: Leg | None = None


def start(ids: list[str]) -> Leg:
    """Start the leg on the tests ``ids`` (once per session)."""
    global _started
    if _started is None:
        folder = tempfile.mkdtemp(prefix="fiberlite-side-leg-")
        env = {k: v for k, v in os.environ.items()
               if not k.startswith("PYTEST_") or k == "PYTEST_ADDOPTS"}
        env[ENV] = "1"
        args_path = os.path.join(folder, "tests.txt")
        with open(args_path, "w") as args:  # pytest reads its arguments from a file: @path
            args.write("\n".join(ids) + "\n")
        command = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", f"@{args_path}"]
        run = launch(command, env, folder, "side_leg.log")
        _started = Leg(run.process, run.output_path, run.folder, list(ids))
    return _started


def started() -> Leg | None:
    return _started
