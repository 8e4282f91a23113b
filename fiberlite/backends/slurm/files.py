"""The files a Slurm job has on the shared filesystem: its output file (Slurm writes
it; this process copies what is new to its own stdout) and its key file (read and
removed by the job), in one private directory per run under the ``slurm_dir`` setting."""
from __future__ import annotations

import os
import shutil
import sys
import threading
from pathlib import Path

from ..base import encode_secrets

KEEP = 1 << 20  # bytes of a job's output :func:`tail` returns
_write_lock = threading.Lock()


def base_dir(setting: str | None) -> Path:
    """Where runs' files go: the ``slurm_dir`` setting, else ``~/.local/state/fiberlite/slurm``."""
    if setting:
        return Path(setting).expanduser()
    state = os.environ.get("XDG_STATE_HOME") or os.path.join(os.path.expanduser("~"), ".local", "state")
    return Path(state) / "fiberlite" / "slurm"


def run_dir(setting: str | None, run_id: str) -> Path:
    """The run's directory, made readable by this user only (0700): the key files are in it."""
    directory = base_dir(setting) / run_id
    directory.mkdir(mode=0o700, parents=True, exist_ok=True)
    directory.chmod(0o700)
    return directory


def write_key_file(path: Path, secret_env: dict[str, str]) -> None:
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW, 0o600)
    with os.fdopen(fd, "wb") as fh:
        fh.write(encode_secrets(secret_env))


def remove(*paths: Path | None) -> None:
    for path in paths:
        if path is not None:
            try:
                path.unlink()
            except OSError:
                pass


def remove_if_empty(directory: Path) -> None:
    try:
        directory.rmdir()
    except OSError:
        pass


def remove_run_dirs(setting: str | None, run_ids: list[str]) -> None:
    for run_id in run_ids:
        if run_id and "/" not in run_id and run_id not in (".", ".."):
            shutil.rmtree(base_dir(setting) / run_id, ignore_errors=True)


def read_from(path: Path, offset: int) -> bytes:
    """What ``path`` holds past ``offset`` (nothing when it does not exist yet)."""
    try:
        if os.stat(path).st_size <= offset:
            return b""
        with open(path, "rb") as fh:
            fh.seek(offset)
            return fh.read()
    except OSError:
        return b""


def tail(path: Path) -> str:
    try:
        size = os.stat(path).st_size
    except OSError:
        return ""
    return read_from(path, max(0, size - KEEP)).decode(errors="replace")


def echo(data: bytes) -> None:
    """Write a job's output to this process's stdout, as a local child shares it."""
    out = sys.stdout
    if out is None or not data:
        return
    with _write_lock:
        try:
            buffer = getattr(out, "buffer", None)
            if buffer is not None:
                out.flush()
                buffer.write(data)
                buffer.flush()
            else:
                out.write(data.decode(errors="replace"))
                out.flush()
        except (OSError, ValueError):
            pass  # closed at exit, or a broken pipe: the job goes on
