"""Shared fixtures: every test runs in a fresh working directory and leaves no job behind."""
from __future__ import annotations

import os
import sys
import time

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TESTS = os.path.dirname(os.path.abspath(__file__))
# what the tests share (job targets, the scripts they run, waiting, the Docker and browser
# set-up) is in support/, imported by module name (``import jobs``) here and in the jobs
# the tests start, which receive this sys.path
SUPPORT = os.path.join(TESTS, "support")
for path in (ROOT, TESTS, SUPPORT):
    if path not in sys.path:
        sys.path.insert(0, path)


def pytest_configure(config):
    """Ctrl-C is KeyboardInterrupt here and in every process the suite starts, as in a
    terminal: a suite started in the background by a shell without job control inherits
    SIGINT ignored, and so would every Python it starts (Python then installs no handler
    of its own), and the tests of Ctrl-C in waits would wait in vain."""
    import signal
    if signal.getsignal(signal.SIGINT) is signal.SIG_IGN:
        signal.signal(signal.SIGINT, signal.default_int_handler)


@pytest.fixture
def waiting_jobs():
    """``waiting_jobs(count=1, ctx=fiberlite, timeout=30)``: start jobs that wait forever
    and return them once each has said that it runs."""
    import fiberlite
    import jobs

    def start(count: int = 1, ctx=None, timeout: float = 30) -> list:
        ctx = ctx or fiberlite
        ready = ctx.Queue()
        started = [ctx.Process(target=jobs.wait_forever, args=(ready,)) for _ in range(count)]
        for process in started:
            process.start()
        for _ in started:
            ready.get(timeout=timeout)
        return started
    return start


LEFTOVER_GRACE_SECONDS = 5.0   # a job still ending when its test returns (CPython's tests
                               # leave daemons that finish on their own, unjoined)


@pytest.fixture(autouse=True)
def _no_leftover_children(request):
    """Fail a test that leaves child jobs running (still running
    ``LEFTOVER_GRACE_SECONDS`` after it) and clean them up; a test class with
    ``jobs_kept_by_class = True`` ends its jobs in its ``tearDownClass``."""
    import fiberlite
    yield
    if getattr(request.cls, "jobs_kept_by_class", False):
        return
    ending = fiberlite.active_children()
    deadline = time.monotonic() + LEFTOVER_GRACE_SECONDS
    for child in ending:   # a job that ends on its own in the grace was not left behind
        child.join(max(0.0, deadline - time.monotonic()))
    left = [child for child in ending if child.exitcode is None]
    for child in left:
        child.kill()
        child.join(10)
    assert not left, f"test left running jobs: {left}"


@pytest.fixture(params=["shared", "hub"])
def machine_path(request, monkeypatch):
    """Run the test twice: its child jobs map their parent's shared memory (the fast path
    of one machine), then reach it through its hub as jobs of another machine would
    (``share_machine`` off, handed down to the children)."""
    from fiberlite import config
    if request.param == "hub":
        monkeypatch.setattr(config, "_overrides", dict(config._overrides, share_machine=False))
        monkeypatch.setattr(config, "_resolved", None)
    return request.param


@pytest.fixture
def without_lanes(monkeypatch):
    """Queues and pipes made in the test keep their items in their creator's hub, as
    those of a creator that shares no lane with its machine do (links and channels are
    what is tested)."""
    from fiberlite.runtime.lanes import shared
    monkeypatch.setattr(shared, "enabled", lambda: False)


@pytest.hookimpl(trylast=True)  # after -k and -m have deselected what they do
def pytest_collection_modifyitems(config, items):
    """A whole run (one that selects the legs' tests) leaves the cluster tests, the
    benchmark scripts' runs and a share of its own files to the legs (:mod:`side_leg`),
    which run beside it; the tests that collect what ran beside the suite run last."""
    import side_leg
    if config.option.collectonly:
        return
    if side_leg.in_leg():
        items.sort(key=side_leg.needs_image)  # (stable) the image builds meanwhile
        return
    # the tests that wait for what runs beside the suite come last, when it is done
    items.sort(key=lambda item: item.nodeid.startswith(WAITING_FOR_RUNS_BESIDE))  # (stable)
    if not any(item.nodeid.startswith(side_leg.COLLECTOR) for item in items):
        return
    legs: dict[str, list[str]] = {}
    kept = []
    for item in items:
        name = side_leg.leg_of(item)
        if name is None:
            kept.append(item)
        else:
            legs.setdefault(name, []).append(item.nodeid)
    if legs:
        config.hook.pytest_deselected(items=[item for item in items if side_leg.leg_of(item)])
        items[:] = kept
        config._leg_ids = legs


