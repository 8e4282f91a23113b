"""How a pool worker talks to the master: over its own hub connection (a worker that is
a job of its own on another machine), over a Unix socket to the master (a job of its
own on the master's machine: :mod:`..master.nearby`), or through the host job it was
forked in (:mod:`.host`).

Both give the worker the same calls: ``begin`` sends a request and returns a handle,
``finish`` waits for that request's answer (returning it, or raising the master's
error), ``cast`` sends without an answer, ``call`` is ``finish(begin(...))``.
"""
from __future__ import annotations

import itertools
import pickle
import threading
import time
from typing import Any

from ... import config
from ...errors import AuthenticationError, ConnectionLost
from ...runtime import identity
from ...runtime.machine import machine_id
from ...wire import auth, unix
from ...wire.codec import PROTOCOL
from ...wire.frames import FrameSocket, widen

HANDSHAKE_TIMEOUT = 10.0  # seconds a nearby worker gives the master to take its connection


def dump_message(message: Any) -> bytes:
    """One message between a host and its worker, as it travels. Pickle protocol 5:
    payloads of large arrays and bytes (pickle buffers) travel in band. The host passes
    these frames on as they are: the master loads a worker's requests and dumps its
    answers (:func:`dump_answer`)."""
    return pickle.dumps(message, PROTOCOL)


def load_message(frame: bytes) -> Any:
    return pickle.loads(frame)


def dump_answer(seq: int, ok: bool, value: Any) -> bytes:
    """The frame of the answer to a worker's request ``seq``; an answer that cannot be
    pickled is an error for the worker instead (it is never left waiting)."""
    try:
        return pickle.dumps((seq, ok, value), PROTOCOL)
    except Exception as exc:
        return pickle.dumps((seq, False, RuntimeError(f"the pool's answer could not be pickled: "
                                                      f"{exc!r}")), PROTOCOL)


def send_message(conn: Any, message: Any) -> None:
    conn.send_bytes(dump_message(message))


def receive_message(conn: Any) -> Any:
    return load_message(conn.recv_bytes())


class HubUpstream:
    """Requests to the master's dispatcher over this job's connection to its hub."""

    direct = False  # (see NearbyUpstream.direct)

    def __init__(self, ref: Any) -> None:
        self.ref = ref
        self._client: Any = None

    def __getstate__(self) -> dict:
        return {"ref": self.ref, "_client": None}

    def _connection(self) -> Any:
        if self._client is None:
            from ...runtime.dialed import connect
            self._client = connect(self.ref.address)
        return self._client

    def begin(self, method: str, *args: Any) -> Any:
        return self._connection().begin((self.ref.oid, method, args))

    def finish(self, handle: Any) -> Any:
        ok, value = self._connection().finish(handle)
        if ok:
            return value
        raise value

    def cast(self, method: str, *args: Any) -> None:
        self.ref.cast(method, *args)

    def call(self, method: str, *args: Any) -> Any:
        return self.ref.call(method, *args)


class HostUpstream:
    """Requests to the host (or the master) over a socket of this process's own
    (``FrameSocket``).

    Messages are ``(seq, method, args)`` up (``seq`` 0: no answer wanted) and
    ``(seq, ok, value)`` down. Two threads may wait at once (the worker's main thread and
    its watchdog): whichever reads the socket files the answers it finds for the other.
    """

    direct = False  # (see NearbyUpstream.direct)

    def __init__(self, conn: Any, peer: str = "the pool's host") -> None:
        self.conn = conn
        self.peer = peer
        self._seq = itertools.count(1)
        self._send_lock = threading.Lock()
        self._cond = threading.Condition()
        self._answers: dict[int, tuple[bool, Any]] = {}
        self._reading = False
        self._lost: BaseException | None = None
        self.lost = threading.Event()  # set once the host is gone

    def _send(self, message: tuple) -> None:
        try:
            with self._send_lock:
                send_message(self.conn, message)
        except (OSError, EOFError) as exc:
            self.lost.set()
            raise ConnectionLost(f"{self.peer} is gone: {exc}") from None

    def begin(self, method: str, *args: Any) -> int:
        seq = next(self._seq)
        self._send((seq, method, args))
        return seq

    def cast(self, method: str, *args: Any) -> None:
        self._send((0, method, args))

    def finish(self, seq: int) -> Any:
        cond = self._cond
        with cond:
            while seq not in self._answers:
                if self._lost is not None:
                    raise ConnectionLost(f"{self.peer} is gone: {self._lost}")
                if self._reading:
                    cond.wait()
                    continue
                self._reading = True
                cond.release()
                try:
                    answer = receive_message(self.conn)
                except (OSError, EOFError) as exc:
                    answer = None
                    self._lost = exc or EOFError("end of stream")
                    self.lost.set()
                finally:
                    cond.acquire()
                    self._reading = False
                    cond.notify_all()
                if answer is not None:
                    self._answers[answer[0]] = answer[1:]
            ok, value = self._answers.pop(seq)
        if ok:
            return value
        raise value

    def call(self, method: str, *args: Any) -> Any:
        return self.finish(self.begin(method, *args))


