"""A link carried by an nng PAIR socket: any two processes that reach each other over TCP.

The reading process listens (:meth:`NngLink.listen`), the writing one dials it
(:meth:`NngLink.dial`); the two run :mod:`fiberlite.wire.auth` before anything else, and
the reader accepts no frame from a peer that has not proved it holds the run's key.
Without TLS the handshake runs on the plain connection, before nng has it
(:mod:`fiberlite.wire.doorman`); with TLS, as the first messages of nng's connection.
The reader receives on its own thread (no thread in between) and a blocked receive
can be cancelled from another thread; a send waits for room only as long as its
caller says (False: the link is full or gone).
"""
from __future__ import annotations

import threading
import time
from typing import Callable

import pynng
from pynng._nng import ffi, lib

from .. import auth, dialer, doorman, oneway, tcp, threads, tls, tls_watch
from ..binding import bind_host
from ..guard import CallGuard
from ..nngio import TimedAio, message_of, take_frame
from .base import ACK, LinkCanceled, LinkClosed, LinkTimeout, LossCallbacks

HANDSHAKE_TIMEOUT_MS = 10_000
# messages a sender queues (nng's largest queue) and a reader takes ahead: with the
# sockets' own buffers, what may be left unread before a send fails (the pipe or queue
# then stops using the link and its owner keeps what comes next)
SEND_QUEUE = 8192
RECEIVE_AHEAD = 128
# the writer (dialing) side takes in up to this many frames: room for an acknowledgement of
# every frame it may have sent, so that the reader never waits to acknowledge
WRITER_RECEIVE_AHEAD = SEND_QUEUE


def _socket(address_or_host: str, key: bytes, server: bool) -> pynng.Pair0:
    options = {"tls_config": tls.config(key, server=server)} if tls.is_tls(address_or_host) else {}
    return pynng.Pair0(recv_max_size=0, send_buffer_size=SEND_QUEUE,
                       recv_buffer_size=RECEIVE_AHEAD if server else WRITER_RECEIVE_AHEAD,
                       **options)


def _listen_tls(sock: pynng.Pair0, host: str) -> str:
    """Make ``sock`` listen (TLS) for a writer that reaches this process at ``host``; the
    address to give it."""
    sock.listen(f"{tls.SCHEME}{bind_host(host)}:0")
    port = str(sock.listeners[0].local_address).rsplit(":", 1)[1]
    return f"{tls.SCHEME}{host}:{port}"


def _listening(host: str):
    """A plain TCP socket listening for a writer that reaches this process at ``host``,
    and its address (a writer on this machine gets a local link instead)."""
    listening, port = tcp.listen(host, doorman.BACKLOG)
    return listening, tcp.address(host, port)


NNG = "nng+"  # before the address of a link on plain TCP: tcp:// is the TCP flavour's


