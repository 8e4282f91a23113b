"""Logging helpers of ``multiprocessing.util``: fiberlite's logger and its levels.

``get_logger()`` is the ``fiberlite`` logger. The level it has (its effective level)
when a job starts is the level that job's logger starts with, as ``multiprocessing``
hands its logger's level to a spawned child. ``Finalize`` is the standard library's:
it runs in the process that made it, at its exit. A record logged through ``debug``,
``info``, ... names the caller's file and line, not this module's.
"""
from __future__ import annotations

import logging
from multiprocessing.util import Finalize, is_exiting

__all__ = ["NOTSET", "SUBDEBUG", "DEBUG", "INFO", "SUBWARNING", "WARNING", "ERROR",
           "CRITICAL", "LOGGER_NAME", "DEFAULT_LOGGING_FORMAT", "get_logger",
           "log_to_stderr", "sub_debug", "debug", "info", "sub_warning", "Finalize",
           "is_exiting"]

NOTSET = logging.NOTSET
SUBDEBUG = 5
DEBUG = logging.DEBUG
INFO = logging.INFO
SUBWARNING = 25
WARNING = logging.WARNING
ERROR = logging.ERROR
CRITICAL = logging.CRITICAL

LOGGER_NAME = "fiberlite"
DEFAULT_LOGGING_FORMAT = "[%(levelname)s/%(processName)s] %(message)s"

_stderr_handler: logging.Handler | None = None


def get_logger() -> logging.Logger:
    """The ``fiberlite`` logger (``multiprocessing.get_logger``)."""
    logging.addLevelName(SUBDEBUG, "SUBDEBUG")
    logging.addLevelName(SUBWARNING, "SUBWARNING")
    return logging.getLogger(LOGGER_NAME)


def log_to_stderr(level: int | str | None = None) -> logging.Logger:
    """Print the ``fiberlite`` logger's records on stderr (once, however often called)
    and set its level if given."""
    global _stderr_handler
    logger = get_logger()
    if _stderr_handler is None:
        _stderr_handler = logging.StreamHandler()
        _stderr_handler.setFormatter(logging.Formatter(DEFAULT_LOGGING_FORMAT))
        logger.addHandler(_stderr_handler)
    if level:
        logger.setLevel(level)
    return logger


def logs_to_stderr() -> bool:
    """Whether :func:`log_to_stderr` was called here (a job started now calls it too)."""
    return _stderr_handler is not None


def sub_debug(msg: str, *args: object) -> None:
    get_logger().log(SUBDEBUG, msg, *args, stacklevel=2)


def debug(msg: str, *args: object) -> None:
    get_logger().debug(msg, *args, stacklevel=2)


def info(msg: str, *args: object) -> None:
    get_logger().info(msg, *args, stacklevel=2)


def sub_warning(msg: str, *args: object) -> None:
    get_logger().log(SUBWARNING, msg, *args, stacklevel=2)
