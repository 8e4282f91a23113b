"""The Slurm backend: every job a Slurm batch job.

- :mod:`.backend`: ``SlurmBackend``, the seam's methods;
- :mod:`.commands`: ``sbatch``, ``squeue`` and ``scancel``, a ``JobSpec`` as sbatch options;
- :mod:`.follow`: one ``squeue`` call per tick for every job of this process;
- :mod:`.files`: the jobs' output and key files in the run's directory.
"""
from .backend import SlurmBackend

__all__ = ["SlurmBackend"]
