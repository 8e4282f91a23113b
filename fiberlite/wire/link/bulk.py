"""Bulk reads of a stream link (:class:`BulkReads`, a part of
:class:`~.stream.StreamLink`): the frames read as one byte stream straight into memory
the caller gives (an array received in place), and the rest of a frame that began
arriving read whole.
"""
from __future__ import annotations

import socket
import time
from typing import Any

from .base import LinkClosed

_DONTWAIT = socket.MSG_DONTWAIT | getattr(socket, "MSG_NOSIGNAL", 0)


class BulkReads:
    """:meth:`recv_into` and :meth:`_read_rest` of a :class:`~.stream.StreamLink`, over
    its inbox (``_inbox``/``_view`` between ``_start`` and ``_end``), its frame parsing
    (``_next_size``, which sets ``_pad``) and its waits (``_fill``, ``_wait_readable``)."""

    lost: bool
    _sock: socket.socket | None
    _view: memoryview
    _start: int
    _end: int
    _left: int
    _pad: int
    _lowat: int
    _closed: bool
    _receiving: bool

    def recv_into(self, buffer: Any, timeout_ms: int = -1) -> int:
        """Fill ``buffer`` (writable, contiguous) with the next ``nbytes`` of what the peer
        sent: the frames' contents back to back, as a byte stream (a frame may be split
        between calls, a call may span frames; large parts are read straight into
        ``buffer``). Returns ``nbytes``; the errors of :meth:`recv`. A receive with a
        timeout may fail midway, and what it read is then lost: bulk readers wait for
        ever (-1). A link is read either this way or by :meth:`recv`, not both at once."""
        view = memoryview(buffer).cast("B")
        deadline = None if timeout_ms < 0 else time.monotonic() + timeout_ms / 1000
        lost = self.lost
        want, have = view.nbytes, 0
        while have < want:
            if not self._left and self._pad:  # the padding of a frame of no byte (or of one)
                while self._end - self._start < self._pad:
                    self._fill(deadline, lost, self._pad - (self._end - self._start))
                self._start += self._pad
                self._pad = 0
                continue
            if not self._left:  # at a frame's start: its length first
                size = self._next_size()
                while size is None:  # (its length only: what follows goes straight to buffer)
                    self._fill(deadline, lost, 9 - (self._end - self._start))
                    size = self._next_size()
                self._start += 8
                self._left = size
                continue
            if self._pad and self._left == 1 and self._end - self._start < 1 + self._pad:
                self._fill(deadline, lost, 1 + self._pad - (self._end - self._start))
                continue  # (a one-byte frame and its padding: read together)
            take = min(self._left, want - have, self._end - self._start)
            if take:  # what was read already
                view[have:have + take] = self._view[self._start:self._start + take]
                self._start += take
            else:  # nothing read: straight into the caller's memory
                take = min(self._left, want - have)
                self._read_rest(self._sock, view[have:have + take], 0, deadline)
            have += take
            self._left -= take
            if not self._left and self._pad:
                self._start += self._pad
                self._pad = 0
        if self._start == self._end:
            self._start = self._end = 0
        return want

    def _read_rest(self, sock: socket.socket, view: memoryview, have: int, deadline: float | None) -> None:
        """Read the rest of a frame into ``view[have:]``: once it started it is read whole
        (a deadline is stretched by a second at a time while bytes keep coming; a wait
        for ever blocks in one call per socket timeout), :class:`LinkClosed` if the
        connection ends or the link closes first."""
        size = view.nbytes
        if self._lowat != 1:  # (the rest of a frame: every byte counts)
            self._set_lowat(sock, 1)
        while have < size:
            if deadline is None:
                self._receiving = True
                try:
                    got = sock.recv_into(view[have:], size - have, socket.MSG_WAITALL)
                except (BlockingIOError, InterruptedError):
                    got = None  # (woken to look at close())
                except OSError:
                    got = 0
                finally:
                    self._receiving = False
                if got is None and self._closed:
                    raise LinkClosed("the link is closed")
            else:
                try:
                    got = sock.recv_into(view[have:], size - have, _DONTWAIT)
                except (BlockingIOError, InterruptedError):
                    got = None
                    self._wait_readable(sock, max(deadline, time.monotonic() + 1), partial=True)
                except OSError:
                    got = 0
            if got == 0:
                self._peer_gone()
                raise LinkClosed("the link is closed" if self._closed
                                 else "the link's connection ended in the middle of a frame")
            if got:
                have += got
