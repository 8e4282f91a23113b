"""Starts ``live_run.py`` and talks to it: its page's address, commands, answers."""
from __future__ import annotations

import json
import re
import subprocess
import threading
import urllib.request
from pathlib import Path
from interpreters import start_python

SCRIPT = Path(__file__).with_name("live_run.py")


class LiveRun:
    """The live run in a child process; ``url`` is its page."""

    def __init__(self, timeout: float = 60, page_from_environment: bool = False) -> None:
        """``page_from_environment``: the page is asked for by ``FIBERLITE_DASHBOARD`` and
        started by the run's first object (else by ``fiberlite.init`` first thing)."""
        env = {"PYTHONUNBUFFERED": "1",
               "FIBERLITE_DASHBOARD": "127.0.0.1:0" if page_from_environment else None}
        self.proc = start_python(SCRIPT, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                 stderr=subprocess.PIPE, env=env)
        self.stderr: list[str] = []
        self._more_stderr = threading.Condition()
        found = threading.Event()
        self.url = ""

        def read_stderr() -> None:
            for line in self.proc.stderr:
                with self._more_stderr:
                    self.stderr.append(line)
                    self._more_stderr.notify_all()
                match = re.search(r"dashboard at (http://\S+)", line)
                if match and not found.is_set():
                    self.url = match.group(1)
                    found.set()
            found.set()
        threading.Thread(target=read_stderr, daemon=True).start()
        assert found.wait(timeout) and self.url, f"no address printed: {''.join(self.stderr)}"
        assert self.answer() == "ready"

    def answer(self) -> str:
        """The next answer line (the per-test timeout bounds the wait)."""
        line = self.proc.stdout.readline()
        assert line, f"the run ended: {''.join(self.stderr)}"
        return line.strip()

    def stderr_lines(self, prefix: str, count: int, timeout: float = 30) -> list[str]:
        """The run's stderr lines that start with ``prefix``, once there are ``count``."""
        def found() -> list[str]:
            return [line.rstrip("\n") for line in self.stderr if line.startswith(prefix)]
        with self._more_stderr:
            self._more_stderr.wait_for(lambda: len(found()) >= count, timeout)
            return found()

    def send(self, command: str) -> None:
        self.proc.stdin.write(command + "\n")
        self.proc.stdin.flush()

    def ask(self, command: str) -> str:
        self.send(command)
        return self.answer()

    def get(self, path: str) -> dict:
        with urllib.request.urlopen(self.url + path, timeout=10) as reply:
            return json.load(reply)

    def close(self) -> int:
        if self.proc.poll() is None:
            try:
                self.send("quit")
            except OSError:
                pass
        try:
            return self.proc.wait(30)
        finally:
            if self.proc.poll() is None:
                self.proc.kill()
                self.proc.wait()


def read(url: str) -> dict:
    """The JSON at ``url`` (a page's ``api/...``)."""
    with urllib.request.urlopen(url, timeout=10) as reply:
        return json.load(reply)


def merged(latest: dict | None, message: dict) -> dict | None:
    """The page's data after ``message`` from ``api/events``, merged as the page's script
    merges it: a whole state replaces ``latest``; a message of counts alone (``progress``)
    updates the pools' counts and their calls' rows in it."""
    if "progress" not in message:
        return message
    if latest is None:
        return None
    progress = message["progress"]
    pools = []
    for pool in latest["pools"]:
        now = progress["pools"].get(pool["name"])
        if now is not None:
            rows = {row["id"]: row for row in now["batches"]}
            known = {row["id"] for row in pool["batches"]}
            fresh = [row for row in now["batches"] if row["id"] not in known]
            pool = {**pool, "done": now["done"],
                    "batches": fresh + [rows.get(row["id"], row) for row in pool["batches"]]}
        pools.append(pool)
    return {**latest, "pools": pools, "tasks_done": progress["tasks_done"],
            "time": message["time"]}


class Events:
    """``api/events`` of a page, read message by message."""

    def __init__(self, url: str) -> None:
        self._stream = urllib.request.urlopen(url + "api/events", timeout=30)
        self.state: dict | None = None  # the page's data, merged so far

    def next(self) -> dict:
        """The next message (and :attr:`state` merged with it)."""
        for line in self._stream:
            if line.startswith(b"data: "):
                message = json.loads(line[6:])
                self.state = merged(self.state, message)
                return message
        raise AssertionError("the stream ended")

    def close(self) -> None:
        self._stream.close()
