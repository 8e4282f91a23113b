"""Handing a plain connection, whose peer has proved the run's key, over to nng.

nng's ``socket://`` transport adopts a connected descriptor through a listener of its
own; each adopted connection has one, which lives as long as the connection. Both
sides of the door (:mod:`.doorman` listening, :mod:`.dialer` dialing) hand over this way.

Every nng call here is made under the owner's :class:`~fiberlite.wire.guard.CallGuard`.
"""
from __future__ import annotations

import logging
import os
import socket

import pynng
from pynng._nng import ffi, lib

from .guard import CallGuard
from .tcp import nodelay

log = logging.getLogger(__name__)

SP_HEADER = b"\x00SP\x00"   # how nng starts every connection (then protocol, reserved)
SP_HEADER_SIZE = 8
TCP = "tcp://"


def adopt(guard: CallGuard, nng_socket, sock: socket.socket):
    """Hand the connected ``sock`` to the nng socket ``nng_socket`` (an ``nng_socket``)
    through a ``socket://`` listener of its own; the listener (an ``nng_listener``), or
    None when that failed or the socket is closing (``sock`` is closed then). From now on
    nng owns the descriptor: closing the listener (or the socket) closes it."""
    nodelay(sock)
    if not guard.enter():
        sock.close()
        return None
    try:
        holder = ffi.new("nng_listener *")
        err = lib.nng_listener_create(holder, nng_socket, b"socket://")
        if err:
            sock.close()
            log.warning("cannot adopt a connection: %s", ffi.string(lib.nng_strerror(err)).decode())
            return None
        listener = holder[0]
        err = lib.nng_listener_start(listener, 0)
        if not err:
            fd = sock.detach()
            err = lib.nng_listener_set_int(listener, b"socket:fd", fd)
            if err:
                os.close(fd)
        else:
            sock.close()
        if err:
            lib.nng_listener_close(listener)
            log.warning("cannot adopt a connection: %s", ffi.string(lib.nng_strerror(err)).decode())
            return None
        return listener
    finally:
        guard.leave()


def listener_of(pipe: pynng.Pipe) -> int:
    """The id of the listener that made ``pipe`` (-1: none)."""
    return lib.nng_listener_id(lib.nng_pipe_listener(pipe.pipe))
