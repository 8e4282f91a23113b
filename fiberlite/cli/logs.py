"""``fiberlite logs JOB``: what a job printed, from the backend that ran it."""
from __future__ import annotations

import argparse
import sys

from ..errors import BackendError, ConfigError
from .common import CliError, apply_settings, backend, backend_option, chosen_backends, cluster_options


def add_parser(commands) -> None:
    p = commands.add_parser(
        "logs", parents=[cluster_options()], help="print the output of a job",
        description="Print what a job printed: a Kubernetes pod's or Docker container's log, "
                    "or, for the local backend, the output `fiberlite run` recorded of a "
                    "master job. Job names are as `fiberlite ps` shows them.")
    p.add_argument("job", metavar="JOB", help="job name (e.g. fl-1a2b3c4d-master)")
    p.add_argument("-f", "--follow", action="store_true", help="keep printing until the job ends")
    backend_option(p)
    p.set_defaults(func=main)


def main(args: argparse.Namespace) -> int:
    apply_settings(args)
    names = chosen_backends(args.backend)
    problems = []
    for name in names:
        try:
            chunks = backend(name).stream_logs(args.job, follow=args.follow)
        except (LookupError, NotImplementedError) as exc:
            problems.append(f"{name}: {exc}")
            continue
        except (BackendError, ConfigError, CliError) as exc:
            problems.append(f"{name}: {exc}")
            continue
        try:
            for text in chunks:
                sys.stdout.write(text)
                sys.stdout.flush()
        except KeyboardInterrupt:
            return 130
        return 0
    raise CliError(f"no job {args.job} found ({'; '.join(problems)})")
