"""Which local address a listening socket binds, given the address peers are told.

A process advertises one address (the backend's ``listen_host``: a loopback, the
container's address on its Docker network, the network's gateway on the host, a pod's
IP). It listens there only, not on every interface, whenever that address belongs to
this machine; a name, or an address that is not this machine's (a NAT, a load
balancer in front), leaves no choice but every interface. Where nothing says which
address to advertise, :func:`routed_address` names the one peers over there can reach.
"""
from __future__ import annotations

import ipaddress
import socket

LOOPBACK = ("127.0.0.1", "localhost", "::1")


def bind_host(host: str) -> str:
    """``host`` (as given, brackets and all) when this machine can bind it, else the
    wildcard address of its family (``0.0.0.0`` or ``::``)."""
    bare = host.strip("[]")
    if bare in LOOPBACK:
        return host
    try:
        version = ipaddress.ip_address(bare).version
    except ValueError:
        return "0.0.0.0"  # a name: the addresses it stands for may change
    family = socket.AF_INET6 if version == 6 else socket.AF_INET
    try:
        with socket.socket(family, socket.SOCK_STREAM) as probe:
            probe.bind((bare, 0))
    except OSError:
        return "[::]" if version == 6 else "0.0.0.0"
    return host


def routed_address(host: str, port: int) -> str:
    """This machine's IPv4 address that traffic to ``host``:``port`` leaves from (the
    route the kernel would take; nothing is sent), else loopback."""
    try:
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe:
            probe.connect((host, port))  # UDP: a connect only picks the route
            return probe.getsockname()[0]
    except OSError:
        return "127.0.0.1"
