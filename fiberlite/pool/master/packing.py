"""How a pool's workers are packed into jobs.

A job of its own for each worker costs an interpreter start and a connection to the
master per worker. A host job (:mod:`..job.host`) runs many workers, forked from its
template, over one connection. How many one job runs is the ``workers_per_job``
setting; by default, the pool's backend says (``Backend.workers_per_job``): the local
backend shares the workers among the machine's CPUs (one host per CPU), Slurm fills a
node of the partition, and Docker and Kubernetes run as many workers as a job's ``cpu``
request allows (a pod with ``cpu=16`` runs 16), so that a pool of thousands of workers
is tens or hundreds of jobs.
"""
from __future__ import annotations

from ... import config
from ...backends import get_backend
from ...runtime.launch_options import LaunchOptions
from ...runtime.limits import RESERVED, open_file_limit, raise_open_file_limit

DESCRIPTORS_PER_JOB = 4  # what a job costs its master: connection, sentinel, pipes


def workers_per_job(processes: int, process_type: type) -> int:
    """Workers one job of the pool runs (1: each worker is a job of its own)."""
    wanted = config.get("workers_per_job")
    if wanted is None:
        options = getattr(process_type, "launch_options", None) or LaunchOptions()
        backend = get_backend(options.backend_name())
        wanted = backend.workers_per_job(processes, config.get("cpu"))
        if wanted > 1:  # a worker costs its host a descriptor; a host here inherits our limits
            raise_open_file_limit()
            wanted = min(wanted, max(1, open_file_limit() - RESERVED))
    return max(1, min(wanted, processes))
