"""Managers reached by address and key: ``BaseManager(address=..., authkey=...)``,
``connect()``, ``get_server().serve_forever()``, restarts, and proxies like the stdlib's."""
from __future__ import annotations

import gc
import os
import re
import subprocess
import textwrap
import threading
import time

import pytest

import fiberlite
from fiberlite.errors import AuthenticationError, ConnectionLost
from fiberlite.managers import NotExposedError, RemoteError, SyncManager
from fiberlite.managers.calls import _pending
from fiberlite.managers.remote import url_of
from fiberlite.runtime.dialed import flush
from remote_managed import CounterProxy, QueueClient, QueueManager, put_numbers, shared_queue
from interpreters import run_python

pytestmark = pytest.mark.timeout(90)
ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


OUTSIDE = textwrap.dedent("""
    import sys
    from fiberlite.managers import BaseManager
    class QueueClient(BaseManager):
        pass
    QueueClient.register("get_queue")
    address, key, first, count = eval(sys.argv[1]), bytes.fromhex(sys.argv[2]), *map(int, sys.argv[3:5])
    client = QueueClient(address=address, authkey=key)
    try:
        client.connect()
    except Exception as exc:
        print(type(exc).__name__, exc)
        sys.exit(3)
    q = client.get_queue()
    for n in range(first, first + count):
        q.put(n)
""")


def run_outside(address, key: bytes, first: int, count: int) -> subprocess.CompletedProcess:
    """A plain Python process, not a job of this run: no FIBERLITE_* in its environment."""
    return run_python("-c", OUTSIDE, repr(address), key.hex(), first, count, clean=True, timeout=60)


def drain(q, count: int) -> list:
    return sorted(q.get(timeout=20) for _ in range(count))


# -- tests ----------------------------------------------------------------------------------------
def test_a_process_outside_the_run_and_a_job_reach_a_started_manager_by_address_and_key():
    key = os.urandom(32)
    manager = QueueManager(address=("127.0.0.1", 0), authkey=key)
    manager.start()
    try:
        host, port = manager.address
        assert host == "127.0.0.1" and port > 0
        outside = run_outside(manager.address, key, 0, 50)
        assert outside.returncode == 0, outside.stdout + outside.stderr
        job = fiberlite.Process(target=put_numbers, args=(manager.address, key, 50, 50))
        job.start()
        job.join(30)
        assert job.exitcode == 0
        q = manager.get_queue()
        assert drain(q, 100) == list(range(100))       # every item once, none lost
        assert q.qsize() == 0                          # and none duplicated
    finally:
        manager.shutdown()


def test_a_wrong_key_is_refused_fast_and_the_manager_serves_on():
    key = os.urandom(32)
    with QueueManager(address=("127.0.0.1", 0), authkey=key) as manager:
        started = time.monotonic()
        outside = run_outside(manager.address, b"wrong key", 0, 1)
        assert outside.returncode == 3, outside.stdout + outside.stderr
        assert "AuthenticationError" in outside.stdout
        assert time.monotonic() - started < 30
        with pytest.raises(AuthenticationError):
            QueueClient(address=manager.address, authkey=b"wrong key").connect()
        manager.get_queue().put("still serving")
        assert manager.get_queue().get(timeout=10) == "still serving"


def test_get_server_serves_registered_types_to_jobs():
    key = os.urandom(16)
    server = QueueManager(address=("127.0.0.1", 0), authkey=key).get_server()
    serving = threading.Thread(target=server.serve_forever, daemon=True)
    serving.start()
    try:
        job = fiberlite.Process(target=put_numbers, args=(server.address, key, 0, 20))
        job.start()
        job.join(30)
        assert job.exitcode == 0
        assert drain(shared_queue(), 20) == list(range(20))  # the queue of this process

        manager = QueueManager(address=server.address, authkey=key)
        manager.connect()
        counter = manager.Counter(5)                   # proxytype given
        assert type(counter) is CounterProxy and counter.add(2) == 7
        doubled = counter.double()                     # method_to_typeid: a proxy back
        assert isinstance(doubled, CounterProxy) and doubled.get() == 14
        auto = manager.AutoCounter(1)                  # exposed given
        assert auto.add(1) == 2 and not hasattr(auto, "secret")
        with pytest.raises(RemoteError) as raised:
            auto._callmethod("secret")
        assert isinstance(raised.value, NotExposedError) and "exposed" in str(raised.value)
        assert not hasattr(QueueManager, "hidden")     # create_method=False
    finally:
        server.stop()
        serving.join(10)
    assert not serving.is_alive()


