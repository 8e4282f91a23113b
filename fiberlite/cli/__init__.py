"""The ``fiberlite`` command: ``run``, ``ps``, ``logs``, ``clean`` (one module each)."""
from __future__ import annotations

import argparse
import sys

from .. import __version__
from . import clean, logs, ps, run
from .common import CliError, fail

COMMANDS = (run, ps, logs, clean)


def parser() -> argparse.ArgumentParser:
    top = argparse.ArgumentParser(
        prog="fiberlite",
        description="Run Python scripts whose processes are jobs on this machine, on Docker "
                    "or on Kubernetes, and look after the jobs of their runs.",
        epilog="Settings (backend, image, namespace, kubeconfig, ...) also come from "
               ".fiberlite.toml and FIBERLITE_<NAME> environment variables. "
               "`fiberlite COMMAND --help` describes each command.")
    top.add_argument("--version", action="version", version=f"fiberlite {__version__}")
    commands = top.add_subparsers(dest="command", metavar="COMMAND")
    for module in COMMANDS:
        module.add_parser(commands)
    return top


def main(argv: list[str] | None = None) -> int:
    """Entry point of the ``fiberlite`` command; returns (and exits with) its status."""
    top = parser()
    args = top.parse_args(argv)
    try:
        if not getattr(args, "command", None):
            top.print_help(sys.stderr)
            status = 2
        else:
            status = args.func(args)
    except CliError as exc:
        status = fail(str(exc), exc.status)
    except Exception as exc:  # BackendError, ConfigError: one line, no traceback
        from ..errors import BackendError, ConfigError
        if not isinstance(exc, (BackendError, ConfigError)):
            raise
        status = fail(str(exc))
    if argv is None:
        sys.exit(status)
    return status
