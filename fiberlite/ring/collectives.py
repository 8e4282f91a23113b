"""The algorithms behind :class:`fiberlite.ring.Member`'s collectives, and the
flattening of nested data they work on.

An algorithm talks to its peers through a *transport* (the member) with::

    rank, world_size
    send(dst, tag, obj)      # one-way; messages to one destination stay in order
    recv(src, tag) -> obj    # the message from ``src`` with ``tag`` (waits for it)

and, for the bulk data of the ring, byte streams to its ring neighbours
(:mod:`fiberlite.ring.link`)::

    stream_send(array) -> ticket        # to rank + 1, in order, from the array's memory
    stream_receive(into) -> ticket      # the next bytes from rank - 1, into ``into``
    wait_sent(ticket), wait_received(ticket)
    scratch(count, nbytes) -> [uint8 arrays]   # receive buffers kept between calls

- :func:`ring_reduce`: bandwidth-optimal ring reduce-scatter, optionally followed by
  the ring all-gather (together: ring all-reduce). N-1 steps each; every segment is
  cut into chunks that move on as soon as they are reduced (pipelined).
- :func:`bruck_allgather`: every rank's object to every rank in ceil(log2 N) rounds,
  N-1 blocks sent per rank (latency- and bandwidth-optimal; objects may differ in size).
- :func:`tree_broadcast`: binomial tree from the source, ceil(log2 N) rounds.

Data: :func:`flatten` turns nested dict/list/tuple of numpy arrays, torch tensors and
Python numbers into flat numpy arrays plus a function that rebuilds the structure;
:func:`fuse` packs the leaves into one buffer per dtype (Horovod-style tensor fusion).
"""
from __future__ import annotations

import copy
import struct
import sys
import zlib
from typing import Any, Callable, Protocol, Sequence

import numpy as np

OPS: dict[str, np.ufunc] = {"sum": np.add, "mean": np.add, "max": np.maximum, "min": np.minimum}
CHUNK_BYTES = 4 << 20        # the ring reduces at most this many bytes at a time, aiming at
MIN_CHUNK_BYTES = 1 << 20    # 4 chunks per segment (pipelining), and at least this many
RECEIVE_AHEAD = 2            # chunks a rank may have received before it reduced them
GATHER_BYTES = {2: 512 << 10, 3: 256 << 10, 4: 128 << 10}  # by world size: see gather_limit
INT64_RANGE = (-(1 << 63), (1 << 63) - 1)


class Transport(Protocol):
    rank: int
    world_size: int

    def send(self, dst: int, tag: Any, obj: Any) -> None: ...

    def recv(self, src: int, tag: Any) -> Any: ...

    def stream_send(self, data: np.ndarray) -> int: ...

    def stream_receive(self, into: np.ndarray) -> int: ...

    def wait_sent(self, ticket: int) -> None: ...

    def wait_received(self, ticket: int) -> None: ...

    def scratch(self, count: int, nbytes: int) -> list[np.ndarray]: ...


def gather_limit(world_size: int) -> int:
    """The largest per-dtype buffer that :func:`gather_reduce` handles better than the ring.

    Gathering moves ``world_size - 1`` whole buffers to every rank, the ring about two
    buffers' worth in ``2 (world_size - 1)`` steps. Measured on one host
    (``benchmarks/bench_allreduce.py --crossover``): gathering wins up to 512 KiB on 2
    ranks and up to about 128 KiB on 4, where the two are even; larger rings keep the
    4-rank limit (not measured here)."""
    return GATHER_BYTES.get(world_size, GATHER_BYTES[4])


def ufunc_of(op: str) -> np.ufunc:
    try:
        return OPS[op]
    except (KeyError, TypeError):
        raise ValueError(f"unknown reduction op {op!r}; use one of {', '.join(map(repr, OPS))}") from None


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


def finish_mean(flat: np.ndarray, world_size: int) -> np.ndarray:
    """Turn a sum into a mean (integers give float64, as numpy.mean)."""
    if flat.dtype.kind == "b":
        raise TypeError("op='mean' is not defined for booleans")
    if flat.dtype.kind in "iu":
        return flat.astype(np.float64) / world_size
    np.divide(flat, world_size, out=flat)
    return flat


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


# -- algorithms -----------------------------------------------------------------------------
def _check_part(data: Any, part: np.ndarray, src: int, what: str) -> None:
    if not isinstance(data, np.ndarray) or data.dtype != part.dtype or data.shape != part.shape:
        got = (f"{data.size} values of {data.dtype}" if isinstance(data, np.ndarray)
               else type(data).__name__)
        raise ValueError(f"{what}: rank {src} sent {got} where {part.size} values of {part.dtype} "
                         "were expected; every rank must pass data of the same structure, "
                         "shapes and dtypes")


