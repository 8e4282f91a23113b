"""Parsing of resource quantities (memory sizes, CPU counts) as Kubernetes writes them,
and the check of a blocking call's timeout."""
from __future__ import annotations

import math
import re
from typing import Any

_SUFFIXES = {
    "": 1, "k": 10**3, "M": 10**6, "G": 10**9, "T": 10**12,
    "Ki": 2**10, "Mi": 2**20, "Gi": 2**30, "Ti": 2**40,
    "K": 10**3, "KB": 10**3, "MB": 10**6, "GB": 10**9, "TB": 10**12,
}
_QUANTITY = re.compile(r"^\s*([0-9]+(?:\.[0-9]+)?)\s*([A-Za-z]*)\s*$")


def parse_memory(value: int | float | str) -> int:
    """Bytes from ``512Mi``, ``8Gi``, ``1G`` or a number of bytes."""
    if isinstance(value, bool):
        raise ValueError(f"{value!r} is not a memory size")
    if isinstance(value, (int, float)):
        if value <= 0:
            raise ValueError(f"memory must be positive, got {value!r}")
        return int(value)
    match = _QUANTITY.match(str(value))
    if not match or match.group(2) not in _SUFFIXES:
        raise ValueError(f"{value!r} is not a memory size (examples: 512Mi, 8Gi, 2G, 1048576)")
    size = int(float(match.group(1)) * _SUFFIXES[match.group(2)])
    if size <= 0:
        raise ValueError(f"memory must be positive, got {value!r}")
    return size


def parse_cpu(value: int | float | str) -> float:
    """CPUs from ``2``, ``0.5`` or ``500m``."""
    if isinstance(value, bool):
        raise ValueError(f"{value!r} is not a CPU count")
    text = str(value).strip()
    try:
        cpus = float(text[:-1]) / 1000 if text.endswith("m") else float(text)
    except ValueError:
        raise ValueError(f"{value!r} is not a CPU count (examples: 2, 0.5, 500m)") from None
    if cpus <= 0:
        raise ValueError(f"cpu must be positive, got {value!r}")
    return cpus


def parse_count(value: int | str) -> int:
    """A non-negative whole number (GPUs)."""
    if isinstance(value, bool):
        raise ValueError(f"{value!r} is not a whole number")
    try:
        count = int(str(value).strip())
    except ValueError:
        raise ValueError(f"{value!r} is not a whole number") from None
    if count < 0:
        raise ValueError(f"expected a number >= 0, got {value!r}")
    return count


def format_memory(size: int) -> str:
    """``size`` bytes as a Kubernetes quantity (``536870912`` -> ``512Mi``)."""
    for suffix in ("Ti", "Gi", "Mi", "Ki"):
        unit = _SUFFIXES[suffix]
        if size % unit == 0:
            return f"{size // unit}{suffix}"
    return str(size)


def human_bytes(size: int) -> str:
    """``size`` bytes for people: ``812 B``, ``4.0 KiB``, ``45.2 MiB``, ``3.6 TiB``."""
    amount = float(size)
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if amount < 1024 or unit == "TiB":
            return f"{size} B" if unit == "B" else f"{amount:.1f} {unit}"
        amount /= 1024
    raise AssertionError("unreachable")


def check_timeout(timeout: Any) -> None:
    """Refuse a timeout that is not a real number (``TypeError: must be real number, not
    str``), as ``multiprocessing`` does before it takes anything; None (no limit) passes."""
    if timeout is not None and type(timeout) is not float and type(timeout) is not int:
        math.isnan(timeout)  # (reads it as the C code of multiprocessing does)
