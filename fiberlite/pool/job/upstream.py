"""How a pool worker talks to the master: over its own hub connection (a worker that is
a job of its own), or through the host job it was forked in (:mod:`.host`).

Both give the worker the same calls: ``begin`` sends a request and returns a handle,
``finish`` waits for that request's answer (returning it, or raising the master's
error), ``cast`` sends without an answer, ``call`` is ``finish(begin(...))``.
"""
from __future__ import annotations

import itertools
import pickle
import threading
from typing import Any

from ...errors import ConnectionLost
from ...wire.codec import PROTOCOL


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
    """Requests to the host over a socket of this process's own (``Connection``).

    Messages are ``(seq, method, args)`` up (``seq`` 0: no answer wanted) and
    ``(seq, ok, value)`` down. Two threads may wait at once (the worker's main thread and
    its watchdog): whichever reads the socket files the answers it finds for the other.
    """

    def __init__(self, conn: Any) -> None:
        self.conn = conn
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
            raise ConnectionLost(f"the pool's host is gone: {exc}") from None

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
                    raise ConnectionLost(f"the pool's host is gone: {self._lost}")
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
