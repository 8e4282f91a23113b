"""Settings: one name per setting, used in the config file, as ``FIBERLITE_<NAME>`` in
the environment, and as a keyword in code.

Precedence, lowest first: defaults < config file < environment < :func:`init` in code.
The config file is ``$FIBERLITE_CONFIG`` if set, else ``.fiberlite.toml`` in the
working directory (TOML, one top-level key per setting). Child jobs receive their
parent's resolved settings, so a job sees the configuration of the script that made it.
"""
from __future__ import annotations

import logging
import os
import threading
from dataclasses import dataclass
from typing import Any, Callable

from .errors import ConfigError
from .units import parse_count, parse_cpu, parse_memory

_LEVELS = ("DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL")


def _text(value: Any) -> str:
    if not isinstance(value, str) or not value.strip():
        raise ValueError("expected a non-empty string")
    return value.strip()


def _level(value: Any) -> str:
    level = str(value).strip().upper()
    if level not in _LEVELS:
        raise ValueError(f"expected one of {', '.join(_LEVELS)}")
    return level


def _backend(value: Any) -> str:
    from .backends import backend_target, known_backends
    name = _text(value).lower()
    if backend_target(name) is None:
        raise ValueError(f"unknown backend; available: {', '.join(sorted(known_backends()))}")
    return name


def _seconds(value: Any) -> float:
    seconds = float(value)
    if seconds <= 0:
        raise ValueError("expected a positive number of seconds")
    return seconds


def _seconds_or_never(value: Any) -> float:
    seconds = float(value)
    if seconds < 0:
        raise ValueError("expected a number of seconds, or 0 for never")
    return seconds


def _positive_count(value: Any) -> int:
    count = parse_count(value)
    if count < 1:
        raise ValueError("expected a whole number of at least 1")
    return count


def parse_address(value: Any) -> tuple[str, int] | None:
    """``host:port``, ``:port`` or ``port`` (loopback), or ``off``."""
    text = str(value).strip()
    if text.lower() in ("", "0", "off", "false", "no"):
        return None
    host, sep, port = text.rpartition(":")
    if not sep:
        host = ""
    host = host.strip("[]") or "127.0.0.1"
    try:
        number = int(port)
    except ValueError:
        raise ValueError("expected host:port (e.g. 127.0.0.1:8787), a port, or off") from None
    if not 0 <= number <= 65535:
        raise ValueError("the port must be between 0 and 65535 (0: any free port)")
    return host, number


def _working_dir(value: Any) -> str | bool | None:
    """A directory, or ``off`` (False); ``on`` is the default (None: the current one)."""
    if value is False or str(value).strip().lower() in ("off", "false", "no", "0"):
        return False
    if value is True or str(value).strip().lower() in ("on", "true", "yes", "1"):
        return None
    return _text(value)


def _flag(value: Any) -> bool:
    if isinstance(value, bool):
        return value
    text = str(value).strip().lower()
    if text in ("1", "true", "yes", "on"):
        return True
    if text in ("0", "false", "no", "off"):
        return False
    raise ValueError("expected true or false")


@dataclass(frozen=True)
class Setting:
    name: str
    default: Any
    parse: Callable[[Any], Any]
    help: str


SETTINGS: dict[str, Setting] = {s.name: s for s in (
    Setting("backend", "local", _backend, "where jobs run: local, docker, kubernetes, slurm (or a plugin)"),
    Setting("image", None, _text, "container image for jobs (default: the parent's own image)"),
    Setting("docker_network", "host", _text, "Docker network for job containers: host or a network name"),
    Setting("namespace", None, _text, "Kubernetes namespace (default: the pod's own, else 'default')"),
    Setting("kubeconfig", None, _text, "kubeconfig file when running outside a cluster"),
    Setting("slurm_partition", None, _text, "Slurm partition for jobs (default: the cluster's default)"),
    Setting("slurm_account", None, _text, "Slurm account jobs are charged to (sbatch --account)"),
    Setting("slurm_qos", None, _text, "Slurm quality of service for jobs (sbatch --qos)"),
    Setting("slurm_time", None, _text, "Slurm time limit per job, as sbatch --time takes it (e.g. 1:00:00)"),
    Setting("slurm_options", None, _text, "more sbatch options for every job, as on a command line "
            "(e.g. '--constraint=skylake --exclusive')"),
    Setting("slurm_dir", None, _text, "directory, seen by every node, for Slurm jobs' output and key "
            "files (default: ~/.local/state/fiberlite/slurm)"),
    Setting("log_level", "WARNING", _level, "logging level of fiberlite's logger"),
    Setting("listen_host", None, _text, "address other jobs use to reach this process (default: from the backend)"),
    Setting("working_dir", None, _working_dir,
            "the directory jobs run in, sent with them where they cannot see it (a pod, a "
            "remote Docker engine) and mounted where they can (default: the current "
            "directory; off: jobs run in their image's)"),
    Setting("working_dir_limit", 32 * 2**20, parse_memory,
            "the most that working_dir may hold to be sent with a run (e.g. 64Mi)"),
    Setting("cpu", None, parse_cpu, "CPUs requested per job unless @meta says otherwise"),
    Setting("memory", None, parse_memory, "memory per job (e.g. 512Mi, 8Gi) unless @meta says otherwise"),
    Setting("gpu", None, parse_count, "GPUs per job unless @meta says otherwise"),
    Setting("workers_per_job", None, _positive_count,
            "pool workers one job runs (default: local, the workers shared among the CPUs; "
            "else the job's whole cpu request)"),
    Setting("idle_timeout", 0.0, _seconds_or_never,
            "seconds a pool may have no work before it lets its workers go and deletes their "
            "jobs; they start again when work comes (0: never)"),
    Setting("start_timeout", 300.0, _seconds, "seconds a job may take to start before it counts as failed"),
    Setting("mount_working_dir", True, _flag,
            "docker: bind-mount working_dir into job containers when the engine runs on this "
            "machine (false: send a copy, as to a remote engine)"),
    Setting("tls", False, _flag, "encrypt the traffic between jobs with TLS keyed by the run's key"),
    Setting("share_machine", True, _flag,
            "jobs on their creator's machine map its Value, Array and locks and link its queues "
            "and pipes over Unix sockets (off: through its hub, as jobs on other machines do)"),
    Setting("peer_timeout", 10.0, _seconds_or_never,
            "seconds a connection's other end may stay silent (a machine gone, a network cut, a "
            "frozen process) before it is given up: a job then exits, a parent treats the job as "
            "lost and kills it (0: never)"),
    Setting("dashboard", None, parse_address,
            "serve the run's live page at host:port (a port alone: on loopback; 0: any free port; "
            "off: none)"),
    Setting("auth_timeout", 10.0, _seconds,
            "seconds a connection may take to prove it holds the run's key before it is closed"),
    Setting("auth_pending_limit", 256, _positive_count,
            "connections that have not yet proved the key kept open at once, per listening socket"),
)}

