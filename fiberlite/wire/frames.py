"""Length-prefixed frames on a stream socket (as ``multiprocessing.connection.Connection``
writes them), read in one system call for everything that has arrived: the socket
between a pool host and one of its workers, and between the pool's master and a worker
of its own machine.

``Connection.recv_bytes`` costs two reads a message, and ``Connection.poll`` builds a
selector each time it is asked; a reader that serves a hundred peers would pay that
for every message of each of them. Such a reader reads whatever a socket holds once
its selector says it is readable (:meth:`FrameSocket.read_frames`); a peer that waits
for its next frame calls :meth:`FrameSocket.recv_bytes`.
"""
from __future__ import annotations

import collections
import socket
import struct
import threading

from . import oneway, unix

_SHORT = struct.Struct("!i")  # the length of a frame, as Connection writes it
_LONG = struct.Struct("!Q")  # after a short length of -1: a frame of 2 GiB or more
SOCKET_BUFFER = 4 << 20
READ_SIZE = 16 * 1024  # bytes asked of the socket per read (under malloc's mmap threshold)
READ_MAX = 16 * 1024 * 1024  # a large frame is read this much at a time


def widen(sock: socket.socket) -> None:
    """Socket buffers as large as the kernel gives (up to 4 MiB): a large result leaves
    in one write, and its reader takes it in few reads."""
    for option in (socket.SO_SNDBUF, socket.SO_RCVBUF):
        try:
            sock.setsockopt(socket.SOL_SOCKET, option, SOCKET_BUFFER)
        except OSError:
            pass


def header(size: int) -> bytes:
    """The length that goes before a frame of ``size`` bytes."""
    return _SHORT.pack(size) if size <= 0x7FFFFFFF else _SHORT.pack(-1) + _LONG.pack(size)


class FrameSocket:
    """Either end of a framed socket (descriptor ``fd``, owned from now on): whole frames
    in, whole frames out."""

    __slots__ = ("sock", "_pending", "_need", "_ready", "_sending")

    def __init__(self, fd: int) -> None:
        self.sock = unix.adopt(fd)
        self._pending = bytearray()  # the start of a frame not complete yet
        self._need = 0  # bytes of that frame still to come, when its length is known
        self._ready: collections.deque[bytes] = collections.deque()  # read, not yet taken
        self._sending = threading.Lock()  # a frame is sent whole, whichever thread sends

    def fileno(self) -> int:
        return self.sock.fileno()

    def send_bytes(self, data: bytes) -> None:
        """Send one frame (blocking until the socket has taken it)."""
        if oneway.unsettled:
            oneway.settle()  # (what this process's one-way calls did is seen first)
        n = len(data)
        with self._sending:
            if n > 16384:
                self.sock.sendall(header(n))
                self.sock.sendall(data)
            else:
                self.sock.sendall(_SHORT.pack(n) + data)

    def recv_bytes(self) -> bytes:
        """The next frame, waiting for it (the socket is blocking)."""
        while not self._ready:
            self._ready.extend(self.read_frames())
        return self._ready.popleft()

    def read_frames(self) -> list[bytes]:
        """The frames that arrived: call when the socket is readable (one read, which
        does not wait). Raises ``EOFError`` once the peer's end is closed."""
        data = self.sock.recv(max(READ_SIZE, min(self._need, READ_MAX)))
        if not data:
            raise EOFError("the peer closed its end of the socket")
        if self._pending:
            self._pending += data
            data = self._pending
        frames = []
        view = memoryview(data)
        position, end = 0, len(data)
        self._need = 0
        while end - position >= 4:
            (size,) = _SHORT.unpack_from(data, position)
            start = position + 4
            if size == -1:
                if end - position < 12:
                    break
                (size,) = _LONG.unpack_from(data, start)
                start += 8
            if start + size > end:
                self._need = start + size - end
                break
            frames.append(bytes(view[start:start + size]))
            position = start + size
        if position == 0:  # nothing complete yet: keep what came, without copying it again
            view.release()
            self._pending = data if type(data) is bytearray else bytearray(data)
            return frames
        rest = bytearray(view[position:]) if position < end else bytearray()
        view.release()
        self._pending = rest
        return frames

    def close(self) -> None:
        self.sock.close()