_HEAD = struct.Struct("<8sIq16s16s")   # magic, checksum of tag and bounds, size, dtype, op
_MAGIC = b"FLreduce"


def _head(flat: np.ndarray, bounds: Sequence[int], ufunc: np.ufunc, tag: Any) -> np.ndarray:
    """What a rank tells its right neighbour before the data: which collective, on what."""
    check = zlib.crc32(repr((tag, [int(b) for b in bounds])).encode())
    return np.frombuffer(_HEAD.pack(_MAGIC, check, flat.size, flat.dtype.str.encode(),
                                    ufunc.__name__.encode()[:16]), np.uint8).copy()


def _check_head(theirs: np.ndarray, mine: np.ndarray, left: int, what: str) -> None:
    if np.array_equal(theirs, mine):
        return
    magic, _, size, dtype, op = _HEAD.unpack(theirs.tobytes())
    _, _, my_size, my_dtype, my_op = _HEAD.unpack(mine.tobytes())
    if magic != _MAGIC:
        raise RuntimeError(f"{what}: rank {left} is not in the same collective (the ring is out of step)")

    def name(raw: bytes) -> str:
        return raw.rstrip(b"\0").decode()
    if (size, dtype) != (my_size, my_dtype):
        raise ValueError(f"{what}: rank {left} passed {size} values of {np.dtype(name(dtype))} where "
                         f"{my_size} values of {np.dtype(name(my_dtype))} were expected; every rank "
                         "must pass data of the same structure, shapes and dtypes")
    if op != my_op:
        raise ValueError(f"{what}: rank {left} reduces with {name(op)}, this rank with {name(my_op)}")
    raise ValueError(f"{what}: rank {left} is in another collective or passed data of another "
                     "structure; every rank must call the same collectives in the same order")


