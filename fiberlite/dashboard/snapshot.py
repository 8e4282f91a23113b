"""The page's data: one JSON-able dict of everything the registry and the meter know."""
from __future__ import annotations

import time
from typing import Any

from .. import observe
from .jobs import Meter, host_of, requested, state_of
from .registry import Batch, PoolRecord, Registry


def job_rows(registry: Registry, meter: Meter,
             states: dict[str, tuple[str, int | None]] | None = None) -> list[dict]:
    """The jobs' rows; ``states``: their states as just found, if known."""
    rows = []
    for record in list(registry.jobs.values()):
        known = states.get(record.name) if states is not None else None
        state, code = known or state_of(record)
        usage = meter.usage.get(record.name)
        rows.append({"name": record.name, "process": record.process_name,
                     "backend": record.backend.name, "host": host_of(record), "state": state,
                     "exitcode": code, "cpu": None if usage is None else usage.cpu,
                     "memory": None if usage is None else usage.memory,
                     "requested": requested(record)})
    return rows


def batch_row(batch: Batch, now: float) -> dict:
    total = batch.total
    end = batch.finished or now
    elapsed = max(end - batch.started, 1e-9)
    rate = batch.done / elapsed
    left = None
    if total is not None and batch.finished is None and rate > 0:
        left = (total - batch.done) / rate
    return {"id": batch.gid, "call": batch.call, "function": batch.function, "done": batch.done,
            "total": total, "failed": batch.failed, "rate": rate, "left": left,
            "finished": batch.finished is not None}


def pool_row(record: PoolRecord, registry: Registry, now: float) -> dict | None:
    pool = record.pool()
    view = observe.view_of(pool) if pool is not None else None
    if view is None:
        return None
    workers, ready = view.workers()
    jobs = view.jobs()
    return {"name": record.name, "state": view.state, "size": view.size,
            "workers": workers, "ready": ready, "jobs": jobs, "hosted": view.hosted,
            "hosts": sorted(set(_hosts(registry, jobs))),
            "pending_chunks": view.pending_chunks, "losses": record.losses,
            "retries": record.retries, "done": record.done,
            "batches": [batch_row(b, now) for b in list(record.batches)][::-1],
            "errors": list(record.errors)[::-1]}


def _hosts(registry: Registry, names: list[str]) -> list[str]:
    return [host_of(registry.jobs[n]) for n in names if n in registry.jobs]


def queue_rows(registry: Registry) -> list[dict]:
    rows = []
    for queue in list(registry.queues.values()):
        view = observe.view_of(queue)
        rows.append({"name": view.name, "size": view.size, "maxsize": view.maxsize,
                     "readers": view.readers, "writers": view.writers, "total": view.total})
    return rows


def marks(registry: Registry) -> tuple:
    """A cheap look at what the run's progress does not explain: the events the registry
    heard (:attr:`Registry.events`) and each queue's size and counts; changes when one
    of them does."""
    with registry.lock:
        queues = registry.queues.valuerefs()
        events = registry.events
    marked = []
    for ref in queues:
        queue = ref()
        if queue is not None:
            view = observe.view_of(queue)
            marked.append((view.size, view.total, view.readers, view.writers))
    return events, tuple(marked)


def progress(registry: Registry) -> dict:
    """What goes up while calls run, and only that: the tasks done, each pool's count
    and the rows of its calls that were running (newest first). The page merges it
    into the last whole data it got; far cheaper to build than :func:`snapshot`."""
    now = time.monotonic()
    with registry.lock:
        pools = {record.name: {"done": record.done,
                               "batches": [batch_row(b, now) for b in list(record.batches)
                                           if b.finished is None][::-1]}
                 for record in registry.pools}
        return {"time": time.time(), "tasks_done": registry.tasks_done, "pools": pools}


def calls_running(registry: Registry) -> bool:
    """Whether a pool call was still running when last looked at."""
    with registry.lock:
        return any(b.finished is None for p in registry.pools for b in p.batches)


def manager_rows(registry: Registry) -> list[dict]:
    rows = []
    for manager in list(registry.managers.values()):
        view = observe.view_of(manager)
        rows.append({"name": view.name, "job": view.job, "state": view.state, "alive": view.alive})
    return rows


def ring_rows(registry: Registry) -> list[dict]:
    rows = []
    for ring in list(registry.rings.values()):
        members = []
        for member in observe.view_of(ring):
            launch = member.process.launch
            job = launch.job.spec.name if launch else None
            record = registry.jobs.get(job)
            host = host_of(record) if record is not None else None
            members.append({"rank": member.rank, "job": job, "joined": member.machine is not None,
                            "host": host or member.machine, "exitcode": member.process.exitcode,
                            **member.rates})
        rows.append({"name": ring.name, "world_size": ring.world_size, "members": members,
                     "joined": sum(1 for m in members if m["joined"])})
    return rows


def snapshot(registry: Registry, meter: Meter, charts: dict[str, Any] | None,
             meta: dict[str, Any], states: dict[str, tuple[str, int | None]] | None = None,
             ) -> dict:
    """Everything the page shows, now (``charts``: the charts' history, or None;
    ``states``: the jobs' states as the meter just found them, else they are asked)."""
    now = time.monotonic()
    with registry.lock:
        pools = [pool_row(p, registry, now) for p in registry.pools]
        return {**meta, "time": time.time(), "jobs": job_rows(registry, meter, states),
                "pools": [p for p in pools if p is not None],
                "queues": queue_rows(registry), "managers": manager_rows(registry),
                "rings": ring_rows(registry), "tasks_done": registry.tasks_done,
                **({"charts": charts} if charts is not None else {})}
