"""How a pool's workers are packed into jobs.

A job of its own for each worker costs an interpreter start and a connection to the
master per worker. A host job (:mod:`.host`) runs many workers, forked from its
template, over one connection. How many one job runs is the ``workers_per_job``
setting; by default, on the local backend, the pool's workers are shared among the
machine's CPUs (one host per CPU), and on a cluster backend a job runs as many workers
as its ``cpu`` request allows (a pod with ``cpu=16`` runs 16), so that a pool of
thousands of workers is hundreds of pods.
"""
from __future__ import annotations

import math
import os

from .. import config
from ..runtime.limits import RESERVED, open_file_limit, raise_open_file_limit

DESCRIPTORS_PER_JOB = 4  # what a job costs its master: connection, sentinel, pipes


def workers_per_job(processes: int, process_type: type) -> int:
    """Workers one job of the pool runs (1: each worker is a job of its own)."""
    wanted = config.get("workers_per_job")
    if wanted is None:
        backend = getattr(process_type, "_backend_name", None) or config.get("backend")
        if backend == "local":
            raise_open_file_limit()  # a host inherits this process's limits
            room = max(1, open_file_limit() - RESERVED)  # a worker costs its host one
            wanted = min(math.ceil(processes / (os.cpu_count() or 1)), room)
        else:
            wanted = int(config.get("cpu") or 1)
    return max(1, min(wanted, processes))
