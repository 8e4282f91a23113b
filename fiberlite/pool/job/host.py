"""A pool host: one job that runs many pool workers, forked from its template.

The master sees a host as one connection to its :class:`~..master.relay.HostRelay`, however
many workers the host runs; a worker sees its host as its master
(:class:`~.upstream.HostUpstream`), over a socket of its own. So the master pays per
message, not per worker, and each worker costs a fork (:mod:`.template`). A small pool's
workers on the master's machine send their requests to the master's socket for them
instead (:mod:`..master.nearby`), a hop shorter; the host still forks them, and reports
how each ended.

Three threads:

- the main thread waits on the workers' sockets and on the template; what it reads in
  one turn (workers' requests and results, workers started or ended) goes to the relay
  in one one-way ``post``;
- the post thread sends those batches as ``post`` calls, one at a time (what arrives
  while a post travels leaves with the next); the relay answers a post with everything
  that is ready for this host by then: the answers to workers' requests, which the
  post thread hands to each worker, and the relay's word on each worker that ended
  (``start`` a new one in its place, or ``retire`` the place);
- the answer thread keeps one ``poll`` request at the relay for what becomes ready
  between posts (work for idle workers when a new map comes, a worker's end), and
  hands it out the same way.

The host ends once every place is retired (the pool closed), or with its master.
"""
from __future__ import annotations

import os
import pickle
import selectors
import socket
import subprocess
import sys
import threading
from typing import Any

from ...process import current_process
from ...runtime import identity
from ...runtime.launcher import preparation
from ...runtime.limits import raise_open_file_limit
from ...wire import unix
from ...wire.codec import dumps_bytes
from ...wire.frames import FrameSocket
from ...wire.waking import WakingSelector
from . import early
from .template import JOB_MARK, MAX_MESSAGE


def host_main(relay: Any, hid: int, wids: list[int], initializer: Any, initargs: tuple,
              maxtasks: int | None, nearby: tuple[str, str] | None = None) -> None:
    """The target of a host job: run workers ``wids`` (and their replacements).
    ``nearby``: the master's socket for the workers of its machine, ``(name, machine
    id)``, which the workers use instead of this host where they share that machine."""
    raise_open_file_limit()  # a worker costs its host a descriptor
    Host(relay, hid, initializer, initargs, maxtasks, nearby).run(wids)


