"""``@fiberlite.meta``: per-job resource requests attached to a target."""
from __future__ import annotations

from typing import Any, Callable, TypeVar

from .units import parse_count, parse_cpu, parse_memory

T = TypeVar("T")
ATTRIBUTE = "__fiberlite_meta__"


def meta(*, cpu: float | str | None = None, memory: int | str | None = None,
         gpu: int | None = None, image: str | None = None) -> Callable[[T], T]:
    """Ask for resources for every job that runs the decorated function or Process class.

    ``cpu`` in CPUs (``2``, ``0.5``, ``"500m"``), ``memory`` in bytes or as a quantity
    (``"8Gi"``), ``gpu`` a whole number, ``image`` the container image to run it in.
    """
    values: dict[str, Any] = {}
    try:
        if cpu is not None:
            values["cpu"] = parse_cpu(cpu)
        if memory is not None:
            values["memory"] = parse_memory(memory)
        if gpu is not None:
            values["gpu"] = parse_count(gpu)
    except ValueError as exc:
        raise ValueError(f"fiberlite.meta: {exc}") from None
    if image is not None:
        if not isinstance(image, str) or not image.strip():
            raise ValueError("fiberlite.meta: image must be a non-empty string")
        values["image"] = image.strip()

    def decorate(target: T) -> T:
        merged = dict(getattr(target, ATTRIBUTE, {}))
        merged.update(values)
        try:
            setattr(target, ATTRIBUTE, merged)
        except (AttributeError, TypeError):
            raise TypeError(f"fiberlite.meta cannot annotate {target!r}; decorate a function or class") from None
        return target

    return decorate


def requests_of(*targets: Any) -> dict[str, Any]:
    """The merged requests of the first targets that carry any (later ones first)."""
    merged: dict[str, Any] = {}
    for target in reversed(targets):
        if target is not None:
            merged.update(getattr(target, ATTRIBUTE, {}) or {})
    return merged
