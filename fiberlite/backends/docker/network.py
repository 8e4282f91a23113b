"""What the engine tells about a network and a container: the host's address on a
network, and what a container uses (for the run's page)."""
from __future__ import annotations

import ipaddress
from typing import Any

from ...errors import BackendError


def gateway(attrs: dict, network: str) -> str:
    """The host's address on Docker network ``network``, whose inspection is ``attrs``
    (a BackendError if it has none)."""
    found = None
    for pool in (attrs.get("IPAM") or {}).get("Config") or []:
        found = (pool.get("Gateway") or "").split("/")[0] or None
        if found is None and pool.get("Subnet") and ":" not in pool["Subnet"]:
            found = str(next(ipaddress.ip_network(pool["Subnet"], strict=False).hosts()))
        if found:
            break
    if not found or attrs.get("Internal"):
        raise BackendError(
            f"Docker network {network!r} has no gateway to this host (driver "
            f"{attrs.get('Driver')!r}{', internal' if attrs.get('Internal') else ''}): "
            "use a bridge network, run this script in a container on that network, "
            "or set docker_network=host")
    return found


def container_usage(api: Any, container_id: str) -> tuple[float, int] | None:
    """CPU seconds and memory of a container, from one engine stats call (None: the
    engine could not say)."""
    try:
        stats = api.stats(container_id, stream=False, one_shot=True)
        cpu = stats["cpu_stats"]["cpu_usage"]["total_usage"] / 1e9
        memory = int(stats.get("memory_stats", {}).get("usage", 0))
    except Exception:
        return None
    return cpu, memory
