"""The legs of a whole run: parts of the suite in pytests of their own, beside the rest.

- ``side``: the tests that wait on clusters (Docker containers, pods of the Kubernetes
  double, Slurm jobs) and the benchmark scripts' quick runs. They spend most of their
  time waiting for an engine, a scheduler or a script, not on this machine's CPUs. In
  the leg, the tests that need the project's image run last, while the image builds.
- ``share``: a share of the suite's own files (:data:`SHARE_FILES`), chosen among those
  that wait most (for jobs to start, die, time out) so that the two pytests keep the
  machine's CPUs busy between them.

When a run selects them together with ``tests/test_side_leg.py``, ``conftest.py`` takes
them out of it (:func:`leg_of`) and :func:`start` launches each leg, with its output in a
file; ``tests/test_side_leg.py`` waits for each leg and checks that every test sent
there passed or was skipped by its own condition. A run of those files alone
(``pytest tests/backends``) runs them in its own pytest, as any other test.
"""
from __future__ import annotations

import os
import sys
import tempfile
from dataclasses import dataclass, field

from side_run import SideRun, launch

ENV = "FIBERLITE_TEST_SIDE_LEG"  # the leg's name, in a leg's own pytest: it does not split again
MARKERS = ("docker", "kubernetes", "slurm")
BENCHMARK_FILES = ("tests/test_benchmarks_smoke.py",)  # the benchmark scripts' runs
SHARE_FILES = (  # about 480 s of the suite's 790 when it ran alone, half of it waiting
    "tests/cli/test_cli.py",
    "tests/runtime/test_hub_faults.py",
    "tests/runtime/test_liveness_jobs.py",
    "tests/managers/test_managers.py",
    "tests/test_cpython_conformance.py",
    "tests/ring/test_ring.py",
    "tests/dashboard/test_dashboard_api.py",
    "tests/dashboard/test_dashboard_browser.py",
    "tests/runtime/test_link_faults.py",
    "tests/pool/test_pool_faults.py",
    "tests/pool/test_pool_hosts.py",
    "tests/test_sigint.py",  # 30 s, two thirds of it waiting for its jobs' interrupts
)
LEGS = ("side", "share")
CONTAINERS = ("docker", "kubernetes")  # in the leg, these come last: the image builds meanwhile
COLLECTOR = "tests/test_side_leg.py::test_the_leg_passes"  # one per leg: [side], [share]
RUN_SECONDS = 1200  # what a leg may take, from its start (each takes about 7 minutes)


def leg_of(item) -> str | None:
    """The leg a test runs in, in a whole run (None: the suite's own pytest)."""
    path = item.nodeid.split("::", 1)[0]
    if any(item.get_closest_marker(name) for name in MARKERS) or path in BENCHMARK_FILES:
        return "side"
    if path in SHARE_FILES:
        return "share"
    return None


def needs_image(item) -> bool:
    """Whether a test waits for the project's image (built when the leg starts)."""
    return any(item.get_closest_marker(name) for name in CONTAINERS)


def in_leg() -> bool:
    """Whether this pytest is a leg itself."""
    return bool(os.environ.get(ENV))


@dataclass
class Leg(SideRun):
    """A leg's run and the test ids it was given."""
    ids: list[str] = field(default_factory=list)


_started: dict[str, Leg] = {}


def start(name: str, ids: list[str]) -> Leg:
    """Start the leg ``name`` on the tests ``ids`` (once per session)."""
    if name not in _started:
        folder = tempfile.mkdtemp(prefix=f"fiberlite-{name}-leg-")
        env = {k: v for k, v in os.environ.items()
               if not k.startswith("PYTEST_") or k == "PYTEST_ADDOPTS"}
        env[ENV] = name
        args_path = os.path.join(folder, "tests.txt")
        with open(args_path, "w") as args:  # pytest reads its arguments from a file: @path
            args.write("\n".join(ids) + "\n")
        command = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", f"@{args_path}"]
        run = launch(command, env, folder, f"{name}_leg.log")
        _started[name] = Leg(run.process, run.output_path, run.folder, list(ids))
    return _started[name]


def started(name: str) -> Leg | None:
    return _started.get(name)


def all_started() -> list[Leg]:
    return list(_started.values())