class NngLink(LossCallbacks):
    acks_in_line = True  # an acknowledgement is a frame: it is sent like one
    """One end of a PAIR connection, used by one receiving and one sending thread at a time."""

    def __init__(self, sock: pynng.Pair0) -> None:
        self._sock = sock
        self._nng_socket = sock.socket  # the nng_socket itself (pynng's property makes one per use)
        self._receiving = TimedAio()
        self._sending = TimedAio()
        self._lock = threading.Lock()
        self._closed = False
        self._lost_callbacks: list[Callable[[], None]] = []
        self.lost = False
        self._peer: int | None = None  # the nng pipe that passed the handshake
        self._ended_early: set[int] = set()  # pipes that ended before one was the peer
        self._handshaking = False
        self._door: doorman.Doorman | None = None
        self._unwatch: Callable[[], None] = lambda: None
        sock.add_post_pipe_remove_cb(self._pipe_removed)
        # closing the socket wakes the threads waiting in it; the aios are freed once
        # none is inside nng any more
        self._guard = CallGuard(sock.close, self._free_aios)
        self._acks = 0

    # -- making one ----------------------------------------------------------------------
    @classmethod
    def listen(cls, host: str, key: bytes, use_tls: bool) -> "NngLink":
        """A link waiting for its writer on ``host`` (its address: :attr:`address`), over
        TCP (TLS with ``use_tls``)."""
        sock = _socket(tls.SCHEME if use_tls else tls.PLAIN, key, server=True)
        try:
            if use_tls:
                address, listening = _listen_tls(sock, host), None
            else:
                listening, address = _listening(host)
        except pynng.NNGException as exc:
            sock.close()
            raise OSError(f"cannot listen for a link on {host}: {exc}") from None
        except BaseException:
            sock.close()
            raise
        link = cls(sock)
        link.address = address if use_tls else NNG + address  # (tcp:// is the TCP flavour's)
        if use_tls:
            link._unwatch = tls_watch.watch(link, sock, tls.host_port(address)[1],
                                            timeout=HANDSHAKE_TIMEOUT_MS / 1000)
        if listening is not None:
            link._door = doorman.Doorman(listening, key, sock, link._guard, f"the link at {address}",
                                         timeout=HANDSHAKE_TIMEOUT_MS / 1000)
        return link

    def accept(self, key: bytes) -> bool:
        """Run the listening side of the handshake with the first peer: whether it proved
        the key (a peer that did not is disconnected)."""
        if self._door is not None:
            why = self._door.admit_one(HANDSHAKE_TIMEOUT_MS / 1000)
            if self._door.first_pipe is not None:
                self._set_peer(self._door.first_pipe)
            return why is None
        sock = self._sock
        sock.send_timeout = HANDSHAKE_TIMEOUT_MS
        try:
            hello, pipe = self._handshake_step()
            client_nonce = auth.parse_hello(hello)
            if client_nonce is None:
                return False
            server_nonce = auth.new_nonce()
            sock.send(auth.challenge(key, client_nonce, server_nonce))
            proof, proof_pipe = self._handshake_step()
            if proof_pipe != pipe or not auth.check_proof(key, proof, client_nonce, server_nonce):
                return False
            self._set_peer(pipe)
            sock.send(auth.WELCOME)
            return True
        except pynng.NNGException:
            return False
        finally:
            sock.send_timeout = -1

    def _handshake_step(self) -> tuple[bytes, int]:
        """The next message of the handshake and the id of the pipe it came on; given up
        (``pynng.Canceled``) as soon as a peer that started the handshake goes away."""
        self._handshaking = True
        try:
            msg = self._receive(HANDSHAKE_TIMEOUT_MS)
        finally:
            self._handshaking = False
        pipe = lib.nng_msg_get_pipe(msg).id
        size = lib.nng_msg_len(msg)
        data = ffi.buffer(lib.nng_msg_body(msg), size)[:] if size <= 1024 else b""
        lib.nng_msg_free(msg)
        return data, pipe

    @classmethod
    def dial(cls, address: str, key: bytes) -> "NngLink":
        """Connect to the reader at ``address`` and prove the key (``ConnectionError`` or
        :class:`~fiberlite.errors.AuthenticationError` when that fails)."""
        address = address.removeprefix(NNG)  # (nng's own URL)
        sock = _socket(address, key, server=False)
        if not tls.is_tls(address):   # proved on a plain connection, then handed to nng
            link = cls(sock)
            try:
                pipe = dialer.dial(sock, link._guard, address, key, HANDSHAKE_TIMEOUT_MS / 1000)
                if not link._set_peer(pipe.id):
                    raise ConnectionError("the connection ended as it was handed over")
            except BaseException as exc:
                link.close()
                if isinstance(exc, ConnectionError) and not isinstance(exc, ConnectionRefusedError):
                    raise ConnectionError(f"cannot link to {address}: {exc}") from None
                raise
            return link
        sock.reconnect_time_min = sock.reconnect_time_max = 3_600_000  # a dropped link stays down
        sock.recv_timeout = sock.send_timeout = HANDSHAKE_TIMEOUT_MS
        try:
            sock.dial(address, block=True)
            auth.prove(key, sock.send, sock.recv, address)
            pipes = sock.pipes
            if len(pipes) != 1:
                raise pynng.Closed(-1, "the connection ended")
        except pynng.NNGException as exc:
            sock.close()
            raise ConnectionError(f"cannot link to {address}: {exc}") from None
        except BaseException:
            sock.close()
            raise
        sock.recv_timeout = sock.send_timeout = -1
        link = cls(sock)
        link._set_peer(pipes[0].id)
        return link

    # -- using it ------------------------------------------------------------------------
    def send(self, frame, timeout_ms: int = 0) -> bool:
        """Queue ``frame`` (bytes, or a ``pynng.Message`` then owned by nng), waiting up
        to ``timeout_ms`` for room (0: not at all): False if it did not go (full or gone).
        One thread sends at a time; a send under way when the link is closed fails."""
        if oneway.unsettled and frame is not ACK:
            oneway.settle()  # (what this process's one-way calls did is seen first)
        if not self._guard.enter():
            return False
        try:
            return self._send(frame, timeout_ms)
        finally:
            self._guard.leave()

    def _send(self, frame, timeout_ms: int) -> bool:
        if type(frame) is bytes:  # room in the queue, as nearly always: one call, no aio
            err = lib.nng_send(self._nng_socket, frame, len(frame), lib.NNG_FLAG_NONBLOCK)
            if not err:
                return True
            if err != lib.NNG_EAGAIN or not timeout_ms:
                return False
        msg = message_of(frame)
        aio = self._sending.set_timeout(timeout_ms)
        lib.nng_aio_set_msg(aio, msg)
        lib.nng_send_aio(self._nng_socket, aio)
        lib.nng_aio_wait(aio)
        if lib.nng_aio_result(aio):
            lib.nng_msg_free(msg)  # nng leaves a message it did not send to its sender
            return False
        return True

    def recv(self, timeout_ms: int = -1):
        """The next frame; :class:`LinkTimeout` after ``timeout_ms`` (-1: never),
        :class:`LinkCanceled` once :meth:`cancel` is called, :class:`LinkClosed` once
        closed. Acknowledgements that come first are counted (:meth:`acknowledged`)."""
        deadline = None if timeout_ms < 0 else time.monotonic() + timeout_ms / 1000
        while True:
            wait = -1 if deadline is None else max(0, int((deadline - time.monotonic()) * 1000))
            try:
                msg = self._receive(wait)
            except pynng.Timeout:
                raise LinkTimeout from None
            except pynng.Canceled:
                raise LinkCanceled from None
            except pynng.NNGException:
                raise LinkClosed("the link is closed") from None
            frame = self._take(msg)
            if frame is not None:
                return frame

    def recv_nowait(self):
        """The next frame if one has arrived, else None (no waiting, no aio)."""
        if not self._guard.enter():
            return None
        try:
            holder = ffi.new("nng_msg **")
            while not lib.nng_recvmsg(self._nng_socket, holder, lib.NNG_FLAG_NONBLOCK):
                frame = self._take(holder[0])
                if frame is not None:
                    return frame
            return None
        finally:
            self._guard.leave()

    def _take(self, msg):
        """The frame ``msg`` carries; None for an acknowledgement (counted) or a message
        from a connection that never proved the key (dropped, and the connection closed)."""
        pipe = lib.nng_msg_get_pipe(msg)
        if pipe.id != self._peer:
            lib.nng_msg_free(msg)
            lib.nng_pipe_close(pipe)
            return None
        frame = take_frame(msg)
        if len(frame) == 1 and bytes(frame) == ACK:
            self._acks += 1
            return None
        return frame

    def acknowledge(self, timeout_ms: int = 0) -> bool:
        """Tell the peer one more frame is consumed: an acknowledgement in line."""
        return self.send(ACK, timeout_ms)

    def acknowledged(self) -> int:
        """The acknowledgements read so far (they come in line, among the frames)."""
        return self._acks

    def _receive(self, timeout_ms: int):
        """The next ``nng_msg`` (the caller frees it)."""
        if not self._guard.enter():
            raise pynng.Closed(lib.NNG_ECLOSED, "the link is closed")
        try:
            return self._receiving.receive(lib.nng_recv_aio, self._nng_socket, timeout_ms)
        finally:
            self._guard.leave()

    def cancel(self) -> None:
        """Wake a thread blocked in :meth:`recv` (:class:`LinkCanceled`); nothing if none is."""
        with self._lock:
            if not self._closed:
                lib.nng_aio_cancel(self._receiving.aio)

    def _set_peer(self, pipe_id: int) -> bool:
        """``pipe_id`` is the peer's connection: False (and the link lost) if it ended
        already, its end reported before its id was known here."""
        with self._lock:
            self._peer = pipe_id
            if pipe_id in self._ended_early:
                self.lost = True
            self._ended_early.clear()
            return not self.lost

    def _pipe_removed(self, pipe) -> None:
        if self._handshaking and self._peer is None:  # the peer gave up on the handshake
            threads.start(self.cancel, name="fiberlite-link-cancel")
        with self._lock:
            if self._peer is None:
                self._ended_early.add(pipe.id)
            if self.lost or pipe.id != self._peer:
                return
            self.lost = True
            callbacks, self._lost_callbacks = self._lost_callbacks, []
        self._call_lost(callbacks)  # (not on nng's own thread: nothing that waits on nng runs there)

    def close(self) -> None:
        """Close the link: a receive or send under way on another thread fails at once."""
        if not self._mark_closed():
            return
        self._unwatch()
        if self._door is not None:
            self._door.close()
        self._guard.close()

    def _free_aios(self) -> None:
        self._receiving.free()
        self._sending.free()
