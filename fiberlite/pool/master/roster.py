"""The pool's workers as its dispatcher counts them: started, ready, leaving, gone, and
how many in a row ended before asking for work.

:class:`Roster` has no lock of its own: the dispatcher (:mod:`.dispatch`) calls it under
its lock. A worker is *ready* once it asked for work (its initializer ran), *leaving*
when the pool shrinks without it, *gone* once its job ended or its connection dropped.
"""
from __future__ import annotations

from .records import Worker

# workers in a row that end before asking for work, after which the pool is broken:
START_FAILURES = 3  # ... exiting on their own (initializer raised, exit code, import error)
START_KILLS = 10  # ... killed by a signal (someone else may be killing them)


class Roster:
    """The workers of one pool, by id and by connection."""

    def __init__(self) -> None:
        self.workers: dict[int, Worker] = {}
        self.by_peer: dict[int, Worker] = {}
        self.n_ready = 0
        self.leaving = 0  # workers marked leaving and not yet gone
        self.start_failures = self.start_kills = 0
        self.last_failure = ""

    def add(self, wid: int, hosted: bool = False) -> None:
        self.workers[wid] = Worker(wid, hosted)

    def add_below(self, wid: int, wanted: int, hosted: bool = False) -> bool:
        """Add worker ``wid`` if fewer than ``wanted`` workers stay (see :meth:`staying`)."""
        if self.staying() >= wanted:
            return False
        self.add(wid, hosted)
        return True

    def pop(self, wid: int) -> Worker | None:
        """Forget worker ``wid`` (its job ended, or could not be created)."""
        worker = self.workers.pop(wid, None)
        if worker is not None:
            if worker.leaving:
                self.leaving -= 1
            for peer in worker.peers:
                if self.by_peer.get(peer) is worker:
                    del self.by_peer[peer]
        return worker

    def staying(self) -> int:
        """Workers started or starting that the pool keeps (not leaving)."""
        return len(self.workers) - self.leaving

    def asking(self, wid: int, peer: int) -> Worker | None:
        """Worker ``wid`` asks for work or sends results over connection ``peer``: ready
        from now on; None if it is unknown or gone."""
        worker = self.bind(wid, peer)
        if worker is None:
            return None
        if not worker.ready:
            worker.ready = True
            self.n_ready += 1
            self.start_failures = self.start_kills = 0
        return worker

    def bind(self, wid: int, peer: int) -> Worker | None:
        """Worker ``wid`` is reached over connection ``peer`` (a worker of the master's
        machine has two: its hub connection and the nearby socket), so that the loss of
        either is the worker's; None if it is unknown or gone."""
        worker = self.workers.get(wid)
        if worker is None or worker.gone:
            return None
        if peer not in worker.peers:
            worker.peers.append(peer)
            self.by_peer[peer] = worker
        return worker

    def ever_ready(self, wid: int) -> bool:
        """Whether worker ``wid`` asked for work once (False once it is forgotten)."""
        worker = self.workers.get(wid)
        return worker is not None and worker.ready

    def choose_leaving(self, count: int) -> list[Worker]:
        """Mark ``count`` workers leaving: those that never asked for work first, then
        idle ones, then those holding least."""
        candidates = [w for w in self.workers.values()
                      if not (w.gone or w.leaving or w.retiring)]
        candidates.sort(key=lambda w: (w.ready, w.waiting is None, len(w.held)))
        chosen = candidates[:max(0, count)]
        for worker in chosen:
            worker.leaving = True
            self.leaving += 1
        return chosen

    def start_failed(self, reason: str, killed: bool = False) -> bool:
        """A worker ended before asking for work (``killed``: by a signal); whether the
        pool is broken now (too many in a row, none ever ready)."""
        if killed:
            self.start_kills += 1
        else:
            self.start_failures += 1
        self.last_failure = reason
        return self.n_ready == 0 and (self.start_failures >= START_FAILURES
                                      or self.start_kills >= START_KILLS)

    def failed_starts(self) -> str:
        """Why the pool broke, when workers could not start."""
        return (f"the pool's workers cannot start: "
                f"{self.start_failures + self.start_kills} in a row ended before asking for "
                f"work; the last one: {self.last_failure.rstrip()}")

    def gone(self, worker: Worker) -> bool:
        """``worker`` is gone (False if it was already)."""
        if worker.gone:
            return False
        worker.gone = True
        worker.waiting = None
        worker.suspect = None
        if worker.ready:
            self.n_ready -= 1
        return True
