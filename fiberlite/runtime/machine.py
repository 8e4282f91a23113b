"""Which processes share a machine: the boot id of the kernel and the network namespace.

A hostname is not enough: containers on the host's network share the host's name, and
names can be set at will. Two processes with the same :func:`machine_id` run under one
kernel (same boot) and reach each other on loopback (same network namespace).
"""
from __future__ import annotations

import functools
import os
import socket
from typing import Any

from .. import config

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


def same_machine(owner: Any) -> bool:
    """Whether the process that owns ``owner`` (an object reference) shares this machine
    and its network namespace, so that a Unix socket reaches it: its :func:`machine_id`,
    asked once per process (the servant's ``machine`` operation), is this one's. With the
    ``share_machine`` setting off, every process is treated as one of another machine."""
    if not config.get("share_machine"):
        return False
    address = owner.address
    known = _machines.get(address)
    if known is None:
        try:
            known = _machines[address] = owner.call("machine")
        except (ConnectionError, ReferenceError):
            return False
    return known == machine_id()


_machines: dict[str, str] = {}  # a hub's address -> the machine_id of its process