def test_a_manager_restarts_on_the_address_it_was_shut_down_on():
    key = os.urandom(16)
    first = QueueManager(address=("127.0.0.1", 0), authkey=key)
    first.start()
    address = first.address
    first.get_queue().put("first")
    first.shutdown()
    second = QueueManager(address=address, authkey=key)
    second.start()                                      # right after, same port
    try:
        assert second.address == address
        q = second.get_queue()
        assert q.qsize() == 0                           # a new server, not the old one
        q.put("second")
        assert q.get(timeout=10) == "second"
    finally:
        second.shutdown()


def test_a_proxy_of_a_shut_down_manager_fails_clearly_at_a_new_manager_on_its_address():
    """Object ids start at 1 on every server: a proxy of the manager shut down must not
    reach the object with its id in the manager now listening on the same port."""
    key = os.urandom(16)
    first = SyncManager(address=("127.0.0.1", 0), authkey=key)
    first.start()
    address = first.address
    stale, stale_dict = first.list(["first"]), first.dict(a=1)
    connected = SyncManager(address=address, authkey=key)
    connected.connect()
    first.shutdown()
    second = SyncManager(address=address, authkey=key)
    second.start()                                      # same port, ids from 1 again
    try:
        kept, kept_dict = second.list([1, 2]), second.dict(b=2)
        for use in (lambda: stale.append("x"), lambda: stale[:], lambda: stale_dict["a"],
                    lambda: stale_dict.update(a=5), connected.list):
            with pytest.raises(ConnectionLost, match="another manager now listens at "
                                                     + re.escape(url_of(address))):
                use()
        del stale, stale_dict                           # their decrefs must not free kept's
        gc.collect()
        assert _pending.sync(30), "the decrefs were not sent"
        flush()                                         # and handled where they went
        assert second._number_of_objects() == 2
        assert kept[:] == [1, 2] and kept_dict.copy() == {"b": 2}
    finally:
        second.shutdown()


def test_manager_factory_with_an_address_and_bad_arguments():
    key = os.urandom(16)
    manager = fiberlite.Manager(address=("127.0.0.1", 0), authkey=key)
    try:
        shared = manager.list([1, 2])
        other = SyncManager(address=manager.address, authkey=key)
        other.connect()
        assert other.list(["x"])[:] == ["x"] and shared[:] == [1, 2]
    finally:
        manager.shutdown()
    with pytest.raises(ValueError, match=r"\(host, port\)"):
        SyncManager(address=("127.0.0.1", "port"))
    with pytest.raises(TypeError, match="authkey must be bytes"):
        SyncManager(address=("127.0.0.1", 0), authkey="text")
    with pytest.raises(ValueError, match="address"):
        SyncManager().get_server()
    started = time.monotonic()
    with pytest.raises(ConnectionError):
        QueueClient(address=("127.0.0.1", 1), authkey=key).connect()  # nothing listens
    assert time.monotonic() - started < 15


def change_during_iteration(shared, seen):
    for index, item in enumerate(shared):
        if index == 0:
            shared[1] = 100                             # changed after iter() began
        seen.append(item)


def test_iterating_a_list_proxy_sees_changes_made_during_the_iteration():
    with SyncManager() as manager:
        shared = manager.list([1, 2, 3])
        seen = manager.list()
        job = fiberlite.Process(target=change_during_iteration, args=(shared, seen))
        job.start()
        job.join(30)
        assert job.exitcode == 0
        assert seen[:] == [1, 100, 3]
        it = iter(shared)
        shared[0] = 7
        assert list(it) == [7, 100, 3]


@pytest.mark.docker
@pytest.mark.timeout(600)
def test_a_manager_server_in_a_container_is_reached_by_address_from_outside_the_run():
    from docker_env import ensure_docker
    from fiberlite import config
    image = ensure_docker()  # RuntimeError with the reason when Docker cannot be provisioned
    saved = dict(config._overrides)
    fiberlite.init(image=image)
    try:
        key = os.urandom(32)
        manager = QueueManager(address=("127.0.0.1", 0), authkey=key,
                               ctx=fiberlite.get_context("docker"))
        manager.start()
        try:
            assert os.environ.get("FIBERLITE_DOCKER_CONTAINER") is None
            outside = run_outside(manager.address, key, 0, 30)
            assert outside.returncode == 0, outside.stdout + outside.stderr
            q = manager.get_queue()
            assert drain(q, 30) == list(range(30)) and q.qsize() == 0
        finally:
            manager.shutdown()
        assert manager._process.exitcode is not None
    finally:
        config._overrides.clear()
        config._overrides.update(saved)
        config.init()
