"""When an nng socket with contexts may be called, and when it is closed.

Two rules keep closing such a socket from hanging or crashing while other threads
send and receive on it:

- nng aborts the process when a socket is closed while a call is inside it, so every
  call is made between :meth:`SocketGuard.enter` and :meth:`SocketGuard.leave`, and
  the socket is closed by whichever comes last: :meth:`SocketGuard.close` or the
  last thread to leave.
- nng's socket close waits for every context of the socket, and a context that was
  opened after the others were aborted would be waited on for ever: opening one and
  beginning to close exclude each other, and a closing guard opens none.
"""
from __future__ import annotations

import threading
from typing import Callable, TypeVar

import pynng
from pynng._nng import lib

C = TypeVar("C", bound=pynng.Context)


class SocketGuard:
    """The calls under way on ``sock`` and its contexts; closes it when none is."""

    def __init__(self, sock: pynng.Socket) -> None:
        self._sock = sock
        self._lock = threading.Lock()
        self._busy = 0
        self.closing = False
        self._socket_closed = False
        self.contexts: list[pynng.Context] = []

    def enter(self) -> bool:
        """Begin a call into nng: False (make none) once closing has begun."""
        with self._lock:
            if self.closing:
                return False
            self._busy += 1
            return True

    def leave(self) -> None:
        """A call begun with :meth:`enter` is over."""
        with self._lock:
            self._busy -= 1
            last = self.closing and not self._busy and not self._socket_closed
            if last:
                self._socket_closed = True
        if last:
            self._close_socket()

    def open_context(self, make: Callable[[pynng.Socket], C]) -> C | None:
        """``make(sock)``, listed for closing; None once closing has begun."""
        with self._lock:
            if self.closing:
                return None
            ctx = make(self._sock)
            self.contexts.append(ctx)
            return ctx

    def discard(self, ctx: pynng.Context) -> None:
        """Close ``ctx`` and forget it."""
        with self._lock:
            if ctx in self.contexts:
                self.contexts.remove(ctx)
        close_context(ctx)

    def close(self) -> bool:
        """Abort every call under way on the contexts and close the socket now, or as
        soon as the last call inside nng returns; never waits. False if already closing."""
        with self._lock:
            if self.closing:
                return False
            self.closing = True
            contexts = list(self.contexts)
            last = not self._busy
            if last:
                self._socket_closed = True
        for ctx in contexts:  # aborts every send and receive under way on them
            abort_context(ctx)
        if last:
            self._close_socket()
        return True

    def _close_socket(self) -> None:
        with self._lock:
            contexts, self.contexts = self.contexts, []
        for ctx in contexts:
            close_context(ctx)
        try:
            self._sock.close()
        except Exception:
            pass


def abort_context(ctx: pynng.Context) -> None:
    """Close the nng context of ``ctx`` (what waits on it fails), leaving the Python
    object for its owner to close."""
    handle = ctx._context
    if handle is not None:
        lib.nng_ctx_close(handle[0])


def close_context(ctx: pynng.Context) -> None:
    """Close ``ctx`` quietly (it may be closed already)."""
    try:
        ctx.close()
    except pynng.NNGException:
        ctx._context = None
