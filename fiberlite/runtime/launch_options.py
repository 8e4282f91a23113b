"""What a :class:`~fiberlite.process.Process` says about the job that will run it.

A context's ``Process`` class names its backend; a pool marks its workers' jobs as ones
that may wait for room on a cluster and says how many workers a host job runs. The
launcher (:mod:`.launcher`) reads them into the job's :class:`~fiberlite.backends.JobSpec`.
"""
from __future__ import annotations

from dataclasses import dataclass

from .. import config

# in a job's environment: the job is a pool host, whose bootstrap forks its fork template
FORK_TEMPLATE = "FIBERLITE_FORK_TEMPLATE"


@dataclass(frozen=True)
class LaunchOptions:
    """How a process's job is launched (``Process.launch_options``)."""

    backend: str | None = None  # None: the configured backend (setting ``backend``)
    waits_for_capacity: bool = False  # JobSpec.waits_for_capacity: one of a pool's many jobs
    workers: int = 1  # JobSpec.workers: the pool workers the job runs (a pool host's count)
    forks_template: bool = False  # a pool host: its job forks the template as it starts

    def backend_name(self) -> str:
        """The backend the job goes to."""
        return self.backend or config.get("backend")
