"""Settings: one name per setting, used in the config file, as ``FIBERLITE_<NAME>`` in
the environment, and as a keyword in code.

fiberlite's own settings are listed here (:data:`CORE`); a backend declares its own in
its package (``SETTINGS``, see :mod:`fiberlite.plugins`), and they are collected when
settings are first needed: the built-in backends' always, a plugin backend's once its
entry point is read (when the ``backend`` setting names it, or a name is not otherwise
known). The value kinds below (:func:`text`, :func:`flag`, :func:`seconds`...) are what
a backend's settings are parsed with.

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
from .plugins import BUILTIN, backend_target, declared_settings, known_backends
from .units import parse_count, parse_cpu, parse_memory

_LEVELS = ("DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL")


def text(value: Any) -> str:
    if not isinstance(value, str) or not value.strip():
        raise ValueError("expected a non-empty string")
    return value.strip()


def level(value: Any) -> str:
    name = str(value).strip().upper()
    if name not in _LEVELS:
        raise ValueError(f"expected one of {', '.join(_LEVELS)}")
    return name


def backend_name(value: Any) -> str:
    name = text(value).lower()
    if backend_target(name) is None:
        raise ValueError(f"unknown backend; available: {', '.join(sorted(known_backends()))}")
    return name


def seconds(value: Any) -> float:
    amount = float(value)
    if amount <= 0:
        raise ValueError("expected a positive number of seconds")
    return amount


def seconds_or_never(value: Any) -> float:
    amount = float(value)
    if amount < 0:
        raise ValueError("expected a number of seconds, or 0 for never")
    return amount


def positive_count(value: Any) -> int:
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


def working_dir(value: Any) -> str | bool | None:
    """A directory, or ``off`` (False); ``on`` is the default (None: the current one)."""
    if value is False or str(value).strip().lower() in ("off", "false", "no", "0"):
        return False
    if value is True or str(value).strip().lower() in ("on", "true", "yes", "1"):
        return None
    return text(value)


def flag(value: Any) -> bool:
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
    """One setting: its ``name`` (a key of the config file and of :func:`init`), its
    ``default``, ``parse`` (a value as given, text from the environment included, to
    the value used; ValueError or TypeError saying what is expected) and ``help``."""

    name: str
    default: Any
    parse: Callable[[Any], Any]
    help: str

    @property
    def env(self) -> str:
        """Its environment variable."""
        return "FIBERLITE_" + self.name.upper()


#: fiberlite's own settings; the backends' are declared in their packages
CORE: tuple[Setting, ...] = (
    Setting("backend", "local", backend_name, "where jobs run: local, docker, kubernetes, slurm (or a plugin)"),
    Setting("image", None, text, "container image for jobs (default: the parent's own image)"),
    Setting("log_level", "WARNING", level, "logging level of fiberlite's logger"),
    Setting("listen_host", None, text, "address other jobs use to reach this process (default: from the backend)"),
    Setting("working_dir", None, working_dir,
            "the directory jobs run in, sent with them where they cannot see it (a pod, a "
            "remote Docker engine) and mounted where they can (default: the current "
            "directory; off: jobs run in their image's)"),
    Setting("working_dir_limit", 32 * 2**20, parse_memory,
            "the most that working_dir may hold to be sent with a run (e.g. 64Mi)"),
    Setting("cpu", None, parse_cpu, "CPUs requested per job unless @meta says otherwise"),
    Setting("memory", None, parse_memory, "memory per job (e.g. 512Mi, 8Gi) unless @meta says otherwise"),
    Setting("gpu", None, parse_count, "GPUs per job unless @meta says otherwise"),
    Setting("workers_per_job", None, positive_count,
            "pool workers one job runs (default: the backend's; local: the workers shared among "
            "the CPUs; slurm: a node's CPUs; docker, kubernetes: the job's whole cpu request)"),
    Setting("idle_timeout", 0.0, seconds_or_never,
            "seconds a pool may have no work before it lets its workers go and deletes their "
            "jobs; they start again when work comes (0: never)"),
    Setting("start_timeout", 300.0, seconds, "seconds a job may take to start before it counts as failed"),
    Setting("tls", False, flag, "encrypt the traffic between jobs with TLS keyed by the run's key"),
    Setting("share_machine", True, flag,
            "jobs on their creator's machine map its Value, Array and locks and link its queues "
            "and pipes over Unix sockets (off: through its hub, as jobs on other machines do)"),
    Setting("portable_sync", False, flag,
            "shared-memory locks, semaphores and events use POSIX semaphores (the portable "
            "path of platforms without the C extension) even where the C extension is built"),
    Setting("peer_timeout", 10.0, seconds_or_never,
            "seconds a connection's other end may stay silent (a machine gone, a network cut, a "
            "frozen process) before it is given up: a job then exits, a parent treats the job as "
            "lost and kills it (0: never)"),
    Setting("dashboard", None, parse_address,
            "serve the run's live page at host:port (a port alone: on loopback; 0: any free port; "
            "off: none)"),
    Setting("auth_timeout", 10.0, seconds,
            "seconds a connection may take to prove it holds the run's key before it is closed"),
    Setting("auth_pending_limit", 256, positive_count,
            "connections that have not yet proved the key kept open at once, per listening socket"),
)

# settings that describe one job and are not handed down to its children
_PER_JOB = ("listen_host", "dashboard")

_lock = threading.RLock()  # a backend's package, imported for its settings, may read settings
_table: dict[str, Setting] | None = None  # every setting known: CORE and the backends'
_table_has_plugins = False  # the entry points' backends were asked for their settings
_overrides: dict[str, Any] = {}
_inherited: dict[str, Any] | None = None
_resolved: dict[str, Any] | None = None
_applied_level: str | None = None  # the log_level last given to fiberlite's logger


#: settings that were renamed: old name -> new name
RENAMED = {"parent_timeout": "peer_timeout"}


def _collect(plugins: bool) -> dict[str, Setting]:
    table = {s.name: s for s in CORE}
    for backend, declared in declared_settings(plugins):
        for setting in declared:
            if not isinstance(setting, Setting):
                raise ConfigError(f"the backend {backend!r} declares {setting!r} as a setting: "
                                  "its SETTINGS must hold fiberlite.config.Setting objects")
            if setting.name in table or setting.name in RENAMED:
                raise ConfigError(f"the backend {backend!r} declares the setting {setting.name!r}, "
                                  "which another part of fiberlite already has: rename it")
            table[setting.name] = setting
    return table


def known_settings(plugins: bool = False) -> dict[str, Setting]:
    """Every setting known: fiberlite's own and the built-in backends' (and, with
    ``plugins`` or once they were read, the entry points' backends'), by name."""
    global _table, _table_has_plugins
    with _lock:
        if _table is None or (plugins and not _table_has_plugins):
            wanted = plugins or _table_has_plugins
            _table, _table_has_plugins = _collect(wanted), wanted
        return _table


def _setting(name: str) -> Setting | None:
    """The setting ``name``; a name not built in makes the entry points' backends declare theirs."""
    return known_settings().get(name) or known_settings(plugins=True).get(name)


