"""The dialing side of the door (:mod:`.doorman`): prove the key on a plain connection,
wait for the listening side's nng to greet it, then hand it over to nng.

Waiting for the greeting means that a listener that closed meanwhile is seen as a
closed connection, not waited for. A door that is full cuts a connection off before it
answers; such a connection is made again, backing off, until the deadline.
"""
from __future__ import annotations

import socket
import threading
import time

import pynng

from ..errors import AuthenticationError
from . import auth
from .guard import CallGuard
from .handover import SP_HEADER, SP_HEADER_SIZE, TCP, adopt


def _connect(address: str, timeout: float) -> socket.socket:
    if not address.startswith(TCP):
        raise ValueError(f"not an address this process can dial: {address}")
    host, port = address[len(TCP):].rsplit(":", 1)
    return socket.create_connection((host.strip("[]"), int(port)), timeout=timeout)


def dial(sock: pynng.Socket, guard: CallGuard, address: str, key: bytes, timeout: float) -> pynng.Pipe:
    """Connect ``sock`` (an nng socket that dials nothing itself) to the
    :class:`~.doorman.Doorman` at ``address``: prove the key on a plain connection, then
    adopt it; the nng pipe.
    Raises ``ConnectionRefusedError``, :class:`~fiberlite.errors.AuthenticationError` or
    ``ConnectionError``."""
    deadline = time.monotonic() + timeout
    raw = _proved(address, key, deadline)
    arrived: list[pynng.Pipe] = []
    ready = threading.Event()

    def added(pipe: pynng.Pipe) -> None:
        arrived.append(pipe)
        ready.set()
    sock.add_post_pipe_connect_cb(added)
    if adopt(guard, sock.socket, raw) is None:
        raise ConnectionError(f"connection to {address} was closed during the handshake")
    if not ready.wait(max(0.0, deadline - time.monotonic())) or guard.closing:
        raise ConnectionError(f"connection to {address} was closed during the handshake")
    return arrived[0]


class _CutOff(ConnectionError):
    """The door closed the connection before it answered the HELLO (it was full)."""


def _proved(address: str, key: bytes, deadline: float) -> socket.socket:
    """A plain connection to ``address`` on which both sides proved the key, the
    listening side's nng greeting waiting in it. A connection the door cut off before
    it answered (it makes room for newer ones among those that have not spoken yet) is
    made again until ``deadline``."""
    attempt = 0
    while True:
        try:
            raw = _connect(address, max(0.001, deadline - time.monotonic()))
        except ConnectionRefusedError:
            raise ConnectionRefusedError(
                f"nothing listens at {address} (has the job that owns it exited?)") from None
        except OSError as exc:
            raise ConnectionError(f"cannot connect to {address}: {exc}") from None
        try:
            _prove_on(raw, key, address, deadline)
            return raw
        except _CutOff:
            raw.close()
            attempt += 1
            if time.monotonic() + 0.01 * attempt >= deadline:
                raise ConnectionError(f"connection to {address} was closed before its handshake "
                                      f"(the listener is flooded with connections?)") from None
            time.sleep(0.01 * attempt)   # back off: the door is full
        except (AuthenticationError, ValueError):
            raw.close()
            raise
        except (OSError, ConnectionError) as exc:
            raw.close()
            raise ConnectionError(f"connection to {address} failed during the handshake: "
                                  f"{exc or type(exc).__name__}") from None
        except BaseException:
            raw.close()
            raise


def _prove_on(raw: socket.socket, key: bytes, address: str, deadline: float) -> None:
    raw.settimeout(max(0.001, deadline - time.monotonic()))
    steps = iter((lambda: _read_step(raw, auth.CHALLENGE_SIZE),
                  # the listener closes the connection of a peer whose proof failed
                  lambda: _read_step(raw, len(auth.WELCOME), b"")))
    auth.prove(key, raw.sendall, lambda: next(steps)(), address)
    # the listening side's nng greets as soon as it owns the connection: until then
    # the connection may still be closed without nng ever having seen it
    raw.settimeout(max(0.001, deadline - time.monotonic()))
    greeting = raw.recv(SP_HEADER_SIZE, socket.MSG_PEEK | socket.MSG_WAITALL)
    if not greeting.startswith(SP_HEADER):
        raise ConnectionError("the connection ended before it was handed over")
    raw.settimeout(None)


def _read_step(sock: socket.socket, size: int, ended: bytes | None = None) -> bytes:
    """The listening side's next handshake step, ``size`` bytes; ``ended`` if it closes
    the connection instead (None: it was cut off before it answered)."""
    data = bytearray()
    while len(data) < size:
        try:
            chunk = sock.recv(size - len(data))
        except ConnectionResetError:
            chunk = b""
        if not chunk:
            if ended is None and not data:
                raise _CutOff("the connection was closed before the handshake")
            if ended is None:
                raise ConnectionError("the connection ended")
            return ended
        data += chunk
    return bytes(data)
