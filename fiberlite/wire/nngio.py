"""An nng context with reusable aios for sending and receiving.

pynng's ``Context.send``/``recv_msg`` allocate and free an ``nng_aio`` on every call
(and ``nng_aio_alloc`` calls ``getrandom``), wrap each message in a ``Message`` and
look its pipe up under the socket's lock. :class:`Io` keeps one aio per direction
for its life and hands back the frame and the pipe id directly.

A send may be left to complete in the background (``wait=False``): nng finishes a
send on one of its own threads, and waiting for that costs the sender a thread
wake-up even though the bytes are already on their way. The outcome is collected by
the next send on the context (or :meth:`Io.settle`).
"""
from __future__ import annotations

import threading
import time

import pynng
from pynng._nng import ffi, lib
from pynng.exceptions import check_err

from .codec import ZERO_COPY_MIN, join_message


FIRST_PAUSE = 50e-6   # seconds: an interruptible wait's first look after the start
SIGNAL_SLICE = 0.02  # seconds: its longest pause, how late a signal's handler runs at most


def _new_aio():
    aio_p = ffi.new("nng_aio **")
    check_err(lib.nng_aio_alloc(aio_p, ffi.NULL, ffi.NULL))
    return aio_p[0]


class Io(pynng.Context):
    """A context of ``socket`` used by one thread at a time."""

    def __init__(self, socket: pynng.Socket) -> None:
        self._send_aio = self._receiving = None
        self._sending = False
        super().__init__(socket)
        self._send_aio = _new_aio()
        self._receiving = TimedAio()

    def send_frame(self, frame, wait: bool = True) -> None:
        """Send a frame of :func:`codec.encode` (bytes, or a Message nng then owns).

        With ``wait=False`` return as soon as nng has taken the message; a failure is
        then only visible to :meth:`settle` (a lost connection is reported anyway)."""
        self.settle()
        msg = message_of(frame)
        aio = self._send_aio
        lib.nng_aio_set_msg(aio, msg)
        lib.nng_ctx_send(self.context, aio)
        self._sending = True
        if wait:
            check_err(self.settle())

    def settle(self) -> int:
        """Wait for the send under way, if any; its nng error code (0: sent)."""
        if not self._sending:
            return 0
        self._sending = False
        aio = self._send_aio
        lib.nng_aio_wait(aio)
        err = lib.nng_aio_result(aio)
        if err:  # nng leaves the message to us when the send failed
            lib.nng_msg_free(lib.nng_aio_get_msg(aio))
        return err

    def recv_frame(self, timeout_ms: int = -1):
        """Wait for a message: ``(frame, pipe id, nng_pipe)``; the frame as in
        :func:`codec.frame_from_message` (large out-of-band frames used in place).
        ``timeout_ms``: ``pynng.Timeout`` after that long (-1: wait for ever)."""
        self.begin_recv(timeout_ms)
        return self.end_recv()

    def begin_recv(self, timeout_ms: int = -1) -> None:
        """Start receiving; :meth:`end_recv` waits for the message, :meth:`cancel_recv`
        (from another thread) makes it raise ``pynng.Canceled`` unless one has come."""
        lib.nng_ctx_recv(self.context, self._receiving.set_timeout(timeout_ms))

    def end_recv(self, interruptible: bool = False):
        """The message :meth:`begin_recv` waited for, as :meth:`recv_frame` returns it
        (``interruptible``: see :meth:`TimedAio.wait`)."""
        msg = self._receiving.wait(interruptible)
        pipe = lib.nng_msg_get_pipe(msg)
        return take_frame(msg), pipe.id, pipe

    def recv_interrupted(self) -> bool:
        """Whether :meth:`end_recv` was interrupted while it waited (Ctrl-C): the receive
        is under way, and :meth:`end_recv` collects it."""
        return self._receiving.interrupted

    def recv_finished(self) -> bool:
        """Whether the receive :meth:`begin_recv` started has finished (then
        :meth:`end_recv` returns, or raises, at once)."""
        return not lib.nng_aio_busy(self._receiving.aio)

    def cancel_recv(self) -> None:
        lib.nng_aio_cancel(self._receiving.aio)

    def __del__(self) -> None:
        try:
            super().__del__()  # closing the context aborts what is under way on it
        except Exception:
            pass
        if getattr(self, "_send_aio", None) is not None:
            self.settle()
        aio = getattr(self, "_send_aio", None)
        if aio is not None:
            self._send_aio = None
            lib.nng_aio_free(aio)
        receiving = getattr(self, "_receiving", None)
        if receiving is not None:
            self._receiving = None
            receiving.free()


