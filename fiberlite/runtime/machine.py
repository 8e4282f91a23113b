"""Which processes share a machine: the boot id of the kernel and the network namespace.

A hostname is not enough: containers on the host's network share the host's name, and
names can be set at will. Two processes with the same :func:`machine_id` run under one
kernel (same boot) and reach each other on loopback (same network namespace).
"""
from __future__ import annotations

import functools
import os
import socket

from .. import config
from ..wire.binding import LOOPBACK
from ..wire.tls import host_port

BOOT_ID = "/proc/sys/kernel/random/boot_id"
NETWORK_NAMESPACE = "/proc/self/ns/net"


@functools.lru_cache(maxsize=None)
def machine_id() -> str:
    """This process's kernel boot and network namespace (``boot/netns``); where Linux's
    ``/proc`` does not say, the hostname."""
    try:
        with open(BOOT_ID) as f:
            boot = f.read().strip()
        namespace = os.stat(NETWORK_NAMESPACE).st_ino
    except OSError:
        return f"host:{socket.gethostname()}"
    return f"{boot}/{namespace}"


def same_machine(address: str) -> bool:
    """Whether the process listening at ``address`` (a hub's) shares this machine and its
    network namespace, so that a Unix socket reaches it: an address on loopback (and the
    ``share_machine`` setting on: off, every job is treated as one of another machine)."""
    return host_port(address)[0].strip("[]") in LOOPBACK and config.get("share_machine")
