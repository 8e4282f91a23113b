"""When an nng socket (or link) may be called, and when it is closed.

Two rules keep closing one from hanging or crashing while other threads send and
receive on it:

- nng aborts the process when a socket is closed while a send on one of its contexts
  is inside nng, and an aio freed while a thread waits on it is memory freed under
  that thread. So every call is made between :meth:`CallGuard.enter` and
  :meth:`CallGuard.leave`; closing first aborts what waits (closing the contexts, or
  a link's socket), and what must not happen under a call (closing a socket with
  contexts, freeing a link's aios) is done by whichever comes last: the close or the
  last call to leave. When that last call is made on one of nng's own threads (a pipe
  callback), the release goes to a thread of its own: nng's close waits for those
  threads, and closing from one of them would wait for itself.
- nng's socket close waits for every context of the socket, and a context that was
  opened after the others were aborted would be waited on for ever: opening one and
  beginning to close exclude each other, and a closing guard opens none.
- nng frees a closed context's protocol state *after* it has told the socket that the
  context is gone, so a socket closed while another thread closes one of its contexts
  may free that state under it (nng panics in ``pthread_mutex_unlock``). The release
  therefore never begins while the abort is still closing contexts: a call that
  leaves meanwhile leaves the release to the abort's end.
"""
from __future__ import annotations

import threading
from typing import Callable, TypeVar

import pynng
from pynng._nng import lib

from . import threads

C = TypeVar("C", bound=pynng.Context)


class CallGuard:
    """Calls into nng on one object, and its closing in two steps: ``abort()`` at once
    (what waits inside nng fails), ``release()`` once no call is inside nng any more."""

    def __init__(self, abort: Callable[[], None], release: Callable[[], None]) -> None:
        threads.prepare()  # the socket's loss or close may need a thread at exit
        self._abort = abort
        self._release = release
        self._lock = threading.Lock()
        self._busy = 0
        self.closing = False
        self._aborting = False  # the abort runs: no release until it has finished
        self._released = False

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
            last = self._take_release()
        if last:
            self._release_off_nng_threads()

    def _release_off_nng_threads(self) -> None:
        if isinstance(threading.current_thread(), threading._DummyThread):
            threads.start(self._release, name="fiberlite-release")
        else:
            self._release()

    def _take_release(self) -> bool:
        last = self.closing and not self._busy and not self._aborting and not self._released
        if last:
            self._released = True
        return last

    def close(self) -> bool:
        """Abort what is under way and release now, or as soon as the last call inside
        nng returns; never waits. False if already closing."""
        with self._lock:
            if self.closing:
                return False
            self.closing = self._aborting = True
        try:
            self._abort()
        finally:
            with self._lock:
                self._aborting = False
                last = self._take_release()
        if last:
            self._release_off_nng_threads()
        return True


class SocketGuard(CallGuard):
    """A :class:`CallGuard` for a socket with contexts: closing aborts the contexts and
    then closes them and the socket."""

    def __init__(self, sock: pynng.Socket) -> None:
        super().__init__(self._abort_contexts, self._close_socket)
        self._sock = sock
        self.contexts: list[pynng.Context] = []

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

    def _abort_contexts(self) -> None:
        with self._lock:
            contexts = list(self.contexts)
        for ctx in contexts:  # aborts every send and receive under way on them
            abort_context(ctx)

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
