"""``fiberlite ps``: the runs and jobs each backend knows, with their state."""
from __future__ import annotations

import argparse
import sys

from .common import apply_settings, backend_option, chosen_backends, cluster_options, on_backends


def add_parser(commands) -> None:
    p = commands.add_parser(
        "ps", parents=[cluster_options()], help="list runs and their jobs",
        description="List the jobs of fiberlite runs, by backend: local processes whose "
                    "environment carries FIBERLITE_RUN_ID, Docker containers and Kubernetes "
                    "pods labelled fiberlite/run.")
    backend_option(p)
    p.add_argument("--run", metavar="ID", help="only the jobs of this run")
    p.set_defaults(func=main)


def main(args: argparse.Namespace) -> int:
    apply_settings(args)
    rows: list[tuple[str, str, str, str]] = []

    def collect(name, backend) -> None:
        rows.extend((name, run, job, state) for job, run, state in backend.list_jobs(args.run))

    status = on_backends(chosen_backends(args.backend), collect)
    if not rows:
        sys.stdout.write("no jobs\n" if args.run is None else f"no jobs of run {args.run}\n")
        return status
    header = ("BACKEND", "RUN", "JOB", "STATE")
    widths = [max(len(r[i]) for r in rows + [header]) for i in range(3)]
    for row in [header] + sorted(rows, key=lambda r: (r[0], r[1])):
        sys.stdout.write("  ".join(c.ljust(w) for c, w in zip(row, widths)) + f"  {row[3]}\n")
    return status
