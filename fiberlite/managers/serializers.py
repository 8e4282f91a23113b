"""How a manager's values travel: ``serializer="pickle"`` or ``"xmlrpclib"``.

With ``"pickle"`` (the default) the arguments and results of proxies' calls travel as
they are, and the connection pickles them. With ``"xmlrpclib"`` they are first marshalled
with :mod:`xmlrpc.client`, as the standard library's manager does with that serializer:
a tuple comes back a list, ``bytes`` an ``xmlrpc.client.Binary``, and what XML-RPC cannot
carry (a function, an int beyond 32 bits, an object of another class) raises in the
caller. Either way the connection is the manager's, behind the same key proof: the
serializer changes what a value becomes, not who may send one.
"""
from __future__ import annotations

import xmlrpc.client
from typing import Any

__all__ = ["SERIALIZERS", "check", "dumps", "loads"]

SERIALIZERS = ("pickle", "xmlrpclib")


def check(serializer: Any) -> str:
    """``serializer`` if it is one a manager knows, else a clear error."""
    if serializer not in SERIALIZERS:
        raise ValueError(f"unknown serializer {serializer!r}: a manager's serializer is "
                         f"'pickle' (the default) or 'xmlrpclib'")
    return serializer


def dumps(serializer: str, value: Any) -> Any:
    """``value`` as it travels with ``serializer``."""
    if serializer == "pickle":
        return value
    return xmlrpc.client.dumps((value,), allow_none=True).encode("utf-8")


def loads(serializer: str, sent: Any) -> Any:
    """The value :func:`dumps` made ``sent`` from."""
    if serializer == "pickle":
        return sent
    (value,), _method = xmlrpc.client.loads(bytes(sent).decode("utf-8"))
    return value
