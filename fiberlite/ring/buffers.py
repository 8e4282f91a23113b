"""The flat buffers collectives work on: nested data flattened into them and rebuilt.

:func:`flatten` turns nested dict/list/tuple of numpy arrays, torch tensors and
Python numbers into flat numpy arrays plus a function that rebuilds the structure;
:func:`fuse` packs the leaves into one buffer per dtype (Horovod-style tensor fusion)
and :func:`fuse_sharded` lays them out shard-major for reduce-scatter. :func:`to_host`
and :func:`from_host` carry accelerator tensors through host memory for collectives
that send whole objects. :class:`Buffers` is the memory results are made in, reused.

The algorithms that move these buffers between ranks are in
:mod:`fiberlite.ring.collectives`; :class:`~fiberlite.ring.member.Member` uses both.
"""
from __future__ import annotations

import copy
import sys
from typing import Any, Callable, Sequence

import numpy as np

INT64_RANGE = (-(1 << 63), (1 << 63) - 1)


# -- nested data ----------------------------------------------------------------------------
Restore = Callable[[np.ndarray, str, bool], Any]   # (flat values, op, shard) -> leaf


def flatten(data: Any, what: str = "all_reduce") -> tuple[list[np.ndarray], Callable[..., Any]]:
    """The leaves of ``data`` as 1-D numpy arrays, and ``rebuild(values, op, shard=False)``
    that puts result arrays (same order) back into ``data``'s structure and types."""
    leaves: list[np.ndarray] = []

    def walk(obj: Any, path: str) -> Callable[[list, str, bool], Any]:
        if obj is None:
            return lambda values, op, shard: None
        if isinstance(obj, dict):
            keys = list(obj)
            parts = [walk(obj[k], f"{path}[{k!r}]") for k in keys]

            def rebuild_dict(values, op, shard, obj=obj, keys=keys, parts=parts):
                items = [(k, p(values, op, shard)) for k, p in zip(keys, parts, strict=True)]
                if type(obj) is dict:
                    return dict(items)
                try:
                    out = copy.copy(obj)
                    out.clear()
                    out.update(items)
                    return out
                except Exception:
                    return dict(items)
            return rebuild_dict
        if isinstance(obj, (list, tuple)):
            parts = [walk(item, f"{path}[{i}]") for i, item in enumerate(obj)]

            def rebuild_seq(values, op, shard, obj=obj, parts=parts):
                items = [p(values, op, shard) for p in parts]
                kind = type(obj)
                if kind is list or kind is tuple:
                    return kind(items)
                try:
                    return kind(*items) if hasattr(obj, "_fields") else kind(items)
                except Exception:
                    return list(items) if isinstance(obj, list) else tuple(items)
            return rebuild_seq
        array, restore = _leaf(obj, path, what)
        index = len(leaves)
        leaves.append(array)
        return lambda values, op, shard: restore(values[index], op, shard)

    top = walk(data, "data")

    def rebuild(values: Sequence[np.ndarray], op: str, shard: bool = False) -> Any:
        return top(list(values), op, shard)
    return leaves, rebuild


def _leaf(obj: Any, path: str, what: str) -> tuple[np.ndarray, Restore]:
    if isinstance(obj, np.ndarray):
        _check_dtype(obj.dtype, path, what)
        shape = obj.shape
        return obj.reshape(-1), lambda x, op, shard: x if shard else x.reshape(shape)
    if isinstance(obj, np.generic):
        _check_dtype(obj.dtype, path, what)
        return np.asarray(obj).reshape(1), lambda x, op, shard: x if shard else x.reshape(())[()]
    if isinstance(obj, bool):
        def restore_bool(x, op, shard):
            if shard:
                return x
            value = x[0].item()
            return bool(value) if op in ("max", "min") else value
        return np.array([int(obj)], np.int64), restore_bool
    if isinstance(obj, int):
        if not INT64_RANGE[0] <= obj <= INT64_RANGE[1]:
            raise OverflowError(f"{what}: the Python int at {path} does not fit in 64 bits")
        return np.array([obj], np.int64), _restore_number
    if isinstance(obj, float):
        return np.array([obj], np.float64), _restore_number
    if isinstance(obj, complex):
        return np.array([obj], np.complex128), _restore_number
    torch = sys.modules.get("torch")
    if torch is not None and isinstance(obj, torch.Tensor):
        return _tensor_leaf(torch, obj)
    raise TypeError(f"{what}: cannot reduce a {type(obj).__name__} at {path}; leaves must be "
                    "numpy arrays, torch tensors or numbers, in dicts, lists and tuples "
                    "(use all_gather or broadcast for other objects)")


