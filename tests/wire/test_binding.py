"""Listening sockets bind the address their process advertises when it is one of this
machine's (a container's or pod's IP, a Docker network's gateway), not every interface.
127.0.0.2 stands for such an address here: it is this machine's, and not 127.0.0.1."""
from __future__ import annotations

import socket

import psutil
import pytest

from fiberlite.ring.link import NeighbourLink
from fiberlite.wire import tcp
from fiberlite.wire.binding import bind_host, routed_address
from fiberlite.wire.link.nng import _listening
from fiberlite.wire.link.tcp import TcpLink
from fiberlite.wire.server import Server

KEY = b"k" * 32
OWN = "127.0.0.2"


def listening_ips(port: int) -> set[str]:
    me = psutil.Process()
    return {c.laddr.ip for c in me.net_connections(kind="tcp")
            if c.status == psutil.CONN_LISTEN and c.laddr.port == port}


def reachable(host: str, port: int) -> bool:
    try:
        socket.create_connection((host, port), timeout=5).close()
        return True
    except OSError:
        return False


@pytest.mark.parametrize("host, bound", [
    ("127.0.0.1", "127.0.0.1"), ("localhost", "localhost"), ("[::1]", "[::1]"),
    (OWN, OWN),
    ("198.51.100.7", "0.0.0.0"),      # not this machine's (documentation range): all interfaces
    ("jobs.example.internal", "0.0.0.0"),  # a name: all interfaces
])
def test_bind_host(host, bound):
    assert bind_host(host) == bound


def test_hub_server_listens_on_the_advertised_address_only():
    server = Server(KEY, OWN, lambda request, message: None, lambda peer: None, lambda fn: fn())
    try:
        assert server.address == f"tcp://{OWN}:{server.port}"
        assert listening_ips(server.port) == {OWN}
        assert reachable(OWN, server.port) and not reachable("127.0.0.1", server.port)
    finally:
        server.close()


def test_pipe_link_listens_on_the_advertised_address_only():
    sock, address = _listening(OWN)
    with sock:
        port = int(address.rsplit(":", 1)[1])
        assert address == f"tcp://{OWN}:{port}" and listening_ips(port) == {OWN}


def test_tcp_link_listens_on_the_advertised_address_only():
    link = TcpLink.listen(OWN, KEY)
    try:
        host, port = tcp.host_port(link.address)
        assert host == OWN and listening_ips(port) == {OWN}
    finally:
        link.close()


def test_ring_link_binds_the_advertised_address():
    link = NeighbourLink(OWN)
    try:
        assert listening_ips(tcp.host_port(link.address)[1]) == {OWN}
    finally:
        link.close()
    sock, port = tcp.listen("198.51.100.7", 4)   # not this machine's: every interface
    with sock:
        assert sock.getsockname()[0] == "0.0.0.0" and listening_ips(port) == {"0.0.0.0"}


def test_the_routed_address_is_the_one_traffic_to_the_host_leaves_from():
    assert routed_address("127.0.0.1", 443) == "127.0.0.1"
    local = {a.address for addrs in psutil.net_if_addrs().values() for a in addrs
             if a.family == socket.AF_INET}
    assert routed_address("10.255.255.255", 443) in local  # what the Kubernetes backend asks
