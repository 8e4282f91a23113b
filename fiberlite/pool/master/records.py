"""What the pool's dispatcher keeps: its calls (:class:`Group`), their chunks
(:class:`Chunk`), its workers (:class:`Worker`), and what leaves once its lock is let go
(:class:`Out`). Plain records, changed only under the dispatcher's lock.
"""
from __future__ import annotations

from typing import Any

RUN, CLOSE, TERMINATE, BROKEN = "RUN", "CLOSE", "TERMINATE", "BROKEN"
# how a delivered chunk carries its outcome (see Dispatcher.op_next)
VALUE, REMOTE_ERROR, LOCAL_ERROR = 0, 1, 2


class Group:
    """One call (``map``, ``imap``, ``apply_async``...): its pickled function and its sink."""

    __slots__ = ("gid", "kind", "payload", "name", "sink", "outstanding", "sealed", "workers")

    def __init__(self, gid: int, kind: str, payload: Any, name: str, sink: Any) -> None:
        self.gid = gid
        self.kind = kind  # "map", "star" or "apply" (see fiberlite.pool.chunks)
        self.payload = payload  # Payload of (kind, func)
        self.name = name
        self.sink = sink
        self.outstanding = 0  # chunks submitted and not finished
        self.sealed = False  # no more chunks will be submitted
        self.workers: list[Worker] = []  # workers that were sent the function


class Chunk:
    """Consecutive items of one call, pickled once when submitted."""

    __slots__ = ("cid", "group", "start", "count", "data", "tries", "causes")

    def __init__(self, cid: int, group: Group, start: int, count: int, data: Any) -> None:
        self.cid = cid
        self.group = group
        self.start = start
        self.count = count
        self.data = data  # pickled list of items ((args, kwds) for apply)
        self.tries = 0  # workers that died holding it
        self.causes: tuple[str, ...] = ()  # how those workers died

    def size(self) -> int:
        data = self.data
        return len(data) if type(data) is bytes else data.nbytes()


def order(chunk: Chunk) -> tuple[int, int]:
    """Chunks in the order of their calls and positions."""
    return chunk.group.gid, chunk.start


class Worker:
    """The master's record of one worker job."""

    __slots__ = ("wid", "hosted", "peers", "ready", "gone", "retiring", "leaving", "held",
                 "groups", "forget", "waiting", "want", "suspect", "init_error")

    def __init__(self, wid: int, hosted: bool = False) -> None:
        self.wid = wid
        self.hosted = hosted  # forked in a host, which reports how it ended
        self.peers: list[int] = []  # its connections: the hub's, the nearby socket's
        self.ready = False  # it asked for work (its initializer succeeded)
        self.gone = False
        self.retiring = False  # it was told to exit: what it still holds is no crash
        self.leaving = False  # the pool shrinks without it: told to exit when it next asks
        self.held: dict[int, Chunk] = {}
        self.groups: set[int] = set()  # functions it has
        self.forget: list[int] = []  # functions it may drop
        self.waiting: Any = None  # its parked request for work
        self.want = 1
        self.suspect: int | None = None  # a chunk that crashed a worker before, run alone
        self.init_error: str | None = None


class Out:
    """Replies and deliveries gathered under the lock, sent after releasing it."""

    __slots__ = ("replies", "results")

    def __init__(self) -> None:
        self.replies: list[tuple[Any, Any]] = []
        self.results: list[tuple[Any, list]] = []

    def reply(self, request: Any, value: Any) -> None:
        self.replies.append((request, value))

    def exit(self, worker: Worker) -> None:
        """Tell ``worker``, waiting for work, to exit."""
        worker.retiring = True
        self.replies.append((worker.waiting, None))
        worker.waiting = None
