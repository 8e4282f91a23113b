"""What local links need beyond their frames: the socket's settings (:func:`tune`), the
acknowledgement count both ends map (:func:`new_ack_lane`, :func:`ack_lane`), the
process's watch for peers that hang up (:class:`Watch`, one thread while any local link
is open), and the rest of a frame a sender could not wait for (:class:`Backlog`,
written by a thread of its own).
"""
from __future__ import annotations

import mmap
import os
import select
import socket
import struct
import threading
import time
from typing import Callable

SOCKET_BUFFER = 4 * 1024 * 1024  # asked of the kernel for each direction (it may give less)

from .. import auth, threads


def dial_proven(connect: Callable[[float], socket.socket], address: str, key: bytes,
                timeout: float, then: Callable[[socket.socket], None] | None = None) -> socket.socket:
    """The connection ``connect(timeout)`` makes to ``address``, once both ends proved
    ``key`` within ``timeout`` seconds and ``then(sock)`` (the flavour's own first step),
    if given, ran: ``ConnectionRefusedError`` when nobody listens
    there, ``ConnectionError`` when it fails otherwise,
    :class:`~fiberlite.errors.AuthenticationError` for a wrong key."""
    deadline = time.monotonic() + timeout
    try:
        sock = connect(timeout)
    except ConnectionRefusedError:
        raise ConnectionRefusedError(f"nothing listens at {address} (has its job exited?)") from None
    except OSError as exc:
        raise ConnectionError(f"cannot link to {address}: {exc}") from None
    try:
        auth.prove_on(sock, key, address, deadline)
        if then is not None:
            then(sock)
    except OSError as exc:
        sock.close()
        raise ConnectionError(f"cannot link to {address}: {exc}") from None
    except BaseException:
        sock.close()
        raise
    return sock


def ack_lane(fd: int) -> memoryview:
    """The shared acknowledgement count behind ``fd`` (a memfd), as a one-item view."""
    try:
        area = mmap.mmap(fd, 4)
    finally:
        os.close(fd)
    return memoryview(area).cast("I")


def new_ack_lane() -> tuple[int, memoryview]:
    fd = os.memfd_create("fiberlite-link-acks", os.MFD_CLOEXEC)
    os.ftruncate(fd, 4)
    return os.dup(fd), ack_lane(fd)


def take_ack_lane(sock: socket.socket, deadline: float) -> memoryview | None:
    """The acknowledgement count a proven writer passes right after the handshake (None:
    it passed none, or not in time)."""
    try:
        sock.settimeout(max(0.001, deadline - time.monotonic()))
        _, fds, _, _ = socket.recv_fds(sock, 1, 1)
    except OSError:
        return None
    if len(fds) != 1:
        for fd in fds:
            os.close(fd)
        return None
    try:
        return ack_lane(fds[0])
    except (OSError, ValueError):
        return None


def tune(sock: socket.socket, cancel_check_us: int, buffer: int | None = SOCKET_BUFFER) -> None:
    """Buffers of ``buffer`` bytes each way, or as large as the kernel gives below that
    (None: the kernel's own, which TCP sizes to the network), blocking mode, and a
    receive that waits for ever woken every ``cancel_check_us`` microseconds."""
    for option in (socket.SO_SNDBUF, socket.SO_RCVBUF):
        if buffer is None:
            break
        try:
            sock.setsockopt(socket.SOL_SOCKET, option, buffer)
        except OSError:
            pass
    sock.setblocking(True)
    sock.settimeout(None)
    # a receive that waits for ever wakes this often to see whether it was cancelled
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVTIMEO, struct.pack("ll", 0, cancel_check_us))


def rest_of(parts: list, sent: int) -> list:
    """What of ``parts`` is left once ``sent`` bytes went out."""
    for i, part in enumerate(parts):
        view = memoryview(part).cast("B")
        if sent < view.nbytes:
            return [view[sent:], *parts[i + 1:]]
        sent -= view.nbytes
    return []


def send_blocking(sock: socket.socket, parts: list) -> bool:
    """Write ``parts`` in blocking calls (one, nearly always): False if the connection
    failed (the peer is gone, or it was shut down here, which wakes the call)."""
    flags = getattr(socket, "MSG_NOSIGNAL", 0)
    while parts:
        try:
            sent = sock.sendmsg(parts, (), flags) if len(parts) > 1 else sock.send(parts[0], flags)
        except InterruptedError:
            continue
        except OSError:
            return False
        parts = rest_of(parts, sent)
    return True


class Backlog:
    """The rest of a frame whose start went out, written by ``write()`` on a thread of its
    own; further sends wait for it (:meth:`wait`), or fail if they may not wait."""

    def __init__(self, write: Callable[[], object]) -> None:
        self._done = threading.Event()
        threads.start(self._run, write, name="fiberlite-link-backlog")

    def _run(self, write: Callable[[], object]) -> None:
        try:
            write()
        finally:
            self._done.set()

    def wait(self, deadline: float | None) -> bool:
        return self._done.wait(None if deadline is None else max(0.0, deadline - time.monotonic()))


class Watch:
    """One thread for the process that hears of local links whose peer hung up; it ends
    once no link is left to watch (the next link starts another)."""

    def __init__(self) -> None:
        self._epoll = select.epoll()
        self._stop = os.eventfd(0, os.EFD_NONBLOCK | os.EFD_CLOEXEC)
        self._epoll.register(self._stop, select.EPOLLIN)
        self._calls: dict[int, Callable[[], None]] = {}
        threads.start(self._run, name="fiberlite-link-watch")

    def add(self, fd: int, hung_up: Callable[[], None]) -> None:
        self._calls[fd] = hung_up
        self._epoll.register(fd, select.EPOLLRDHUP | select.EPOLLONESHOT)

    def remove(self, fd: int) -> bool:
        """Stop watching ``fd``; whether nothing is left (then the thread ends)."""
        if self._calls.pop(fd, None) is not None:
            try:
                self._epoll.unregister(fd)
            except OSError:
                pass
        if self._calls:
            return False
        os.eventfd_write(self._stop, 1)
        return True

    def _run(self) -> None:
        try:
            while True:
                for fd, _ in self._epoll.poll():
                    if fd == self._stop:
                        return
                    with _watcher_lock:
                        hung_up = self._calls.pop(fd, None)
                    if hung_up is not None:
                        hung_up()
        finally:
            self._epoll.close()
            os.close(self._stop)


_watcher: Watch | None = None
_watcher_lock = threading.Lock()


def watch(fd: int, hung_up: Callable[[], None]) -> None:
    """Call ``hung_up()`` (on the watch's thread) once the peer of socket ``fd`` hangs up."""
    global _watcher
    with _watcher_lock:
        if _watcher is None:
            _watcher = Watch()
        _watcher.add(fd, hung_up)


def unwatch(fd: int) -> None:
    global _watcher
    with _watcher_lock:
        if _watcher is not None and _watcher.remove(fd):
            _watcher = None