def _restore_number(x: np.ndarray, op: str, shard: bool) -> Any:
    return x if shard else x[0].item()


def _check_dtype(dtype: np.dtype, path: str, what: str) -> None:
    if dtype.kind not in "biufc":
        raise TypeError(f"{what}: cannot reduce an array of dtype {dtype} at {path}; "
                        "use numbers (bool, int, float, complex dtypes)")


def _tensor_leaf(torch: Any, tensor: Any) -> tuple[np.ndarray, Restore]:
    device, dtype, shape = tensor.device, tensor.dtype, tuple(tensor.shape)
    host = tensor.detach()
    if host.device.type != "cpu":
        host = host.cpu()  # GPU tensors travel through host memory
    try:
        array = host.contiguous().numpy()
        converted = False
    except TypeError:  # bfloat16 and other dtypes numpy lacks
        array = host.to(torch.float32).contiguous().numpy()
        converted = True

    def restore(x: np.ndarray, op: str, shard: bool) -> Any:
        out = torch.from_numpy(x if shard else x.reshape(shape))
        if converted and out.dtype == torch.float32:
            out = out.to(dtype)
        if device.type != "cpu":
            out = out.to(device)
        return out
    return array.reshape(-1), restore


class OnDevice:
    """A tensor that lived on an accelerator, carried in host memory."""

    __slots__ = ("tensor", "device_type")

    def __init__(self, tensor: Any, device_type: str) -> None:
        self.tensor = tensor
        self.device_type = device_type

    def __reduce__(self):
        return (OnDevice, (self.tensor, self.device_type))


def _map_tensors(obj: Any, fn: Callable[[Any], Any], kind: type) -> Any:
    if isinstance(obj, kind):
        return fn(obj)
    if type(obj) is dict:
        return {k: _map_tensors(v, fn, kind) for k, v in obj.items()}
    if type(obj) in (list, tuple):
        return type(obj)(_map_tensors(v, fn, kind) for v in obj)
    return obj


def to_host(obj: Any) -> Any:
    """``obj`` with accelerator tensors (in dicts, lists, tuples) moved to host memory."""
    torch = sys.modules.get("torch")
    if torch is None:
        return obj
    return _map_tensors(obj, lambda t: OnDevice(t.detach().cpu(), t.device.type)
                        if t.device.type != "cpu" else t, torch.Tensor)


def from_host(obj: Any) -> Any:
    """Undo :func:`to_host` on the receiver: tensors go to this job's current device."""
    if sys.modules.get("torch") is None:
        return obj
    return _map_tensors(obj, lambda o: o.tensor.to(o.device_type), OnDevice)


# -- fusion ------------------------------------------------------------------------------
Where = list[tuple[int, int, int]]   # per leaf: (group, start, stop)


def fuse(arrays: Sequence[np.ndarray]) -> tuple[list[np.ndarray], Where]:
    """One flat buffer per dtype (dtypes in a fixed order), and where each leaf is.
    A dtype with a single leaf keeps that leaf as its buffer (no copy: read only!)."""
    by_dtype: dict[np.dtype, list[int]] = {}
    for i, a in enumerate(arrays):
        by_dtype.setdefault(a.dtype, []).append(i)
    where: Where = [(0, 0, 0)] * len(arrays)
    groups = []
    for g, dtype in enumerate(sorted(by_dtype, key=lambda d: d.str)):
        members = by_dtype[dtype]
        if len(members) == 1:
            groups.append(arrays[members[0]])
            where[members[0]] = (g, 0, arrays[members[0]].size)
            continue
        flat = np.empty(sum(arrays[i].size for i in members), dtype)
        offset = 0
        for i in members:
            n = arrays[i].size
            flat[offset:offset + n] = arrays[i]
            where[i] = (g, offset, offset + n)
            offset += n
        groups.append(flat)
    return groups, where