# settings that describe one job and are not handed down to its children
_PER_JOB = ("listen_host", "dashboard")

_lock = threading.Lock()
_overrides: dict[str, Any] = {}
_inherited: dict[str, Any] | None = None
_resolved: dict[str, Any] | None = None


#: settings that were renamed: old name -> new name
RENAMED = {"parent_timeout": "peer_timeout"}


def _unknown(name: str, source: str = "") -> ConfigError:
    where = f" ({source})" if source else ""
    if name in RENAMED:
        return ConfigError(f"the setting {name!r}{where} is now {RENAMED[name]!r} (it covers both "
                           "sides of every connection): use that name")
    return ConfigError(f"unknown setting {name!r}{where}; known settings: {', '.join(SETTINGS)}")


def _check(name: str, value: Any, source: str) -> Any:
    setting = SETTINGS.get(name)
    if setting is None:
        raise _unknown(name, source)
    if value is None:
        return None
    try:
        return setting.parse(value)
    except (ValueError, TypeError) as exc:
        raise ConfigError(f"invalid value {value!r} for setting {name!r} ({source}): {exc}") from None


def config_file() -> str | None:
    path = os.environ.get("FIBERLITE_CONFIG")
    if path:
        if not os.path.isfile(path):
            raise ConfigError(f"FIBERLITE_CONFIG points to {path!r}, which is not a file")
        return path
    return ".fiberlite.toml" if os.path.isfile(".fiberlite.toml") else None


def _read_file(path: str) -> dict[str, Any]:
    try:
        import tomllib
    except ImportError:  # Python 3.10
        import tomli as tomllib  # type: ignore[no-redef]
    try:
        with open(path, "rb") as fh:
            data = tomllib.load(fh)
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"config file {path} is not valid TOML: {exc}") from None
    return {k: _check(k, v, f"config file {path}") for k, v in data.items()}


def _resolve() -> dict[str, Any]:
    values = {name: s.default for name, s in SETTINGS.items()}
    if _inherited is not None:
        values.update(_inherited)
    else:
        path = config_file()
        if path:
            values.update(_read_file(path))
    for name in SETTINGS:
        env = os.environ.get("FIBERLITE_" + name.upper())
        if env is not None and env != "":
            values[name] = _check(name, env, f"environment variable FIBERLITE_{name.upper()}")
    values.update(_overrides)
    return values


def settings() -> dict[str, Any]:
    """The resolved settings of this process (a copy)."""
    global _resolved
    with _lock:
        if _resolved is None:
            _resolved = _resolve()
            logging.getLogger("fiberlite").setLevel(_resolved["log_level"])
        return dict(_resolved)


def get(name: str) -> Any:
    if name not in SETTINGS:
        raise _unknown(name)
    return settings()[name]


def init(**kwargs: Any) -> dict[str, Any]:
    """Set settings in code (highest precedence); returns the resolved settings."""
    global _resolved
    checked = {k: _check(k, v, "argument to fiberlite.init") for k, v in kwargs.items()}
    with _lock:
        _overrides.update(checked)
        _resolved = None
    return settings()


def adopt(values: dict[str, Any]) -> None:
    """Take the resolved settings a parent job handed down (child side)."""
    global _inherited, _resolved
    with _lock:
        _inherited = {k: v for k, v in values.items() if k in SETTINGS and k not in _PER_JOB}
        _overrides.clear()
        _resolved = None
