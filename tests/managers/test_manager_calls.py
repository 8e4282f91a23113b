"""A manager's calls on the calling thread's own connection (fiberlite.managers.stream):
what travels, who may connect, and what happens when that connection cannot be made."""
from __future__ import annotations

import pickle
import socket
import struct
import sys
import threading

import cloudpickle
import numpy as np
import pytest

import fiberlite
from fiberlite import config
from fiberlite.managers import BaseManager, SyncManager
from fiberlite.managers import stream
from fiberlite.managers.calls import _unreachable
from fiberlite.managers.server import ManagerServer
from unpickle_trap import Trace
from waiting import eventually

pytestmark = pytest.mark.timeout(90)

cloudpickle.register_pickle_by_value(sys.modules[__name__])


class Holder:
    def __init__(self):
        self.lock = threading.Lock()

    def give_lock(self):
        return self.lock  # cannot be pickled

    def echo(self, value):
        return value


class HolderManager(BaseManager):
    pass


HolderManager.register("Holder", Holder)


@pytest.fixture
def manager():
    with SyncManager() as m:
        yield m


def own_connections(proxy) -> int:
    """This thread's connections to the server of ``proxy``."""
    connections = getattr(stream._local, "connections", {})
    return sum(1 for (address, _key) in connections if address == proxy._server.calls)


def test_each_calling_thread_has_its_own_connection(manager):
    items = manager.list()
    assert items._server.calls is not None
    items.append(1)
    assert own_connections(items) == 1
    seen = []

    def use():
        items.append(2)
        seen.append(own_connections(items))

    worker = threading.Thread(target=use)
    worker.start()
    worker.join(30)
    assert seen == [1] and items[:] == [1, 2]
    assert own_connections(items) == 1  # the other thread's is not this thread's
    eventually(lambda: manager._number_of_threads() == 1, what="the ended thread's server thread")


def test_large_and_unusual_values_travel_both_ways(manager):
    items = manager.list()
    blob = bytes(range(256)) * 8192  # 2 MiB: out of band, larger than a receive's buffer
    array = np.arange(300_000, dtype=np.float64)
    items.append(blob)
    items.append(array)
    items.append(lambda x: x + 1)  # a function of this module: travels by value
    got_blob, got_array, function = items[0], items[1], items[2]
    assert got_blob == blob
    assert np.array_equal(got_array, array) and got_array.flags.writeable
    assert function(41) == 42
    assert len(items) == 3


def test_an_unpicklable_result_is_an_error_and_the_connection_goes_on():
    with HolderManager() as m:
        holder = m.Holder()
        with pytest.raises(TypeError, match="pickle"):
            holder.give_lock()
        assert holder.echo({"still": ["fine"]}) == {"still": ["fine"]}


def test_calls_go_through_the_hub_when_the_call_address_cannot_be_reached(manager):
    items = manager.list([1])
    with socket.socket() as closed:
        closed.bind(("127.0.0.1", 0))
        port = closed.getsockname()[1]  # nothing listens there once closed
    nowhere = ("127.0.0.1", port, None, "another machine")
    items._server.calls = nowhere
    try:
        items.append(2)
        assert items[:] == [1, 2]
        assert nowhere in _unreachable
    finally:
        _unreachable.discard(nowhere)


def _frame(obj) -> bytes:
    data = pickle.dumps(obj)
    return struct.pack("<II", len(data), 0) + data


@pytest.mark.parametrize("family", ["tcp", "abstract"])
def test_a_peer_without_the_key_is_closed_and_nothing_is_unpickled(manager, tmp_path, family):
    items = manager.list([1])
    host, port, abstract, _machine = items._server.calls
    marker = tmp_path / "unpickled"
    if family == "tcp":
        sock = socket.create_connection((host, port), timeout=10)
    else:
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        sock.settimeout(10)
        sock.connect("\0" + abstract)
    with sock:
        sock.sendall(_frame(("invoke", Trace(str(marker)))) * 4)
        try:
            while sock.recv(4096):  # the server sends nothing back, and closes
                pass
        except ConnectionResetError:
            pass
    assert not marker.exists()
    items.append(2)  # the manager serves on
    assert items[:] == [1, 2]


def test_another_key_is_refused(manager):
    items = manager.list()
    with pytest.raises(fiberlite.AuthenticationError):
        stream.call(items._server.calls, b"not the run's key" * 2, (pickle.dumps(None), []),
                    items._server.address)


def test_with_tls_calls_come_through_the_hub(monkeypatch):
    monkeypatch.setattr(config, "_overrides", dict(config._overrides))
    config.init(tls=True)
    server = ManagerServer({})
    assert server.open_calls("127.0.0.1", None) is None and server.calls is None
    monkeypatch.undo()
    config.init()


def framed_pair():
    from fiberlite.wire.link import StreamLink
    left, right = socket.socketpair()
    return stream.Framed(StreamLink.over(left, "left")), stream.Framed(StreamLink.over(right, "right"))


def test_a_call_is_one_frame_of_the_link_with_or_without_buffers():
    sender, receiver = framed_pair()
    try:
        plain = pickle.dumps(("ping", 1), 5)
        sender.send((plain, []))
        assert receiver.receive() == (plain, [])
        small = [b"ab", bytearray(b"cde")]  # (a small frame: its buffers get memory of their own)
        buffers: list = []
        with_buffers = pickle.dumps(pickle.PickleBuffer(bytearray(b"xy")), 5, buffer_callback=buffers.append)
        sender.send((with_buffers, small))
        data, got = receiver.receive()
        assert bytes(data) == with_buffers and [bytes(b) for b in got] == [b"ab", b"cde"]
        assert all(isinstance(b, bytearray) for b in got)
        sender.link.send(b"not a call", -1)
        with pytest.raises(ConnectionError, match="not a call"):
            receiver.receive()
    finally:
        sender.close()
        receiver.close()
