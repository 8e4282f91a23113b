"""What the commands share: settings from options, backends by name, errors."""
from __future__ import annotations

import argparse
import sys
from typing import Callable

from .. import config
from ..backends import Backend, get_backend, known_backends


class CliError(Exception):
    """A one-line error for the user; ``status`` is the exit status."""

    def __init__(self, message: str, status: int = 1) -> None:
        super().__init__(message)
        self.status = status


def fail(message: str, status: int = 1) -> int:
    sys.stderr.write(f"fiberlite: error: {message}\n")
    return status


def cluster_options() -> argparse.ArgumentParser:
    """Options every command takes to reach a cluster (they set the same-named settings)."""
    parent = argparse.ArgumentParser(add_help=False)
    group = parent.add_argument_group("cluster")
    group.add_argument("--kubeconfig", metavar="PATH", help="kubeconfig file (setting kubeconfig)")
    group.add_argument("--namespace", metavar="NS", help="Kubernetes namespace (setting namespace)")
    return parent


def apply_settings(args: argparse.Namespace) -> None:
    chosen = {k: getattr(args, k, None) for k in ("kubeconfig", "namespace")}
    chosen = {k: v for k, v in chosen.items() if v}
    if chosen:
        config.init(**chosen)


def backend(name: str) -> Backend:
    """The backend ``name``; CliError when it cannot be used here."""
    try:
        return get_backend(name)
    except ImportError as exc:
        raise CliError(f"the {name} backend is not available: {exc}") from None


DEFAULT_BACKEND = next(s.default for s in config.CORE if s.name == "backend")


def chosen_backends(names: list[str] | None) -> list[str]:
    """Backend names from repeated ``--backend`` (``all`` = every known one); the default is
    the default backend (this machine's) plus the configured one."""
    if not names:
        return list(dict.fromkeys([DEFAULT_BACKEND, config.get("backend")]))
    if "all" in names:
        return sorted(known_backends(), key=lambda n: (n != DEFAULT_BACKEND, n))
    unknown = [n for n in names if n not in known_backends()]
    if unknown:
        raise CliError(f"unknown backend {unknown[0]!r}; available: "
                       f"{', '.join(sorted(known_backends()))}, all", 2)
    return list(dict.fromkeys(names))


def on_backends(names: list[str], action: Callable[[str, Backend], None]) -> int:
    """Run ``action`` for each backend; a backend that cannot do it is named on stderr.
    Returns 1 if any failed, else 0."""
    from ..errors import BackendError, ConfigError
    status = 0
    for name in names:
        try:
            action(name, backend(name))
        except NotImplementedError as exc:
            sys.stderr.write(f"fiberlite: {name}: {exc}\n")
        except (CliError, BackendError, ConfigError) as exc:
            sys.stderr.write(f"fiberlite: {name}: {exc}\n")
            status = 1
    return status


def backend_option(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--backend", action="append", metavar="NAME",
                        help=f"{', '.join(sorted(known_backends()))} or all; repeatable "
                             f"(default: {DEFAULT_BACKEND} and the configured backend)")
