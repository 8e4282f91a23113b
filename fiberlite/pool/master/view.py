"""What a pool shows the run's page: a read-only view of its workers and queue, read
afresh at each look (:meth:`fiberlite.pool.Pool.view`)."""
from __future__ import annotations

from typing import Any


class PoolView:
    """The live state of one pool, without a way to change it."""

    def __init__(self, core: Any) -> None:
        self._core = core

    @property
    def source(self) -> Any:
        """What this pool's ``batch`` and ``worker_lost`` events name (see
        :mod:`fiberlite.observe`): a watcher tells its pools apart by it."""
        return self._core.dispatcher

    @property
    def state(self) -> str:
        """``RUN``, ``CLOSE``, ``TERMINATE`` or ``BROKEN``."""
        return self._core.dispatcher.state

    @property
    def size(self) -> int:
        """The workers wanted while there is work."""
        return self._core.processes

    @property
    def hosted(self) -> bool:
        """Whether the workers run in host jobs, forked there, many to a job."""
        return self._core.relay is not None

    @property
    def pending_chunks(self) -> int:
        """Chunks waiting for a worker."""
        return len(self._core.dispatcher.pending)

    def workers(self) -> tuple[int, int]:
        """The workers not gone, and how many of them asked for work."""
        live = [w for w in list(self._core.dispatcher.workers.values()) if not w.gone]
        return len(live), sum(1 for w in live if w.ready)

    def jobs(self) -> list[str]:
        """The names of the pool's jobs (a host job, or a worker's own)."""
        launches = [process.launch for process in list(self._core.procs.values())]
        return [launch.job.spec.name for launch in launches if launch is not None]

    def hosted_pids(self) -> dict[str, list[int]]:
        """For each host job, by name: the pids of the workers forked in it."""
        core = self._core
        if core.relay is None:
            return {}
        found = {}
        for hid, pids in core.relay.pids_by_host().items():
            process = core.procs.get(hid)
            launch = process.launch if process is not None else None
            if launch is not None:
                found[launch.job.spec.name] = pids
        return found
