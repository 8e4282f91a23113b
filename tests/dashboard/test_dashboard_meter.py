"""What the page's meter measures for local jobs: a pool host job's CPU and memory
include the workers forked in it, found through the pool (its relay knows their pids),
not by looking through the machine's processes."""
from __future__ import annotations

import psutil
import pytest

import fiberlite as mp
from fiberlite import dashboard
from fiberlite.dashboard.jobs import hosted_workers

pytestmark = pytest.mark.timeout(90)


def test_host_jobs_are_measured_with_their_forked_workers(page, monkeypatch):
    looked = []
    monkeypatch.setattr(psutil, "process_iter", lambda *a, **k: looked.append(1) or iter(()))
    with mp.Pool(4) as pool:
        assert pool.map(abs, range(-100, 0)) == list(range(100, 0, -1))
        workers = sorted(w.pid for w in pool._pool)  # waits for every worker's pid
        monitor = dashboard._server.monitor
        hosted = hosted_workers(monitor.registry.pools)
        hosts = {p.name: p for p in pool._core.procs.values()}
        # every worker is in one host job, each host's forked workers by pid
        assert sorted(pid for pids in hosted.values() for pid in pids) == workers
        names = {proc._popen.job.spec.name: proc for proc in hosts.values()}
        assert set(hosted) == set(names) and len(names) == 2
        for name, pids in hosted.items():
            assert {c.pid for c in psutil.Process(names[name].pid).children(recursive=True)} >= set(pids)
        monitor.tick()
        usage = monitor.meter.usage
        for name, pids in hosted.items():
            own = psutil.Process(names[name].pid).memory_info().rss
            forked = sum(psutil.Process(pid).memory_info().rss for pid in pids)
            # the job's memory is its own and its workers' (allowing for their changes)
            assert usage[name].memory > own + forked / 2, (name, usage[name].memory, own, forked)
    assert looked == []  # no look through the machine's processes


def test_the_meter_asks_each_backend_and_knows_none_by_name():
    """What a job uses and where it runs come from its backend's ``sample`` and
    ``location``: a backend of another package is measured like the built-in ones."""
    import threading
    from types import SimpleNamespace

    from fiberlite.backends.base import Backend, Job, JobSpec, JobState
    from fiberlite.dashboard.jobs import Meter, host_of

    class Counting(Backend):
        name = "counting"
        create_job = wait = terminate = logs = listen_host = lambda *a, **k: None

        def __init__(self):
            self.asked = []
            self.cpu = 0.0

        def status(self, job):
            return JobState.RUNNING

        def sample(self, job, forked=()):
            self.asked.append((job.id, list(forked)))
            self.cpu += 0.5
            return self.cpu, 1000 + len(forked)

        def location(self, job):
            return f"node-{job.id}"

    backend = Counting()
    records = []
    for name in ("fl-a-1", "fl-a-2"):
        job = Job(backend, name[-1], JobSpec(command=["python"], name=name))
        launch = SimpleNamespace(job=job, returncode=None, channel=SimpleNamespace(lost=threading.Event()))
        records.append(SimpleNamespace(name=name, backend=backend, launch=launch))
    meter = Meter()
    meter.sample(records, {"fl-a-2": [11, 12]})
    meter.sample(records, {"fl-a-2": [11, 12]})
    assert backend.asked == [("1", []), ("2", [11, 12])] * 2
    assert meter.usage["fl-a-1"].memory == 1000 and meter.usage["fl-a-2"].memory == 1002
    assert meter.usage["fl-a-1"].cpu > 0  # CPU seconds grew between the two samples
    assert [host_of(r) for r in records] == ["node-1", "node-2"]
