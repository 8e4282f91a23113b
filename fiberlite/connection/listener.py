"""``Listener`` and ``Client``: connections between jobs that find each other by address.

The counterpart of ``multiprocessing.connection.Listener``/``Client`` for the jobs of a
run: a job listens on an address that the other jobs of its backend can reach, and
any job of the run can connect to it. Both sides prove that they hold the same key
(the run's key unless ``authkey`` says otherwise) with the standard library's HMAC
challenge before anything is read as a pickle. Objects are pickled with cloudpickle,
so functions and classes of ``__main__`` travel by value, as everywhere in fiberlite.

The connection is a plain TCP socket between the two processes: it cannot be sent to
another job (send the address and connect there instead).

A ``Client`` of a ``Listener`` of its own process (``with Listener() as l:`` then
``Client(l.address)`` on the same thread, before ``l.accept()``) cannot wait for the
challenge, which only ``accept()`` answers: it returns at once and proves the key in
the background; what it sends meanwhile is held until the key is proven, and reading
waits for it.
"""
from __future__ import annotations

import multiprocessing.connection as _stdlib
import pickle
import threading
from typing import Any

from ..errors import AuthenticationError
from ..wire.codec import dumps_bytes
from ..wire.gate import Gate
from .challenges import Acceptor, listening_socket, unlink_quietly

Address = Any  # (host, port) for TCP; a path for a Unix socket
families = ["AF_INET", "AF_UNIX"]
default_family = "AF_INET"  # other jobs may run on other machines
BACKLOG = 64    # connections the kernel holds before they are accepted (challenges run meanwhile)

_own_listeners: set = set()  # addresses of this process's open listeners


class SocketConnection:
    """One end of a Listener/Client connection (the ``Connection`` API)."""

    def __init__(self, conn: _stdlib.Connection, authkey: bytes | None = None) -> None:
        """``authkey``: prove it (as a client) in the background before use."""
        self._conn = conn
        self._proven = threading.Event()
        self._failure: BaseException | None = None
        self._held: list[bytes] = []  # sent before the key was proven
        self._lock = threading.Lock()
        if authkey is None:
            self._proven.set()
        else:
            threading.Thread(target=self._prove, args=(authkey,), daemon=True,
                             name="fiberlite-client-challenge").start()

    def _prove(self, authkey: bytes) -> None:
        try:
            _stdlib.answer_challenge(self._conn, authkey)
            _stdlib.deliver_challenge(self._conn, authkey)
            with self._lock:
                for data in self._held:
                    self._conn.send_bytes(data)
                self._held.clear()
        except _stdlib.AuthenticationError as exc:
            self._failure = AuthenticationError(f"the listener refused this process's key: {exc}")
        except (OSError, EOFError) as exc:
            self._failure = exc
        self._proven.set()

    def _ready(self, timeout: float | None = None) -> bool:
        """Wait until the key is proven (False: not within ``timeout``)."""
        if not self._proven.wait(timeout):
            return False
        if self._failure is not None:
            raise self._failure
        return True

    # -- objects --------------------------------------------------------------------------
    def send(self, obj: Any) -> None:
        """Send a picklable object (functions and classes of ``__main__`` by value)."""
        self.send_bytes(dumps_bytes(obj))

    def recv(self) -> Any:
        """Return the next object sent by the other end (``EOFError`` once it is closed)."""
        return pickle.loads(self.recv_bytes())

    # -- bytes and the rest, as the standard library's Connection -----------------------------
    def send_bytes(self, buf: Any, offset: int = 0, size: int | None = None) -> None:
        if not self._proven.is_set():
            with self._lock:
                if not self._proven.is_set():
                    view = memoryview(buf).cast("B")
                    self._held.append(bytes(view[offset:None if size is None else offset + size]))
                    return
        self._ready()
        self._conn.send_bytes(buf, offset, size)

    def recv_bytes(self, maxlength: int | None = None) -> bytes:
        self._ready()
        return self._conn.recv_bytes(maxlength)

    def recv_bytes_into(self, buf: Any, offset: int = 0) -> int:
        self._ready()
        return self._conn.recv_bytes_into(buf, offset)

    def poll(self, timeout: float | None = 0.0) -> bool:
        if not self._ready(timeout):
            return False
        return self._conn.poll(timeout)

    def fileno(self) -> int:
        self._ready()
        return self._conn.fileno()

    def close(self) -> None:
        if self._held:
            self._proven.wait()  # what was sent goes out once the listener accepts
        self._conn.close()

    @property
    def closed(self) -> bool:
        return self._conn.closed

    @property
    def readable(self) -> bool:
        return self._conn.readable

    @property
    def writable(self) -> bool:
        return self._conn.writable

    def __enter__(self) -> "SocketConnection":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def __reduce__(self):
        raise TypeError("a Listener/Client connection is a socket of this process and cannot be "
                        "sent to another job: send the Listener's address and call Client() there")

    def __repr__(self) -> str:
        state = "closed" if self.closed else f"fd={self.fileno()}"
        return f"<fiberlite SocketConnection {state}>"