def ring_reduce(t: Transport, flat: np.ndarray, bounds: Sequence[int], ufunc: np.ufunc,
                tag: Any, allgather: bool = True, chunk_bytes: int | None = None,
                what: str = "all_reduce", out: np.ndarray | None = None) -> np.ndarray:
    """Reduce ``flat`` across the ring into ``out`` (default: in place); returns ``out``.

    ``bounds`` cut ``flat`` into ``world_size`` segments. After the reduce-scatter, rank
    ``r`` holds the reduced segment ``r``; with ``allgather`` every rank then holds every
    reduced segment. At reduce-scatter step ``s`` rank ``r`` receives segment
    ``r-s-2`` from its left neighbour, reduces it with its own and passes it right; at
    all-gather step ``s`` it receives the reduced segment ``r-s-1`` and passes it on.

    The bytes travel on the neighbour streams, in one order both ends know: a header
    (checked: same collective, size, dtype and op), this rank's own segment ``r-1``,
    then every reduced chunk as soon as it is ready. Reduce-scatter chunks are received
    into ``RECEIVE_AHEAD`` scratch buffers, reduced into ``out`` and sent on from there;
    all-gather chunks are received straight into ``out``. A region of ``out`` sent at
    reduce-scatter step ``s`` is written again at all-gather step ``s+1``, only after
    the right neighbour received it: the reduced segment that comes back depends on it.
    """
    src = flat
    dst = flat if out is None else out
    n, r = t.world_size, t.rank
    last = n - 2
    itemsize = max(1, flat.itemsize)
    most = chunk_bytes or CHUNK_BYTES
    segment_bytes = (bounds[1] - bounds[0]) * itemsize
    step = max(1, min(most, max(min(most, MIN_CHUNK_BYTES), segment_bytes // 4)) // itemsize)

    def chunks(seg: int) -> list[tuple[int, int]]:
        lo, hi = bounds[seg], bounds[seg + 1]
        return [(a, min(a + step, hi)) for a in range(lo, hi, step)]

    rs = [(s, a, b) for s in range(n - 1) for a, b in chunks((r - s - 2) % n)]
    ag = [(s, a, b) for s in range(n - 1) for a, b in chunks((r - s - 1) % n)] if allgather else []
    ahead = max(1, RECEIVE_AHEAD)
    scratch = [buf[:step * itemsize].view(flat.dtype)
               for buf in t.scratch(min(ahead, max(1, len(rs))), step * itemsize)]
    receive, send = t.stream_receive, t.stream_send

    mine = _head(flat, bounds, ufunc, tag)
    theirs = np.empty_like(mine)
    head_ticket = receive(theirs)
    tickets: list[int] = []

    def post(upto: int) -> None:
        # reduce-scatter chunks go to scratch buffers (one is free once its chunk was
        # reduced); once they are all asked for, every all-gather chunk goes to ``dst``
        while len(tickets) < upto:
            i = len(tickets)
            if i < len(rs):
                _, a, b = rs[i]
                tickets.append(receive(scratch[i % len(scratch)][:b - a]))
            else:
                _, a, b = ag[i - len(rs)]
                tickets.append(receive(dst[a:b]))

    def wanted(done: int) -> int:
        upto = min(len(rs), done + len(scratch))
        return upto if upto < len(rs) else len(rs) + len(ag)

    post(wanted(0))
    head_sent = send(mine)
    own = (r - 1) % n
    sent = send(src[bounds[own]:bounds[own + 1]])
    t.wait_received(head_ticket)
    try:
        _check_head(theirs, mine, (r - 1) % n, what)
    except ValueError:
        try:   # the right neighbour must get this header to report the mismatch too
            t.wait_sent(head_sent)
        except Exception:
            pass   # it has left already
        raise
    for i, (s, a, b) in enumerate(rs):
        t.wait_received(tickets[i])
        part = dst[a:b]
        ufunc(src[a:b], scratch[i % len(scratch)][:b - a], out=part)
        post(wanted(i + 1))
        if s < last or allgather:   # the next step's data, or segment r starting the all-gather
            sent = send(part)
    for j, (s, a, b) in enumerate(ag):
        if s < last:
            t.wait_received(tickets[len(rs) + j])
            sent = send(dst[a:b])
    if tickets:
        t.wait_received(tickets[-1])
    t.wait_sent(sent)
    return dst


def bruck_allgather(t: Transport, obj: Any, tag: Any) -> list[Any]:
    """Every rank's ``obj``, by rank. Round ``i`` sends the ``min(2**i, N - 2**i)`` blocks
    gathered so far to rank ``r - 2**i`` and receives as many from ``r + 2**i``."""
    n, r = t.world_size, t.rank
    blocks = [obj]          # blocks[i] is the object of rank (r + i) % n
    dist, rnd = 1, 0
    while dist < n:
        count = min(dist, n - dist)
        t.send((r - dist) % n, (tag, rnd), blocks[:count])
        got = t.recv((r + dist) % n, (tag, rnd))
        if not isinstance(got, list) or len(got) != count:
            raise RuntimeError(f"collective mismatch: rank {(r + dist) % n} is in another collective")
        blocks.extend(got)
        dist *= 2
        rnd += 1
    return [blocks[(j - r) % n] for j in range(n)]


def tree_broadcast(t: Transport, obj: Any, src: int, tag: Any) -> Any:
    """``src``'s ``obj`` on every rank: in round ``i`` ranks ``< 2**i`` (relative to
    ``src``) that have it send it to the rank ``2**i`` further."""
    n, r = t.world_size, t.rank
    v = (r - src) % n
    mask = 1
    while mask < n:
        if v < mask:
            if v + mask < n:
                t.send((v + mask + src) % n, tag, obj)
        elif v < 2 * mask:
            obj = t.recv((v - mask + src) % n, tag)
        mask <<= 1
    return obj


def gather_reduce(t: Transport, groups: list[np.ndarray], ufunc: np.ufunc, tag: Any,
                  what: str = "all_reduce",
                  segments: list[tuple[int, int]] | None = None) -> list[np.ndarray]:
    """Small buffers: all-gather them, then every rank reduces in rank order (so every
    rank computes bit-identical results). With ``segments``, only ``[a, b)`` of each
    group is reduced and returned (reduce-scatter)."""
    everyone = bruck_allgather(t, groups, tag)
    for src, theirs in enumerate(everyone):
        if not isinstance(theirs, list) or len(theirs) != len(groups):
            raise ValueError(f"{what}: rank {src} passed data of another structure")
    out = []
    for g, mine in enumerate(groups):
        a, b = segments[g] if segments is not None else (0, mine.size)
        for src, theirs in enumerate(everyone):
            _check_part(theirs[g], mine, src, what)
        acc = np.array(everyone[0][g][a:b], copy=True)
        for theirs in everyone[1:]:
            ufunc(acc, theirs[g][a:b], out=acc)
        out.append(acc)
    return out
