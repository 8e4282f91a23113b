"""Mutual HMAC challenge-response, run on every connection before anything is unpickled.

    client -> server   HELLO  + client nonce
    server -> client   CHALLENGE + server nonce + HMAC(key, "server" | nc | ns)
    client -> server   PROOF  + HMAC(key, "client" | ns | nc)
    server -> client   WELCOME

Both sides prove they hold the run's key on fresh nonces; a message that is not the
expected step, of the expected length, ends the connection. Nothing here unpickles.
"""
from __future__ import annotations

import hashlib
import hmac
import os
import socket
import time
from typing import Callable

NONCE_SIZE = 32
DIGEST_SIZE = hashlib.sha256().digest_size
HELLO = b"FLv1HELLO"
CHALLENGE = b"FLv1CHALL"
PROOF = b"FLv1PROOF"
WELCOME = b"FLv1WELCOME"


def new_nonce() -> bytes:
    return os.urandom(NONCE_SIZE)


def _mac(key: bytes, role: bytes, first: bytes, second: bytes) -> bytes:
    return hmac.new(key, role + first + second, hashlib.sha256).digest()


def hello(client_nonce: bytes) -> bytes:
    return HELLO + client_nonce


def parse_hello(data: bytes) -> bytes | None:
    """The client nonce of a well-formed HELLO, else None."""
    if len(data) == len(HELLO) + NONCE_SIZE and data.startswith(HELLO):
        return bytes(data[len(HELLO):])
    return None


def challenge(key: bytes, client_nonce: bytes, server_nonce: bytes) -> bytes:
    return CHALLENGE + server_nonce + _mac(key, b"server", client_nonce, server_nonce)


def check_challenge(key: bytes, data: bytes, client_nonce: bytes) -> bytes | None:
    """The server nonce when the server proved the key, else None."""
    if len(data) != len(CHALLENGE) + NONCE_SIZE + DIGEST_SIZE or not data.startswith(CHALLENGE):
        return None
    server_nonce = bytes(data[len(CHALLENGE):len(CHALLENGE) + NONCE_SIZE])
    mac = bytes(data[len(CHALLENGE) + NONCE_SIZE:])
    if not hmac.compare_digest(mac, _mac(key, b"server", client_nonce, server_nonce)):
        return None
    return server_nonce


def proof(key: bytes, client_nonce: bytes, server_nonce: bytes) -> bytes:
    return PROOF + _mac(key, b"client", server_nonce, client_nonce)


def check_proof(key: bytes, data: bytes, client_nonce: bytes, server_nonce: bytes) -> bool:
    if len(data) != len(PROOF) + DIGEST_SIZE or not data.startswith(PROOF):
        return False
    return hmac.compare_digest(bytes(data[len(PROOF):]), _mac(key, b"client", server_nonce, client_nonce))


def prove(key: bytes, send: Callable[[bytes], None], recv: Callable[[], bytes], peer: str) -> None:
    """Run the dialing side of the handshake over ``send``/``recv``; raise
    :class:`~fiberlite.errors.AuthenticationError` naming ``peer`` if it fails."""
    from ..errors import AuthenticationError
    nonce = new_nonce()
    send(hello(nonce))
    server_nonce = check_challenge(key, recv(), nonce)
    if server_nonce is None:
        raise AuthenticationError(f"{peer} did not prove it holds the run's key")
    send(proof(key, nonce, server_nonce))
    if recv() != WELCOME:
        raise AuthenticationError(f"{peer} rejected this process's key")


# -- on a plain blocking socket (local links, the shared memory door's visitors) ----------------
HELLO_SIZE = len(HELLO) + NONCE_SIZE
CHALLENGE_SIZE = len(CHALLENGE) + NONCE_SIZE + DIGEST_SIZE
PROOF_SIZE = len(PROOF) + DIGEST_SIZE


def read_exact(sock: socket.socket, size: int, deadline: float) -> bytes:
    """``size`` bytes from ``sock`` by ``deadline``, or fewer if the peer hung up first."""
    data = bytearray()
    while len(data) < size:
        sock.settimeout(max(0.001, deadline - time.monotonic()))
        chunk = sock.recv(size - len(data))
        if not chunk:
            break
        data += chunk
    return bytes(data)


def prove_on(sock: socket.socket, key: bytes, peer: str, deadline: float) -> None:
    """The dialing side on a connected socket (:func:`prove`'s errors; ``OSError``)."""
    steps = iter((CHALLENGE_SIZE, len(WELCOME)))
    prove(key, sock.sendall, lambda: read_exact(sock, next(steps), deadline), peer)


def check_on(sock: socket.socket, key: bytes, deadline: float,
             started: Callable[[], None] | None = None) -> bool:
    """The listening side on an accepted socket: whether the peer proved ``key``
    (``started()`` is called once it has sent a well-formed first step)."""
    try:
        client_nonce = parse_hello(read_exact(sock, HELLO_SIZE, deadline))
        if client_nonce is None:
            return False
        if started is not None:
            started()
        server_nonce = new_nonce()
        sock.sendall(challenge(key, client_nonce, server_nonce))
        if not check_proof(key, read_exact(sock, PROOF_SIZE, deadline), client_nonce, server_nonce):
            return False
        sock.sendall(WELCOME)
        return True
    except OSError:
        return False