def _key(authkey: bytes | None) -> bytes:
    if authkey is None:
        from ..process import current_process
        return current_process().authkey
    if not isinstance(authkey, (bytes, bytearray)):
        raise TypeError(f"authkey should be a byte string, not {type(authkey).__name__}")
    return bytes(authkey)


def _default_address() -> tuple[str, int]:
    from ..runtime.hub import listen_host
    return (listen_host(None), 0)


class Listener:
    """Listen for :func:`Client` connections, like ``multiprocessing.connection.Listener``.

    ``address`` defaults to a free port on the address where jobs of the configured
    backend reach this process (not a Unix socket: other jobs may run elsewhere);
    ``authkey`` defaults to the run's key, shared by all its jobs. Each peer is
    challenged while others are accepted (see :mod:`.challenges`).
    """

    def __init__(self, address: Address = None, family: str | None = None, backlog: int = 1,
                 authkey: bytes | None = None) -> None:
        from .. import config
        _check_family(family)
        if address is None and family in (None, "AF_INET"):
            address = _default_address()
        family = family or _family_of(address)
        if address is None:
            address = _stdlib.arbitrary_address(family)
        sock = listening_socket(address, family, max(backlog, BACKLOG))
        self._unix_path = sock.getsockname() if family == "AF_UNIX" else None
        self._address = sock.getsockname()
        self._last_accepted: Address = None
        gate = Gate(config.get("auth_timeout"), config.get("auth_pending_limit"),
                    f"the Listener at {self._address!r}")
        self._acceptor = Acceptor(sock, _key(authkey), gate)
        _own_listeners.add(self._address)

    def accept(self) -> SocketConnection:
        """Wait for a connection whose peer proves it holds the key (other peers are
        accepted and challenged meanwhile; one that resets or stays silent is dropped)."""
        try:
            conn, self._last_accepted = self._acceptor.accept()
        except _stdlib.AuthenticationError as exc:
            raise AuthenticationError(f"a client of {self.address} failed authentication: {exc}") from None
        return SocketConnection(conn)

    def close(self) -> None:
        _own_listeners.discard(self._address)
        self._acceptor.close()
        if self._unix_path is not None:
            unlink_quietly(self._unix_path)
            self._unix_path = None

    @property
    def address(self) -> Address:
        """Where clients connect: pass it to :func:`Client` (in any job of the run)."""
        return self._address

    @property
    def last_accepted(self) -> Address:
        return self._last_accepted

    def __enter__(self) -> "Listener":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def __reduce__(self):
        raise TypeError("a Listener cannot be sent to another job: send its address instead")


def _check_family(family: str | None) -> None:
    if family is not None and family not in families + ["AF_INET6"]:
        raise ValueError(f"unknown family {family!r}: use one of {families} (or AF_INET6)")


def _family_of(address: Address) -> str:
    """The family of ``address`` (as ``multiprocessing``'s), which must be one of this
    platform's: a Windows named pipe's address is refused here."""
    family = _stdlib.address_type(address)
    if family not in families + ["AF_INET6"]:
        raise ValueError(f"{address!r} is a Windows named pipe address ({family}), which this "
                         f"platform does not have: use a (host, port) pair or a Unix socket path")
    return family


def Client(address: Address, family: str | None = None, authkey: bytes | None = None) -> SocketConnection:
    """Connect to the :class:`Listener` at ``address``; both sides prove they hold the key."""
    _check_family(family)
    if family is None:
        _family_of(address)
    key = _key(authkey)
    try:
        if address in _own_listeners:  # accept() may come later on this very thread
            return SocketConnection(_stdlib.Client(address, family, None), authkey=key)
        return SocketConnection(_stdlib.Client(address, family, key))
    except _stdlib.AuthenticationError as exc:
        raise AuthenticationError(f"{address!r} refused this process's key: {exc}") from None
    except ConnectionRefusedError:
        raise ConnectionRefusedError(f"nothing listens at {address!r} (has the Listener been "
                                     f"closed, or its job exited?)") from None