class NearbyUpstream:
    """Requests to the master's dispatcher from a worker of the master's machine.

    Once the worker is idle for the first time (its first request that waits for
    work), it dials a Unix socket of the master (:mod:`..master.nearby`) if it shares
    the master's machine (same kernel and network namespace, and the ``share_machine``
    setting on); the socket is used only once this process proved the run's key on it.
    From then on a worker forked in a host sends every request over that socket:
    requests for work, those sent ahead, results sent one-way and give-backs, each one
    system call each way, read and written by the threads that make them. A worker that
    is a job of its own sends only its requests that wait for work there: what it sends
    while it works keeps its hub connection, which the hub closes when it gives the job
    up as silent, so that nothing a frozen job sends once it comes back is taken (it
    also presents that connection, so that its loss loses the worker). Before, and where
    there is no such socket, requests go the ``other`` way: the hub connection
    (:class:`HubUpstream`), or the host (:class:`HostUpstream`), where nng's threads and
    the host's add hops of their own; a host reports the end of its workers itself.

    The ways keep the order the dispatcher needs: a worker sends a request that waits
    for work only once every earlier request for work was answered, and nothing else
    while it waits."""

    def __init__(self, other: Any, address: str | None, machine: str,
                 presents: bool = True) -> None:
        self.other = other  # the hub's way (HubUpstream) or the host's (HostUpstream)
        self.address = address  # the master's abstract socket name, None: none listens
        self.machine = machine  # the master's machine_id
        self.presents = presents  # a job of its own: its hub connection is the worker's too
        self._way: Any = None
        self._choosing = threading.Lock()

    @property
    def ref(self) -> Any:
        """The dispatcher's reference in the master's hub (its hub's way)."""
        return self.other.ref

    @property
    def direct(self) -> bool:
        """Whether requests go over the master's socket, where one more message costs the
        master little (a host's posts carry many workers' messages at once)."""
        return self._way is not None and self._way is not self.other

    def __getstate__(self) -> dict:
        return {"other": self.other, "address": self.address, "machine": self.machine,
                "presents": self.presents}

    def __setstate__(self, state: dict) -> None:
        self.__init__(state["other"], state["address"], state["machine"], state["presents"])

    def _chosen(self) -> Any:
        way = self._way
        if way is None:
            with self._choosing:
                if self._way is None:
                    self._way = self._dial() or self.other
                way = self._way
        return way

    def _dial(self) -> HostUpstream | None:
        if (self.address is None or not config.get("share_machine")
                or machine_id() != self.machine):
            return None
        deadline = time.monotonic() + HANDSHAKE_TIMEOUT
        try:
            sock = unix.connect_abstract(self.address, HANDSHAKE_TIMEOUT)
        except OSError:
            return None  # (another machine after all, or the master stopped listening)
        try:
            auth.prove_on(sock, identity.key(), "the pool's master", deadline)
            sock.settimeout(None)
            widen(sock)
        except (OSError, AuthenticationError):
            sock.close()
            return None  # (the master stopped listening, or did not take this connection)
        return HostUpstream(FrameSocket(sock.detach()), "the pool's master")

    def _way_of(self, method: str, args: tuple) -> Any:
        waits = method == "next" and not args[-1]  # (wid, entries, values, want, prefetch)
        if self._way is not None and (waits or not self.presents):
            return self._way
        if not waits:  # not idle yet (the socket is dialed by the first wait), or a job's
            return self.other  # own: what it sends while it works is fenced with its hub's
        way = self._chosen()
        if way is not self.other and self.presents:  # the hub's loss of this job is ours too
            self.other.cast("present", args[0])
        return way

    def begin(self, method: str, *args: Any) -> Any:
        way = self._way_of(method, args)
        return way, way.begin(method, *args)

    def finish(self, handle: Any) -> Any:
        way, inner = handle
        return way.finish(inner)

    def cast(self, method: str, *args: Any) -> None:
        (self.other if self._way is None or self.presents else self._way).cast(method, *args)

    def call(self, method: str, *args: Any) -> Any:
        return self.finish(self.begin(method, *args))
