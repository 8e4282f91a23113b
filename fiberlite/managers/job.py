"""The manager's job: what ``BaseManager.start()`` runs.

:func:`serve` holds a :class:`~fiberlite.managers.server.ManagerServer` for as long as the
manager wants it. The server is reached through the job's hub with the run's key, or,
given an address, at that address with the manager's own key
(:class:`~fiberlite.managers.remote.AddressListener`); either way callers' threads also
reach it on connections of their own (:meth:`ManagerServer.open_calls
<fiberlite.managers.server.ManagerServer.open_calls>`).
"""
from __future__ import annotations

from typing import Any, Callable, Mapping

from ..process import current_process
from ..runtime.hub import get_hub
from ..wire.tls import host_port
from .remote import AddressListener
from .server import ManagerServer

__all__ = ["serve"]


def serve(registry: Mapping[str, tuple], control: Any, initializer: Callable | None,
          initargs: tuple, address: tuple[str, int] | None = None,
          authkey: bytes | None = None, ident: str | None = None,
          serializer: str = "pickle") -> None:
    """The manager job: serve the shared objects (as the server ``ident``, its values
    travelling with ``serializer``) until the manager says stop.

    ``control`` is this job's end of a pipe served by the manager's process: the job
    sends ``(where, calls)`` on it (``where``: its server's hub reference, or with
    ``address`` the address it listens at with ``authkey``; ``calls``: where callers'
    own connections reach it, or None), then waits on it for "stop" (or EOF).
    """
    # The job is daemonic for its parent (terminated, not joined, at exit) but may start
    # jobs of its own, as a Pool held by the manager does.
    current_process()._daemonic = False
    if initializer is not None:
        initializer(*initargs)
    server = ManagerServer(registry, ident, serializer)
    listener = calls = None
    try:
        if address is None:
            where: Any = get_hub().register(server)
            calls = server.open_calls(host_port(get_hub().address)[0], None)
        else:
            listener = AddressListener(server, address, authkey)
            where = listener.address
            calls = server.open_calls(address[0], authkey)
    except OSError as exc:
        control.send(exc)
        return
    control.send((where, server.calls))
    try:
        control.recv()
    except EOFError:
        pass
    for opened in (calls, listener):
        if opened is not None:
            opened.close()
    server.close()