class Host:
    """One host job: its fork template, the sockets of its workers, and its two threads."""

    def __init__(self, relay: Any, hid: int, initializer: Any, initargs: tuple,
                 maxtasks: int | None, nearby: tuple[str, str] | None = None) -> None:
        self.relay = relay
        self.hid = hid
        me = current_process()
        self.init_message = dumps_bytes((initializer, initargs, maxtasks, me.name, os.getpid(),
                                         nearby))
        self.conns: dict[int, FrameSocket] = {}  # wid -> the worker's socket
        self.places = 0  # workers alive or asked for, and ended ones not yet decided on
        self.selector = WakingSelector()
        self.done = False
        self.outgoing: list = []  # what the workers sent, for the next post
        self.outgoing_ready = threading.Condition()
        self.control, self.template = self._start_template()
        self.selector.register(self.control, selectors.EVENT_READ, "template")
        self.control_lock = threading.Lock()

    # -- the template ---------------------------------------------------------------------
    def _start_template(self) -> tuple[socket.socket, Any]:
        forked = early.take()  # the job forked it as it started, beside this one
        if forked is None:
            forked = self._popen_template()
        ours, template = forked
        prep = preparation(current_process().name)
        # the environment as the host made it (a received working tree's, say): a template
        # forked as the job started has the job's first one
        ours.send(pickle.dumps(("prep", prep, identity.key(), identity.run_id(), dict(os.environ))))
        return ours, template

    def _popen_template(self) -> tuple[socket.socket, subprocess.Popen]:
        ours, theirs = unix.pair(unix.SEQPACKET)
        try:
            template = subprocess.Popen(
                [sys.executable, "-c", "from fiberlite.pool.job.template import main; main()",
                 str(theirs.fileno())],
                pass_fds=[theirs.fileno()], stdin=subprocess.DEVNULL,
                env=dict(os.environ, **{JOB_MARK: "template"}))  # imports as a job does
        finally:
            theirs.close()
        return ours, template

    def _fork(self, wid: int, replacing: bool = False) -> None:
        with self.control_lock:
            if not replacing:
                self.places += 1
            self.control.send(pickle.dumps(("fork", wid)))

    def _from_template(self, batch: list) -> None:
        try:
            data, fds = unix.recv_fds(self.control, MAX_MESSAGE, 1)
        except OSError:
            data, fds = b"", []
        if not data:
            raise RuntimeError("the pool host's fork template ended unexpectedly")
        message = pickle.loads(data)
        kind, wid = message[0], message[1]
        if kind == "forked":
            conn = FrameSocket(fds[0])
            try:
                conn.send_bytes(self.init_message)
            except OSError:
                conn.close()  # it died at once; its exit is reported next
                return
            self.conns[wid] = conn
            self.selector.register(conn, selectors.EVENT_READ, wid)
            batch.append((wid, 0, "started", (message[2],)))
        elif kind == "exited":
            self._drop(wid)
            batch.append((wid, 0, "exited", (message[2],)))
        else:  # failed
            batch.append((wid, 0, "fork_failed", (message[2],)))

    def _drop(self, wid: int) -> None:
        conn = self.conns.pop(wid, None)
        if conn is not None:
            try:
                self.selector.unregister(conn)
            except (KeyError, ValueError):
                pass
            conn.close()

    # -- the main thread: workers -> relay ----------------------------------------------------
    def run(self, wids: list[int]) -> None:
        threading.Thread(target=self._answers, args=(wids,), name="fiberlite-host-answers",
                         daemon=True).start()
        threading.Thread(target=self._posts, name="fiberlite-host-posts", daemon=True).start()
        try:
            while not self.done:
                batch: list = []
                ready, _ = self.selector.select()  # (woken: the loop looks at done)
                for key, _ in ready:
                    if key.data == "template":
                        self._from_template(batch)
                    else:
                        self._from_worker(key.data, key.fileobj, batch)
                if batch:
                    with self.outgoing_ready:
                        idle = not self.outgoing
                        self.outgoing += batch
                        if idle:
                            self.outgoing_ready.notify()
        finally:
            self.control.close()  # the template kills the workers still alive and ends
            self.template.wait()
            with self.outgoing_ready:
                self.outgoing_ready.notify()

    def _posts(self) -> None:
        """Posts what the workers sent, one post at a time: what arrives while a post is
        on its way leaves with the next one, so the busier the master, the fewer and
        fuller its posts."""
        ready = self.outgoing_ready
        while True:
            with ready:
                while not self.outgoing and not self.done:
                    ready.wait()
                if not self.outgoing:
                    return
                batch, self.outgoing = self.outgoing, []
            try:
                items = self.relay.call("post", self.hid, batch)
            except Exception:
                return  # the master is gone: the answer thread ends the host
            if items is None or self._take(items):
                return

    def _from_worker(self, wid: int, conn: FrameSocket, batch: list) -> None:
        try:
            frames = conn.read_frames()
        except (EOFError, OSError):
            self._drop(wid)  # it ended: the template reports how
            return
        for frame in frames:  # passed on as it came: the relay loads it
            batch.append((wid, frame))

    # -- the answer thread: relay -> workers ------------------------------------------------------
    def _answers(self, wids: list[int]) -> None:
        """The main thread always reads what the template writes: a full socket either
        way never blocks both ends at once."""
        try:
            for wid in wids:
                self._fork(wid)
            while not self.done:
                try:
                    items = self.relay.call("poll", self.hid)
                except Exception:
                    break  # the master is gone: end with it
                if items is None or self._take(items):
                    break
        finally:
            self.done = True
            self.selector.wake()

    def _take(self, items: list) -> bool:
        """Carry out what the relay answered (by the post or the answer thread); True
        once this host is to end (every place retired, or the template gone)."""
        try:
            for item in items:
                self._apply(item)
        except OSError as exc:  # the template is gone: this host cannot go on
            sys.stderr.write(f"fiberlite pool host: {exc}\n")
            self.places = 0
        if self.places == 0:
            self.done = True
            self.selector.wake()
            return True
        return False

    def _apply(self, item: tuple) -> None:
        kind = item[0]
        if kind == "reply":  # the answer's frame, as the relay made it
            _, wid, frame = item
            conn = self.conns.get(wid)
            if conn is None:
                return
            try:
                conn.send_bytes(frame)
            except OSError:
                pass  # it just ended
        elif kind == "start":
            self._fork(item[1], replacing=True)
        else:  # retire a place
            with self.control_lock:
                self.places -= 1
