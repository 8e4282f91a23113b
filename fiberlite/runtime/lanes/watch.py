"""One reader of a lane watches it; the other waiting readers sleep until they are needed.

When every reader of a lane waits in the kernel, each message wakes one of them, the one
that slept longest (the kernel's queue of exclusive waiters is first in, first out): with
many readers and a writer they keep up with, every message costs a process switch, and
on a machine of few CPUs those switches are the cost of the whole pattern. So a reader
that finds the lane empty first tries to become its *watcher* (a lock, taken without
waiting); the watcher alone waits on the lane (looking awake first), the others sleep on
a word of the queue's shared memory. A writer that sends while nobody watches and some
reader sleeps wakes one sleeper; so does a watcher that leaves with messages behind it.
A reader that comes back finds what is in the lane first, so a reader that keeps up takes
message after message without sleeping, as ``multiprocessing``'s readers do under their
queue's read lock.

The watch decides only where readers wait, never who may read: every reader reads the
lane itself, so a message is never lost or taken twice whatever the watch's state. A
watcher killed while it watches leaves the lock held until its creator gives it back;
meanwhile the sleepers look at the lane every :data:`SLICE`.
"""
from __future__ import annotations

import time
from typing import Any, Callable

SLICE = 0.02  # a sleeper looks at the lane (and at Ctrl-C) at least this often


class Watch:
    """The watch of one lane as this process uses it: ``role`` (a shared lock whose
    ``acquire(False)`` and ``owner()`` are those of
    :class:`~fiberlite.runtime.shm.sync.Mutex`), and the addresses of two words of shared
    memory: how many readers sleep, and the word they sleep on."""

    __slots__ = ("role", "sleepers", "signal", "_words", "_load")

    def __init__(self, role: Any, sleepers: int, signal: int, words: Any) -> None:
        self.role = role
        self.sleepers = sleepers
        self.signal = signal
        self._words = words  # (load, add, wait, wake) on addresses: runtime.shm.sync's
        self._load = words[0]

    def sent(self) -> None:
        """After a send: wake a sleeper when nobody watches the lane."""
        if self._load(self.sleepers) and not self.role.owner():
            _, add, _, wake = self._words
            add(self.signal, 1)
            wake(self.signal, 1)

    def receive(self, lane: Any, timeout: float | None, wake: Callable[[], bool] | None) -> Any:
        """:meth:`.lane.Lane.receive` once the lane was found empty: as its watcher, or
        asleep until a message may be there for this reader."""
        deadline = None if timeout is None else time.monotonic() + timeout
        role = self.role
        load, add, wait, _ = self._words
        while True:
            left = None if deadline is None else deadline - time.monotonic()
            if role.acquire(False):
                try:
                    return lane.watch_wait(left, wake)
                finally:
                    role.release()
                    self._pass_on(lane)
            if left is not None and left <= 0:
                return None
            seq = load(self.signal)
            add(self.sleepers, 1)
            try:
                got = lane.take_now()
                if got is None and role.owner():  # (else the watch came free: take it)
                    wait(self.signal, seq, SLICE if left is None else min(SLICE, left))
                    got = lane.take_now()
            finally:
                add(self.sleepers, -1)
            if got is not None:  # woken for it: wake the next sleeper if more wait
                self._pass_on(lane)
                return got
            if wake is not None and wake():
                return None

    def _pass_on(self, lane: Any) -> None:
        """A watcher left: if messages wait and readers sleep, wake one of them."""
        load, add, _, wake = self._words
        if load(self.sleepers) and lane.readable_now():
            add(self.signal, 1)
            wake(self.signal, 1)