class TimedAio:
    """A reusable ``nng_aio`` (no callback) that remembers the timeout it is set to."""

    __slots__ = ("aio", "_timeout", "interrupted")

    def __init__(self) -> None:
        self.aio = _new_aio()
        self._timeout: int | None = None
        self.interrupted = False  # the last wait was interrupted, its receive under way

    def set_timeout(self, timeout_ms: int):
        """The aio, its timeout set to ``timeout_ms`` (-1: none, 0: do not wait)."""
        if timeout_ms != self._timeout:
            lib.nng_aio_set_timeout(self.aio, timeout_ms)
            self._timeout = timeout_ms
        return self.aio

    def receive(self, start, target, timeout_ms: int):
        """Receive with ``start(target, aio)`` (``nng_ctx_recv``, ``nng_recv_aio``) and
        wait: the ``nng_msg`` (the caller frees it), or the nng error raised."""
        start(target, self.set_timeout(timeout_ms))
        return self.wait()

    def wait(self, interruptible: bool = False):
        """Wait for the receive under way: the ``nng_msg``, or the nng error raised.

        ``nng_aio_wait`` sleeps through signals: with ``interruptible``, the main thread
        (where signal handlers run) looks at the aio at growing intervals instead, up to
        :data:`SIGNAL_SLICE` apart, so that a handler's exception (Ctrl-C's
        KeyboardInterrupt) is raised within that time. :attr:`interrupted` then says the
        receive is still under way: waiting again collects its message."""
        aio = self.aio
        self.interrupted = False
        if interruptible and threading.current_thread() is threading.main_thread():
            pause = FIRST_PAUSE
            try:
                while lib.nng_aio_busy(aio):
                    time.sleep(pause)  # a signal ends the sleep; its handler runs after it
                    pause = min(pause * 2, SIGNAL_SLICE)
            except BaseException:
                self.interrupted = True  # (set before any other exception can come)
                raise
        lib.nng_aio_wait(aio)
        err = lib.nng_aio_result(aio)
        if err:
            check_err(err)
        return lib.nng_aio_get_msg(aio)

    def free(self) -> None:
        lib.nng_aio_free(self.aio)


def message_of(frame):
    """An ``nng_msg`` for sending ``frame``: a ``pynng.Message``'s own (nng owns it from
    now on), or a new one holding a copy of the bytes (or of the parts of a tuple)."""
    if type(frame) is tuple:
        frame = join_message(frame)
    if isinstance(frame, pynng.Message):
        with frame._mem_freed_lock:
            frame._ensure_can_send()
            frame._mem_freed = True
            return frame._nng_msg
    msg_p = ffi.new("nng_msg **")
    check_err(lib.nng_msg_alloc(msg_p, len(frame)))
    msg = msg_p[0]
    ffi.memmove(lib.nng_msg_body(msg), frame, len(frame))
    return msg


def take_frame(msg):
    """The body of a received ``nng_msg`` as a frame, the message taken over: a large
    frame with out-of-band buffers (its first 4 bytes not zero) is used in place and
    freed with its last view, a smaller one is copied out and the message freed."""
    size = lib.nng_msg_len(msg)
    body = ffi.cast("char *", lib.nng_msg_body(msg))
    if size >= ZERO_COPY_MIN and ffi.buffer(body, 4)[:] != b"\x00\x00\x00\x00":
        owner = ffi.gc(body, lambda _p, m=msg: lib.nng_msg_free(m))
        return ffi.buffer(owner, size)
    frame = ffi.unpack(body, size)
    lib.nng_msg_free(msg)
    return frame


def close_pipe(pipe) -> None:
    """Close the connection ``pipe`` (an ``nng_pipe`` from :meth:`Io.recv_frame`)."""
    lib.nng_pipe_close(pipe)
