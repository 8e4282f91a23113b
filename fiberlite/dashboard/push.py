"""Open pages that follow the run (``/api/events``, server-sent events): the monitor's
thread writes each change of the page's data to every one of them, so that an open
page costs neither a request nor a thread waking up of its own per update.

A follower gets the page's data with the charts' history when it starts following;
after that, on each change, the data without the charts and the points the charts
gained since the last message (``points``), or their whole history again if it
missed a round of points. In between, while calls run, it gets only what they
changed (``progress``: :func:`.snapshot.progress`), which the page merges into the
last whole data.
"""
from __future__ import annotations

import threading
from typing import Any, Callable

import orjson


def encode(data: Any) -> bytes:
    """``data`` as compact JSON (what it cannot encode as its text; a number that
    JSON has not, such as infinity, as null)."""
    return orjson.dumps(data, default=str, option=orjson.OPT_NON_STR_KEYS)


class Follower:
    """One open page: messages go to its connection; a failed write ends it."""

    def __init__(self, write: Callable[[bytes], None], ticks: int) -> None:
        self._write = write
        self.ticks = ticks  # the last round of chart points it has
        self.ended = threading.Event()

    def send(self, message: bytes) -> None:
        try:
            self._write(b"data: " + message + b"\n\n")
        except OSError:  # the page was closed, or reads nothing any more
            self.ended.set()


class Followers:
    """The open pages, and what was last sent to them."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._followers: list[Follower] = []
        self._last: dict | None = None
        self._last_progress: dict | None = None

    def __bool__(self) -> bool:
        return bool(self._followers)

    def add(self, follower: Follower) -> None:
        with self._lock:
            self._followers.append(follower)

    def push(self, state: dict, ticks: int, points: dict,
             history: Callable[[], dict]) -> None:
        """Send ``state`` (the page's data without the charts, taken after round
        ``ticks`` of chart points, which added ``points``) to the followers that do not
        have it yet; ``history()`` gives the charts whole."""
        followers = self._live()
        stamp = state.pop("time")
        changed = state != self._last
        self._last = state
        if changed:
            self._last_progress = None
        messages: dict[str, bytes] = {}
        for follower in followers:
            if follower.ticks == ticks:
                kind = "same" if changed else None
            else:
                kind = "points" if follower.ticks == ticks - 1 else "charts"
            if kind is None:
                continue
            if kind not in messages:
                extra = {"points": points} if kind == "points" else (
                    {"charts": history()} if kind == "charts" else {})
                messages[kind] = encode({**state, "time": stamp, **extra})
            follower.send(messages[kind])
            follower.ticks = ticks

    def push_progress(self, progress: dict) -> None:
        """Send ``progress`` (:func:`.snapshot.progress`) to the followers if it changed
        since the last message."""
        stamp = progress.pop("time")
        if progress == self._last_progress:
            return
        self._last_progress = progress
        message = encode({"time": stamp, "progress": progress})
        for follower in self._live():
            follower.send(message)

    def _live(self) -> list[Follower]:
        """The followers still open (the ended ones are let go)."""
        with self._lock:
            self._followers = [f for f in self._followers if not f.ended.is_set()]
            return list(self._followers)

    def end_all(self) -> None:
        with self._lock:
            followers, self._followers = self._followers, []
        for follower in followers:
            follower.ended.set()
