"""Managers reached by address: ``BaseManager(address=(host, port), authkey=...)``.

A manager given an address serves its :class:`~fiberlite.managers.server.ManagerServer`
on a socket of its own at that address (:class:`AddressListener`), where a peer must
prove it holds the manager's ``authkey`` (the wire's HMAC handshake, before anything is
unpickled). Any process that knows the address and the key can then ``connect()``,
whether or not it belongs to the run that started the server; a
:class:`~fiberlite.managers.calls.ServerRef` names the server there. :class:`Server` is
what ``get_server()`` returns.
"""
from __future__ import annotations

import threading
from typing import Any, Mapping

from ..runtime.hub import get_hub
from ..wire.server import Request, Server as WireServer
from .server import ManagerServer

__all__ = ["AddressListener", "Server", "SERVER_OID", "check_address", "url_of"]

SERVER_OID = 1  # the one object an address listener serves: the manager server


def check_address(address: Any) -> tuple[str, int]:
    """``address`` as ``(host, port)``, or a clear error."""
    if (isinstance(address, (tuple, list)) and len(address) == 2
            and isinstance(address[0], str) and isinstance(address[1], int)
            and not isinstance(address[1], bool) and 0 <= address[1] < 65536):
        return (address[0], address[1])
    raise ValueError(f"a manager's address must be (host, port), e.g. ('127.0.0.1', 50000) "
                     f"or port 0 for a free one; got {address!r}")


def url_of(address: tuple[str, int]) -> str:
    return f"tcp://{address[0]}:{address[1]}"


def check_authkey(authkey: Any) -> bytes | None:
    if authkey is None or isinstance(authkey, bytes):
        return authkey
    if isinstance(authkey, bytearray):
        return bytes(authkey)
    raise TypeError(f"authkey must be bytes, not {type(authkey).__name__} "
                    "(for example os.urandom(32) or b'my secret')")


class AddressListener:
    """Serves one manager server at ``address``, to peers that prove ``key``."""

    def __init__(self, servant: ManagerServer, address: tuple[str, int],
                 key: bytes | None) -> None:
        from ..runtime import identity
        self._servant = servant
        host, port = address
        try:
            self._server = WireServer(identity.key() if key is None else key, host,
                                      self._handle, servant.peer_lost,
                                      get_hub().scheduler.call_soon, port=port)
        except Exception as exc:  # pynng's AddressInUse and friends
            raise OSError(f"a manager cannot listen at {host}:{port}: {exc} (is another "
                          "manager or program using that port?)") from None
        self.address = (host, self._server.port)
        self.url = self._server.address

    def _handle(self, request: Request, message: Any) -> None:
        oid, method, args = message
        if oid != SERVER_OID:
            request.fail(ReferenceError(f"no object {oid} at the manager {self.url}"))
            return
        try:
            self._servant.dispatch(request, method, args)
        except Exception as exc:
            request.fail(exc)

    def close(self) -> None:
        self._server.close()


class Server:
    """What ``BaseManager.get_server()`` returns: the manager served by this process."""

    def __init__(self, registry: Mapping[str, tuple], address: tuple[str, int],
                 authkey: bytes | None, serializer: str = "pickle") -> None:
        self.servant = ManagerServer(registry, serializer=serializer)
        self.listener = AddressListener(self.servant, address, authkey)
        self.address = self.listener.address
        self._calls = self.servant.open_calls(address[0], authkey)
        self._stopping = threading.Lock()
        self._stopped = False

    def serve_forever(self) -> None:
        """Serve until :meth:`stop`, a client's ``shutdown`` request or Ctrl-C."""
        try:
            self.servant.stop_requested.wait()
        except KeyboardInterrupt:
            pass
        finally:
            self.stop()

    def stop(self) -> None:
        """Stop listening and release the shared objects (``serve_forever`` returns)."""
        with self._stopping:
            if self._stopped:
                return
            self._stopped = True
        self.servant.stop_requested.set()
        self.listener.close()
        if self._calls is not None:
            self._calls.close()
        self.servant.close()
