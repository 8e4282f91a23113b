"""The shared memory door (fiberlite.runtime.shm.door) hands segments only to processes that
prove the run's key, reads nothing but fixed-size requests, and gives a slot per visitor;
a visitor maps a segment only if its header holds the arena's cookie and id."""
from __future__ import annotations

import os
import pickle
import socket
import struct

import pytest

import fiberlite
from fiberlite.errors import AuthenticationError
from fiberlite.runtime import identity
from fiberlite.runtime.shm import attach as attach_module
from fiberlite.runtime.shm.arena import arena
from fiberlite.runtime.shm.attach import Attachment
from fiberlite.runtime.shm.door import SCHEME, door
from unpickle_trap import Trace

pytestmark = pytest.mark.timeout(60)


@pytest.fixture
def placed():
    """A RawArray of this process, its place (as pickled), and its door's address."""
    arr = fiberlite.RawArray("i", [1, 2, 3])
    place = pickle.loads(pickle.dumps(arr.__dict__["_fiberlite_share"][0]))
    return arr, place, place.door_address


def _raw(address: str) -> socket.socket:
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    sock.settimeout(10)
    sock.connect("\0" + address[len(SCHEME):])
    return sock


def test_a_visitor_with_the_key_maps_the_segment_and_gets_a_slot_of_its_own(placed):
    arr, place, address = placed
    first, second = Attachment(address, place.cookie), Attachment(address, place.cookie)
    assert first.slot != second.slot and 1 not in (first.slot, second.slot)  # 1: the creator
    area = first.segment(place.segment)
    view = memoryview(area)[place.offset:place.offset + 12].cast("i")
    view[1] = 20                               # the same memory as the creator's
    assert arr[:] == [1, 20, 3]
    assert first.segment(999_999) is None      # no such segment: nothing mapped


def test_a_segment_that_is_not_the_one_asked_for_is_not_used(placed):
    _, place, address = placed
    stranger = Attachment(address, os.urandom(8))  # (another arena's cookie)
    assert stranger.segment(place.segment) is None


def test_a_visitor_without_the_key_gets_nothing(placed, monkeypatch):
    _, place, address = placed
    monkeypatch.setattr(identity, "key", lambda: os.urandom(32))
    with pytest.raises(AuthenticationError):
        Attachment(address, place.cookie)
    monkeypatch.setattr(attach_module, "_attachments", {})
    assert attach_module.attach(address, place.cookie) is None  # remembered: the hub path then


def test_bytes_that_are_not_the_handshake_are_refused_and_never_unpickled(placed, tmp_path):
    _, place, address = placed
    marker = tmp_path / "unpickled"
    with _raw(address) as attacker:
        attacker.sendall(pickle.dumps(Trace(str(marker))))
        try:
            assert attacker.recv(64) == b""      # closed, nothing answered
        except ConnectionResetError:
            pass
    assert not marker.exists()
    assert Attachment(address, place.cookie).segment(place.segment) is not None  # it goes on


def test_a_proven_visitor_that_sends_garbage_is_dropped_and_the_door_goes_on(placed):
    _, place, address = placed
    visitor = Attachment(address, place.cookie)
    visitor._sock.sendall(struct.pack("<cI", b"X", 1) + b"\0" * 8)  # not a request
    assert visitor._sock.recv(64) == b""
    assert Attachment(address, place.cookie).segment(place.segment) is not None


def test_the_door_is_opened_once_and_only_when_an_object_leaves_its_creator():
    assert door(arena()) is door(arena())