def split_bounds(size: int, parts: int) -> list[int]:
    """Offsets of ``parts`` nearly equal pieces of ``size`` (the first ``size % parts``
    pieces one element longer: numpy.array_split's layout)."""
    q, rem = divmod(size, parts)
    bounds = [0]
    for i in range(parts):
        bounds.append(bounds[-1] + q + (1 if i < rem else 0))
    return bounds


def fuse_sharded(arrays: Sequence[np.ndarray], parts: int, rank: int
                 ) -> tuple[list[np.ndarray], list[list[int]], Where]:
    """Like :func:`fuse`, laid out shard-major for reduce-scatter: segment ``j`` of a
    group is shard ``j`` of each of its leaves, in order. Returns the groups, their
    segment bounds, and where ``rank``'s shard of each leaf is."""
    by_dtype: dict[np.dtype, list[int]] = {}
    for i, a in enumerate(arrays):
        by_dtype.setdefault(a.dtype, []).append(i)
    where: Where = [(0, 0, 0)] * len(arrays)
    groups, segments = [], []
    for g, dtype in enumerate(sorted(by_dtype, key=lambda d: d.str)):
        members = by_dtype[dtype]
        leaf_bounds = {i: split_bounds(arrays[i].size, parts) for i in members}
        if len(members) == 1:  # one leaf is already shard-major
            (i,) = members
            groups.append(arrays[i])
            segments.append(leaf_bounds[i])
            where[i] = (g, leaf_bounds[i][rank], leaf_bounds[i][rank + 1])
            continue
        flat = np.empty(sum(arrays[i].size for i in members), dtype)
        seg_bounds = [0]
        offset = 0
        for j in range(parts):
            for i in members:
                lo, hi = leaf_bounds[i][j], leaf_bounds[i][j + 1]
                flat[offset:offset + hi - lo] = arrays[i][lo:hi]
                if j == rank:
                    where[i] = (g, offset, offset + hi - lo)
                offset += hi - lo
            seg_bounds.append(offset)
        groups.append(flat)
        segments.append(seg_bounds)
    return groups, segments, where


# -- result memory ----------------------------------------------------------------------------
class Buffers:
    """Memory for large results, used again once no array refers to it any more.

    Fresh memory costs a page fault and the kernel zeroing every page at first touch,
    about as much as the reduction itself; a loop that reduces arrays of the same sizes
    step after step gets back memory it has already touched. Every array made from a
    block refers to that block (numpy points the base of every view at the array that
    owns the memory), so a block whose reference count is back to the pool's own is
    unused. At most ``max_blocks`` blocks and ``max_bytes`` bytes are kept; unused
    blocks go first, least recently used first.
    """

    def __init__(self, max_blocks: int = 8, max_bytes: int = 1 << 30,
                 min_bytes: int = 1 << 20) -> None:
        # reference counts tell when a block is free only on CPython
        self.max_blocks = max_blocks if sys.implementation.name == "cpython" else 0
        self.max_bytes = max_bytes
        self.min_bytes = min_bytes
        self._blocks: list[np.ndarray] = []   # uint8 arrays, least recently used first

    def _unused(self, i: int) -> bool:
        return sys.getrefcount(self._blocks[i]) <= 2   # the list's reference and the argument

    def empty(self, size: int, dtype: Any) -> np.ndarray:
        """An uninitialised 1-D array of ``size`` elements of ``dtype``."""
        dtype = np.dtype(dtype)
        nbytes = size * dtype.itemsize
        if nbytes < self.min_bytes or nbytes > self.max_bytes or not self.max_blocks:
            return np.empty(size, dtype)
        blocks = self._blocks
        for i in range(len(blocks) - 1, -1, -1):
            if nbytes <= blocks[i].nbytes <= 2 * nbytes and self._unused(i):
                block = blocks.pop(i)
                break
        else:
            self._make_room(nbytes)
            block = np.empty(nbytes, np.uint8)
        blocks.append(block)
        return block[:nbytes].view(dtype)

    def _make_room(self, nbytes: int) -> None:
        blocks = self._blocks

        def over() -> bool:
            return (len(blocks) >= self.max_blocks
                    or sum(b.nbytes for b in blocks) + nbytes > self.max_bytes)
        i = 0
        while over() and i < len(blocks):   # forget unused blocks first
            if self._unused(i):
                del blocks[i]
            else:
                i += 1
        while over() and blocks:   # then stop recycling the oldest results still in use
            del blocks[0]
