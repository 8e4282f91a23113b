"""The page's rows come from the public views the objects give it (``fiberlite.observe.view_of(manager)``,
queue and pool views, a result's ``progress()``), read by a registry that
watches this process, without a server."""
from __future__ import annotations

import pytest

import fiberlite
import jobs
from fiberlite import observe
from fiberlite.dashboard.jobs import hosted_workers
from fiberlite.dashboard.registry import Registry
from fiberlite.dashboard.snapshot import manager_rows, pool_row, queue_rows
from waiting import eventually

pytestmark = pytest.mark.timeout(90)


@pytest.fixture
def registry():
    """A registry told of what this process creates from now on, as the page's is."""
    watching = Registry()
    observe.watch(watching)
    yield watching
    observe.unwatch(watching)


def test_a_manager_row_follows_its_server_job(registry):
    manager = fiberlite.Manager()
    [row] = manager_rows(registry)
    assert row["state"] == "started" and row["alive"] and row["job"].startswith("fl-")
    manager.shutdown()
    assert manager_rows(registry) == [dict(row, state="shutdown", alive=False)]


def test_a_queue_row_counts_its_items_and_tells_of_changes(registry):
    changes = []
    registry.changed = lambda: changes.append(1)
    queue = fiberlite.Queue(maxsize=3)
    heard = len(changes)
    queue.put("x")
    queue.put("y")
    queue.get()
    [row] = queue_rows(registry)
    assert row == {"name": f"Queue {row['name'].split()[1]}", "size": 1, "maxsize": 3,
                   "readers": 0, "writers": 0, "total": 2}
    assert len(changes) > heard  # the queue's changes wake the page


@pytest.mark.parametrize("per_job", [1, 2])
def test_a_pool_row_and_its_calls_progress(registry, per_job):
    fiberlite.init(workers_per_job=per_job)
    try:
        pool = fiberlite.Pool(2)
    finally:
        fiberlite.init(workers_per_job=None)
    with pool:
        assert pool.map(jobs.slow_square, range(6)) == [(i, i * i) for i in range(6)]
        [record] = registry.pools
        row = pool_row(record, registry, 0.0)
        assert row["size"] == 2 and row["state"] == "RUN" and row["pending_chunks"] == 0
        assert row["hosted"] == (per_job == 2) and len(row["jobs"]) == 2 // per_job
        assert row["workers"] == 2
        [batch] = row["batches"]
        assert (batch["call"], batch["done"], batch["total"]) == ("map", 6, 6)
        forked = [2] if row["hosted"] else []  # the pids of the workers forked in each host
        eventually(lambda: sorted(map(len, hosted_workers(registry.pools).values())) == forked,
                   30, what=lambda: f"the forked workers' pids ({hosted_workers(registry.pools)})")
