"""TLS between jobs, keyed by the run's key (setting ``tls``).

nng's TLS transport (``tls+tcp://``, Mbed TLS) with a pre-shared key instead of
certificates: the key is derived from the run's key, so every job of the run holds it
and nothing else has to be made or handed out. Each record is encrypted and
authenticated; the HMAC handshake of :mod:`fiberlite.wire.auth` still runs inside.
"""
from __future__ import annotations

import hashlib
import hmac

import pynng
from pynng._nng import lib
from pynng.exceptions import check_err

SCHEME = "tls+tcp://"
PLAIN = "tcp://"
IDENTITY = b"fiberlite-run"


def psk(key: bytes) -> bytes:
    """The pre-shared key of a run: not the run key itself, so that TLS and the
    handshake never use one key for two purposes."""
    return hmac.new(key, b"fiberlite tls pre-shared key", hashlib.sha256).digest()


def config(key: bytes, server: bool) -> pynng.TLSConfig:
    """A TLS configuration that accepts or dials only peers holding the run's key."""
    mode = pynng.TLSConfig.MODE_SERVER if server else pynng.TLSConfig.MODE_CLIENT
    cfg = pynng.TLSConfig(mode)
    secret = psk(key)
    check_err(lib.nng_tls_config_psk(cfg._tls_config, IDENTITY, secret, len(secret)))
    return cfg


def is_tls(address: str) -> bool:
    return address.startswith(SCHEME)


def host_port(address: str) -> tuple[str, int]:
    """``(host, port)`` of a ``tcp://`` or ``tls+tcp://`` address."""
    rest = address[len(SCHEME):] if is_tls(address) else address[len(PLAIN):]
    host, port = rest.rsplit(":", 1)
    return host, int(port)
