"""Workers that are jobs of their own on the master's machine reach its dispatcher over a
Unix socket (``pool/master/nearby.py``); the pool's guarantees hold on that way too."""
from __future__ import annotations

import os
import pickle
import signal
import socket
import sys
import time

import cloudpickle
import pytest

import fiberlite
from fiberlite.pool import Pool
from fiberlite.wire.frames import header
from fiberlite.pool.job.upstream import NearbyUpstream
from fiberlite.runtime.machine import machine_id

pytestmark = pytest.mark.timeout(120)

cloudpickle.register_pickle_by_value(sys.modules[__name__])


@pytest.fixture(autouse=True)
def own_jobs():
    fiberlite.init(workers_per_job=1)
    yield
    fiberlite.init(workers_per_job=None)


def square(x):
    return x * x


def slow_square(x):
    time.sleep(0.02)
    return x * x


def _peers(pool) -> list[int]:
    return [peer for w in pool._core.dispatcher.workers.values() for peer in w.peers]


def test_workers_of_this_machine_use_the_pool_socket_and_others_the_hub(machine_path):
    with Pool(2) as pool:
        assert pool.map(square, range(50)) == [x * x for x in range(50)]
        assert [pool.apply(square, (i,)) for i in range(5)] == [0, 1, 4, 9, 16]
        peers = _peers(pool)
        assert peers
        if machine_path == "shared":
            assert pool._core.nearby is not None
            assert any(peer < 0 for peer in peers), "no worker asked over the nearby socket"
        else:
            assert pool._core.nearby is None
            assert all(peer > 0 for peer in peers), "hub connections have nng's pipe ids"


def test_a_nearby_worker_killed_mid_map_loses_no_result():
    with Pool(2) as pool:
        pids = [p.pid for p in pool._pool]
        result = pool.map_async(slow_square, range(60), chunksize=1)
        time.sleep(0.2)
        os.kill(pids[0], signal.SIGKILL)
        assert result.get(timeout=60) == [x * x for x in range(60)]
        assert any(peer < 0 for peer in _peers(pool))


def test_a_stranger_on_the_pool_socket_is_closed_and_nothing_it_sent_is_loaded(tmp_path):
    marker = tmp_path / "loaded"

    class Bomb:
        def __reduce__(self):
            return (os.mkdir, (str(marker),))

    with Pool(2) as pool:
        assert pool.map(square, range(4)) == [0, 1, 4, 9]
        stranger = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        stranger.settimeout(30)
        stranger.connect("\0" + pool._core.nearby.address)
        data = pickle.dumps((1, "next", (Bomb(),)))
        stranger.sendall(header(len(data)) + data)
        try:
            answer = stranger.recv(100)
        except ConnectionResetError:  # closed with what it sent unread
            answer = b""
        assert answer == b"", "the connection stays open without the key"
        stranger.close()
        assert not marker.exists(), "a pickle was loaded before the key was proven"
        assert pool.map(square, range(20)) == [x * x for x in range(20)]


class _Hub:
    def begin(self, method, *args):
        return method

    def finish(self, handle):
        return ("hub", handle)


def test_a_worker_takes_its_hub_when_the_socket_is_not_on_its_machine_or_not_there():
    waiting = (1, [], None, 1, False)  # a request for work that is not a prefetch
    elsewhere = NearbyUpstream(_Hub(), "fiberlite-pool-any", "another-boot/1")
    assert elsewhere.call("next", *waiting) == ("hub", "next")
    gone = NearbyUpstream(_Hub(), f"fiberlite-pool-{os.getpid()}-nothing-listens", machine_id())
    assert gone.call("next", *waiting) == ("hub", "next")
    unknown = NearbyUpstream(_Hub(), None, machine_id())
    assert unknown.call("next", *waiting) == ("hub", "next")
