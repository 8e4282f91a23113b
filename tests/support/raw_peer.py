"""A peer that speaks the wire's handshake by hand, on a plain socket (attack tests)."""
from __future__ import annotations

import socket

from fiberlite.wire import auth

CHALLENGE_SIZE = len(auth.CHALLENGE) + auth.NONCE_SIZE + auth.DIGEST_SIZE


def say_hello(sock: socket.socket) -> tuple[bytes, bytes]:
    """Send a HELLO on ``sock`` and read the CHALLENGE: (the nonce sent, the challenge)."""
    nonce = auth.new_nonce()
    sock.sendall(auth.hello(nonce))
    challenge = b""
    while len(challenge) < CHALLENGE_SIZE:
        challenge += sock.recv(4096)
    assert challenge.startswith(auth.CHALLENGE)
    return nonce, challenge
