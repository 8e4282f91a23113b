"""The connections this process dialed: one per address (and key), shared by every
caller, dialed again after an ordinary loss but never after a peer was given up as
silent, and none at all once this process is fenced out of its run.
"""
from __future__ import annotations

import threading
import time
from typing import Any

from . import identity
from ..errors import ConnectionLost
from ..wire.client import Carrying, Client

RECEIPTS = "__receipts__"  # the operation of receipts sent on their own

_clients: dict[Any, Client] = {}  # address, or (address, key) for another key than the run's
_clients_lock = threading.Lock()
_dialing: dict[Any, threading.Lock] = {}
_fenced: str | None = None  # why this process may reach no other any more
_never_again: dict[Any, str] = {}  # slots not dialed again (a server gone silent, dial_once), why


def connect(address: str, key: bytes | None = None) -> Client:
    """The shared authenticated connection from this process to ``address``, proving
    ``key`` (default: the run's key)."""
    slot: Any = address if key is None else (address, key)
    client = _clients.get(slot)
    if client is not None and client.alive:
        return client
    if client is not None and client.silent_for is not None:
        _forget(slot, client)  # (its server's job is killed or exits: dialing it is futile)
    why = _fenced or _never_again.get(slot)
    if why is not None:
        raise ConnectionLost(why)
    with _clients_lock:  # one dial per address at a time, without holding up other addresses
        dialing = _dialing.setdefault(slot, threading.Lock())
    with dialing:
        client = _clients.get(slot)
        if client is None or not client.alive:
            client = Client(address, identity.key() if key is None else key)
            with _clients_lock:
                if _fenced is not None:
                    client.close()
                    raise ConnectionLost(_fenced)
                _clients[slot] = client
            client.on_lost(lambda: _forget(slot, client))
    return client


def current(address: str) -> Client | None:
    """The live connection to ``address`` with the run's key, if there is one (none is dialed)."""
    client = _clients.get(address)
    return client if client is not None and client.alive else None


def dial_once(address: str, why: str) -> None:
    """The connection to ``address``, made already, is not made again once it ends:
    calls raise ``ConnectionLost(why)`` (a job and its parent: the job exits then)."""
    _never_again[address] = why


def fence(why: str) -> None:
    """This process is out of its run (its parent is gone, or gave it up): it sends
    nothing more to anyone. Its connections close, and every call to another process,
    under way or later, raises ``ConnectionLost(why)``."""
    global _fenced
    with _clients_lock:
        _fenced = why
    close_all(why)


def close_all(why: str | None = None) -> None:
    """Close every connection this process dialed (calls under way fail)."""
    with _clients_lock:
        clients = list(_clients.values())
        _clients.clear()
    for client in clients:
        client.close(why)


def flush(timeout: float | None = None) -> None:
    """Wait until every one-way request this process sent has been handled (at most
    ``timeout`` seconds in all: a peer that stopped answering is given up on)."""
    deadline = None if timeout is None else time.monotonic() + timeout
    with _clients_lock:
        clients = list(_clients.values())
    for client in clients:
        left = None if deadline is None else max(0.0, deadline - time.monotonic())
        try:
            send_receipts(client, timed=False)
            client.flush(left)
        except (ConnectionError, TimeoutError):
            pass


def send_receipts(client: Client, timed: bool = True) -> None:
    """The receipts still waiting to go on ``client``, on their own."""
    try:
        client.cast(Carrying(_receipts_message, timed), collect=False)
    except ConnectionError:
        pass  # the connection is gone: what was lent goes to others anyway


def pending_receipts(address: str) -> tuple:
    """The receipts waiting to go to ``address`` (still kept): a direct call carries
    them too, so that what the process was lent and took is the process's before the
    call is handled, and drops them once answered (a receipt handled twice changes
    nothing, should a later message carry it as well)."""
    client = _clients.get(address)
    return client.peek_riders() if client is not None else ()


def _receipts_message(receipts: tuple) -> tuple | None:
    return (0, RECEIPTS, receipts) if receipts else None


def _forget(slot: Any, client: Client) -> None:
    with _clients_lock:
        if _clients.get(slot) is client:
            del _clients[slot]
        if client.silent_for is not None:
            _never_again[slot] = f"connection to {client.address} was lost ({client.lost_reason})"
