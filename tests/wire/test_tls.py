"""The ``tls`` setting: traffic between jobs over TLS keyed by the run's key."""
from __future__ import annotations

import pickle
import socket
import textwrap

import pynng
import pytest

from fiberlite.runtime import identity
from fiberlite.errors import AuthenticationError
from fiberlite.wire import tls
from fiberlite.wire.client import Client
from fiberlite.wire.server import Server
from unpickle_trap import Trace
from interpreters import run_python

pytestmark = pytest.mark.timeout(120)


@pytest.fixture
def tls_server():
    server = Server(identity.key(), "127.0.0.1", lambda request, message: request.reply(message),
                    lambda peer: None, lambda fn: fn(), use_tls=True)
    yield server
    server.close()


def test_requests_travel_over_tls_with_the_runs_key(tls_server):
    assert tls_server.address.startswith("tls+tcp://127.0.0.1:")
    client = Client(tls_server.address, identity.key())
    try:
        assert client.request(("echo", [1, 2])) == (True, ("echo", [1, 2]))
    finally:
        client.close()


def test_another_runs_key_cannot_even_start_tls(tls_server):
    with pytest.raises(AuthenticationError, match="refused TLS"):
        Client(tls_server.address, b"another run's key" * 2)


def test_plain_tcp_to_a_tls_port_is_dropped_and_nothing_is_loaded(tls_server, tmp_path):
    marker = tmp_path / "unpickled"
    host, port = tls.host_port(tls_server.address)
    with pytest.raises(ConnectionError):
        Client(f"tcp://{host}:{port}", identity.key(), connect_timeout=5)
    with socket.create_connection((host, port), timeout=10) as sock:
        sock.sendall(pickle.dumps(Trace(str(marker))) * 10)
        sock.settimeout(10)
        try:
            while sock.recv(4096):  # the server answers with TLS alerts at most, then closes
                pass
        except (ConnectionResetError, TimeoutError):
            pass
    assert not marker.exists()
    client = Client(tls_server.address, identity.key())   # still serving
    assert client.request("ok") == (True, "ok")
    client.close()


def test_the_bytes_on_the_wire_are_not_the_pickles(tls_server):
    # a raw nng pair cannot read anything from a TLS listener: its first bytes are a
    # TLS handshake, not nng's header
    sock = pynng.Pair0(recv_timeout=2000, send_timeout=2000)
    try:
        with pytest.raises(pynng.NNGException):
            sock.dial(tls_server.address.replace("tls+tcp://", "tcp://"), block=True)
            sock.send(b"hello")
            sock.recv()
    finally:
        sock.close()


SCRIPT = textwrap.dedent("""
    import numpy as np
    import fiberlite
    from fiberlite.runtime.hub import get_hub

    def echo(q_in, q_out, conn):
        q_out.put(q_in.get() * 2)
        conn.send(conn.recv() + 1)

    def reduce(ring):
        big = np.full(1_000_000, ring.rank + 1.0, np.float32)      # the ring path
        small = np.full(10, ring.rank + 1.0)                        # the gather path
        return float(ring.all_reduce(big)[-1]), float(ring.all_reduce(small)[0])

    if __name__ == "__main__":
        q_in, q_out = fiberlite.Queue(), fiberlite.Queue()
        here, there = fiberlite.Pipe()
        p = fiberlite.Process(target=echo, args=(q_in, q_out, there))
        p.start()
        q_in.put(21)
        here.send(41)
        print(get_hub().address.split(":")[0], q_out.get(timeout=60), here.recv(), flush=True)
        p.join(60)
        print(fiberlite.Ring(2, reduce, timeout=60).run(), p.exitcode, flush=True)
""")


def test_a_run_with_tls_uses_it_for_queues_pipes_and_ring_reductions(tmp_path):
    script = tmp_path / "run.py"
    script.write_text(SCRIPT)
    out = run_python(script, env={"FIBERLITE_TLS": "1"}, timeout=100)
    assert out.returncode == 0, out.stderr
    first, second = out.stdout.splitlines()
    assert first == "tls+tcp 42 42"
    assert second == "[(3.0, 3.0), (3.0, 3.0)] 0"