WAITING_FOR_RUNS_BESIDE = ("tests/test_side_leg.py::", "tests/test_python_versions.py::",
                           "tests/test_portable_sync.py::test_the_portable_leg_passes")


def pytest_collection_finish(session):
    """When the cross-version tests (or the portable path's leg, or the side leg) are
    selected, start the other Pythons' subsets (and the legs) now, before any test runs,
    so that they run beside the rest of the suite (their output goes to files: no descriptor of this
    process changes while the tests run)."""
    if session.config.option.collectonly:
        return
    import bytecode
    bytecode.compile_package()
    if any(item.nodeid.startswith("tests/test_python_versions.py") for item in session.items):
        import python_versions
        python_versions.start()
    if any(item.nodeid.startswith("tests/test_portable_sync.py::test_the_portable_leg_passes")
           for item in session.items):
        import portable_leg
        portable_leg.start()
    import side_leg
    for name, ids in getattr(session.config, "_leg_ids", {}).items():
        side_leg.start(name, ids)
    _start_docker_setup(session)


def _start_docker_setup(session) -> None:
    """When container tests are selected, build the image in the background from now on;
    the first of them may wait for that build, and gets the build's time on top of its own
    timeout (a fresh machine installs the engine too)."""
    first = next((item for item in session.items
                  if item.get_closest_marker("docker") or item.get_closest_marker("kubernetes")),
                 None)
    if first is None:
        return
    import docker_env
    docker_env.start_setup()
    own = first.get_closest_marker("timeout")
    seconds = own.args[0] if own and own.args else float(session.config.getini("timeout") or 0)
    first.add_marker(pytest.mark.timeout(seconds + docker_env.TIMEOUT))


def pytest_sessionfinish(session):
    import portable_leg
    import python_versions
    import side_leg
    for leg in side_leg.all_started():
        leg.stop()
    subsets = python_versions.started()
    if subsets is not None:
        subsets.stop()
    leg = portable_leg.started()
    if leg is not None:
        leg.stop()


_COST_BY_FILE: dict[str, list[float]] = {}  # test file -> [CPU seconds of its tests and the
# jobs they reaped, wall seconds]


def _cpu_seconds() -> float:
    import resource
    own, children = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime + children.ru_utime + children.ru_stime


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item, nextitem):
    import side_run

    def own_cpu() -> float:  # without the runs beside the suite (reaped at any moment)
        return _cpu_seconds() - side_run.reaped_cpu()
    start, began = own_cpu(), time.monotonic()
    yield
    cost = _COST_BY_FILE.setdefault(item.nodeid.split("::", 1)[0], [0.0, 0.0])
    cost[0] += own_cpu() - start
    cost[1] += time.monotonic() - began


def pytest_terminal_summary(terminalreporter):
    """Where a whole run's CPU went: this pytest with the jobs it waited for, and each run
    beside it (its wall seconds, CPU seconds); the test files that used most CPU, and
    those that took longest (a file that takes far longer than its CPU waits)."""
    import resource

    import side_run
    if not side_run.COSTS:
        return
    own = resource.getrusage(resource.RUSAGE_SELF)
    children = resource.getrusage(resource.RUSAGE_CHILDREN)
    beside = side_run.reaped_cpu()
    main = own.ru_utime + own.ru_stime + children.ru_utime + children.ru_stime - beside
    lines = [f"this pytest and its jobs: {main:.0f} CPU-s"]
    lines += [f"{name}: {wall:.0f} s, {cpu:.0f} CPU-s" for name, (wall, cpu) in sorted(side_run.COSTS.items())]
    lines += ["the files that used most CPU (CPU-s, wall s):"]
    lines += [f"  {cpu:6.1f} {wall:6.1f}  {path}"
              for path, (cpu, wall) in sorted(_COST_BY_FILE.items(), key=lambda kv: -kv[1][0])[:20]]
    lines += ["the files that waited most (wall s less CPU-s):"]
    lines += [f"  {wall - cpu:6.1f}  {path}"
              for path, (cpu, wall) in sorted(_COST_BY_FILE.items(), key=lambda kv: kv[1][0] - kv[1][1])[:15]]
    terminalreporter.write_sep("-", "CPU of the run")
    for line in lines:
        terminalreporter.write_line(line)
