"""What this process knows about its run: the run's key and id, and its place in the tree."""
from __future__ import annotations

import itertools
import json
import os
import secrets

from ..backends.base import SECRETS_FD_ENV, SECRETS_FILE_ENV

_KEY_ENV = "FIBERLITE_AUTHKEY"
_RUN_ENV = "FIBERLITE_RUN_ID"

_key: bytes | None = None
_run_id: str | None = None
child_counter = itertools.count(1)


def key() -> bytes:
    """The run's secret key: inherited from the parent job, else made here."""
    global _key
    if _key is None:
        value = os.environ.pop(_KEY_ENV, None)
        _key = bytes.fromhex(value) if value else secrets.token_bytes(32)
    return _key


def run_id() -> str:
    """A short id shared by every job of this run (used in labels and names)."""
    global _run_id
    if _run_id is None:
        _run_id = os.environ.get(_RUN_ENV) or secrets.token_hex(4)
        os.environ[_RUN_ENV] = _run_id
    return _run_id


def adopt(key_bytes: bytes, run: str) -> None:
    """Take the key and run id handed to a child job by its parent."""
    global _key, _run_id
    _key, _run_id = key_bytes, run
    os.environ[_RUN_ENV] = run


def reset_child_counter() -> None:
    global child_counter
    child_counter = itertools.count(1)


def key_env() -> dict[str, str]:
    """The secret environment a child job needs to join this run."""
    return {_KEY_ENV: key().hex()}


def take_key() -> bytes:
    """In a job: the run's key, taken from where its backend left it (a descriptor, a
    file, or the environment, see :func:`take_secrets`); ``KeyError`` or ``ValueError``
    when there is none."""
    return bytes.fromhex(take_secrets()[_KEY_ENV])


def take_secrets() -> dict[str, str]:
    """In a job: the secret environment its backend handed it, read once and removed
    from where it was: a pipe (local), a file in the container (Docker), the environment
    (Kubernetes, from a Secret). Nothing of it stays in ``os.environ``, which children
    inherit."""
    found: dict[str, str] = {}
    fd = os.environ.pop(SECRETS_FD_ENV, None)
    if fd is not None:
        with os.fdopen(int(fd), "rb") as pipe:
            found.update(json.loads(pipe.read()))
    path = os.environ.pop(SECRETS_FILE_ENV, None)
    if path is not None:
        with open(path, "rb") as fh:
            found.update(json.loads(fh.read()))
        try:
            os.unlink(path)
        except OSError:
            pass
    if _KEY_ENV in os.environ:
        found.setdefault(_KEY_ENV, os.environ.pop(_KEY_ENV))
    return found
