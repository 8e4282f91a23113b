"""The Slurm backend: every job a Slurm batch job.

- :mod:`.backend`: ``SlurmBackend``, the seam's methods;
- :mod:`.commands`: ``sbatch``, ``squeue``, ``scancel`` and ``sinfo``, a ``JobSpec`` as sbatch options;
- :mod:`.follow`: one ``squeue`` call per tick for every job of this process;
- :mod:`.files`: the jobs' output and key files in the run's directory.

Its settings are declared here (``SETTINGS``); the rest is imported when first used.
"""
from __future__ import annotations

from typing import TYPE_CHECKING

from ...config import Setting, text
from ..base import lazy_exports

SETTINGS = (
    Setting("slurm_partition", None, text, "Slurm partition for jobs (default: the cluster's default)"),
    Setting("slurm_account", None, text, "Slurm account jobs are charged to (sbatch --account)"),
    Setting("slurm_qos", None, text, "Slurm quality of service for jobs (sbatch --qos)"),
    Setting("slurm_time", None, text, "Slurm time limit per job, as sbatch --time takes it (e.g. 1:00:00)"),
    Setting("slurm_options", None, text, "more sbatch options for every job, as on a command line "
            "(e.g. '--constraint=skylake --exclusive')"),
    Setting("slurm_dir", None, text, "directory, seen by every node, for Slurm jobs' output and key "
            "files (default: ~/.local/state/fiberlite/slurm)"),
)

__all__ = ["SlurmBackend"]
__getattr__ = lazy_exports(__name__, {"SlurmBackend": ".backend"})

if TYPE_CHECKING:
    from .backend import SlurmBackend
