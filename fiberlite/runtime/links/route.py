"""The one way a ``Queue`` and a ``Pipe`` send, receive and poll.

Each takes the first of three paths that applies:

1. this job's link for the slot (:mod:`.reader`): straight to or from the owner;
2. in the owner itself, the owner's half of the link a job holds for the slot's other
   side (the servant's ``send_local``/``receive_local``), then its channels directly;
3. a request to the owner's hub (``send``, ``receive``, ``poll`` on the servant).

A slot is what one user does with the object: a pipe's end (the job reads it and
sends through it), a queue's ``"get"`` or ``"put"``. Uses through the hub are counted,
and a job asks for a link once they are worth one (:func:`~.reader.used_through_hub`).
A read in the owner is answered :data:`~.frames.RETRY` when a link was made while it
waited, or after it looked for one and before it reached the hub: it is made again,
over the link.
"""
from __future__ import annotations

import queue
import time
from typing import Any, Callable, Hashable

from ...wire.codec import Payload
from .. import direct
from ..dialed import pending_receipts
from ..hub import ObjectRef
from ..lanes.feeder import batches
from .frames import RETRY, Unlinked
from .reader import _readers, got_through_hub, used_through_hub


def send(ref: ObjectRef, slot: Hashable, servant: Any, payload: Payload, gathered: bool = False) -> None:
    """Send ``payload`` through ``slot`` (``servant``: the owner's, in the owner, else None).
    ``gathered``: sends through the hub go in batches, by a thread of this process, each
    call carrying what was sent meanwhile (a queue's puts: many producers through one
    hub); until they land they are unsettled one-way sends (:mod:`fiberlite.wire.oneway`),
    which this process's next send on any other path, a link included, waits for."""
    reader = _readers.get((ref.address, ref.oid, slot)) if _readers else None  # (reader_of, inlined)
    if reader is not None:
        try:
            return reader.send(payload)
        except Unlinked:
            reader.wait_done()  # what it had not read is back with the owner
    elif servant is not None and servant.send_local(slot, payload):
        return
    if gathered and servant is None:
        batches(ref, "send_many", slot).add(payload)
    else:
        ref.cast("send", slot, payload)
    if servant is None:
        used_through_hub(ref, slot)


def receive(ref: ObjectRef, slot: Hashable, servant: Any, block: bool = True,
            timeout: float | None = None, may_link: bool = True) -> Payload:
    """The next message of ``slot``, waiting up to ``timeout`` (None: for ever; not at all
    unless ``block``): ``queue.Empty`` after it, ``EOFError`` at a pipe's end.
    ``may_link``: whether this use counts towards a link."""
    wait = timeout if block else 0.0
    deadline = None if wait is None else time.monotonic() + max(0.0, wait)
    while True:
        reader = _readers.get((ref.address, ref.oid, slot)) if _readers else None
        if reader is not None:
            try:
                payload = reader.receive(wait)
            except Unlinked:
                reader.wait_done()
            else:
                if payload is None:
                    raise queue.Empty
                return payload
        elif servant is not None:
            payload = servant.receive_local(slot, wait)
            if payload is False:
                raise queue.Empty
            if payload is not None:
                return payload
        payload = got_through_hub(ref, slot, direct.call(
            ref, "receive", slot, block, wait, interruptible=True, interrupted=("withdraw", slot),
            kept=_handed_back(ref, slot), receipts=pending_receipts(ref.address)))
        if payload is not RETRY:
            break
        if deadline is not None:
            wait = max(0.0, deadline - time.monotonic())
    if servant is None and may_link:
        used_through_hub(ref, slot)
    return payload


def poll(ref: ObjectRef, slot: Hashable, servant: Any, timeout: float | None) -> bool:
    """Whether ``slot`` has something to read (or is at EOF), waiting up to ``timeout``."""
    deadline = None if timeout is None else time.monotonic() + timeout
    while True:
        reader = _readers.get((ref.address, ref.oid, slot)) if _readers else None
        if reader is not None:
            try:
                return reader.poll(timeout)
            except Unlinked:
                reader.wait_done()
        elif servant is not None:
            ready = servant.receive_local(slot, timeout, peek=True)
            if ready is not None:
                return ready
        ready = direct.call(ref, "poll", slot, timeout, interruptible=True, interrupted=("withdraw", slot),
                            kept=_handed_back(ref, slot))
        if ready is not RETRY:
            return ready
        if deadline is not None:
            timeout = max(0.0, deadline - time.monotonic())


def _handed_back(ref: ObjectRef, slot: Hashable) -> Callable[[bool, Any], None]:
    """Given the answer ``(ok, value)`` of a read of ``slot`` that was interrupted (and
    withdrawn): the item it brought goes back to the front."""
    def hand_back(ok: bool, value: Any) -> None:
        if ok and type(value) is tuple:  # (ticket, item): lent to this read
            ref.call("hand_back", slot, value[0])
        elif ok and isinstance(value, Payload):  # an item of the owner's own read
            ref.call("hand_back", slot, None, value)
    return hand_back