def __getattr__(name: str) -> Any:
    if name == "SETTINGS":  # every setting known now (see known_settings)
        return known_settings()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def _unknown(name: str, source: str = "") -> ConfigError:
    where = f" ({source})" if source else ""
    if name in RENAMED:
        return ConfigError(f"the setting {name!r}{where} is now {RENAMED[name]!r} (it covers both "
                           "sides of every connection): use that name")
    known = ", ".join(known_settings(plugins=True))
    return ConfigError(f"unknown setting {name!r}{where}; known settings: {known}")


def _check(name: str, value: Any, source: str) -> Any:
    setting = _setting(name)
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
    table = known_settings()
    values = {name: s.default for name, s in table.items()}
    if _inherited is not None:
        values.update(_inherited)
    else:
        path = config_file()
        if path:
            values.update(_read_file(path))
    for name, setting in table.items():
        env = os.environ.get(setting.env)
        if env is not None and env != "":
            values[name] = _check(name, env, f"environment variable {setting.env}")
    values.update(_overrides)
    if values["backend"] not in BUILTIN and not _table_has_plugins:
        known_settings(plugins=True)  # a plugin backend: its settings too
        return _resolve()
    return values


def settings() -> dict[str, Any]:
    """The resolved settings of this process (a copy)."""
    global _resolved
    with _lock:
        if _resolved is None:
            _resolved = _resolve()
            _apply_log_level(_resolved["log_level"])
        return dict(_resolved)


def _apply_log_level(name: str) -> None:
    """Give fiberlite's logger the ``log_level`` setting when it is first read, unless
    code set the logger's level before (``log_to_stderr(DEBUG)``), and whenever it
    changes. Reading the settings again never undoes a level set in code."""
    global _applied_level
    logger = logging.getLogger("fiberlite")
    if name != _applied_level and (_applied_level is not None or logger.level == logging.NOTSET):
        logger.setLevel(name)
    _applied_level = name


def get(name: str) -> Any:
    global _resolved
    if _setting(name) is None:
        raise _unknown(name)
    values = settings()
    if name not in values:  # declared by a plugin backend read since the last resolution
        with _lock:
            _resolved = None
        values = settings()
    return values[name]


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
        _inherited = {k: v for k, v in values.items() if k not in _PER_JOB and _setting(k) is not None}
        _overrides.clear()
        _resolved = None
