"""``fiberlite clean``: remove the jobs of a run (or of every run) from the backends."""
from __future__ import annotations

import argparse
import sys

from ..runtime.tree.claim import sweep
from .common import apply_settings, backend_option, chosen_backends, cluster_options, on_backends


def add_parser(commands) -> None:
    p = commands.add_parser(
        "clean", parents=[cluster_options()], help="stop and remove the jobs of runs",
        description="Stop and remove every job of a run: local processes, Docker containers, "
                    "Kubernetes pods (and the run's Secrets and ConfigMaps). Without --run, every "
                    "fiberlite job the backends can see is removed. Also deletes the logs "
                    "`fiberlite run` kept of finished local runs, and the copies of working "
                    "directories that jobs of this machine left when they were killed.")
    backend_option(p)
    p.add_argument("--run", metavar="ID", help="only this run (see `fiberlite ps`)")
    p.set_defaults(func=main)


def main(args: argparse.Namespace) -> int:
    apply_settings(args)
    names = chosen_backends(args.backend)
    what = f"run {args.run}" if args.run else "all runs"

    def clean(name, backend) -> None:
        removed = backend.clean(args.run)
        sys.stdout.write(f"{name}: removed {removed} job{'s' if removed != 1 else ''} of {what}\n")

    status = on_backends(names, clean)
    sweep()  # copies of working directories whose jobs ended here without removing them
    return status
