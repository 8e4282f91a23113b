"""The algorithms behind :class:`fiberlite.ring.Member`'s collectives.

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
- :func:`gather_reduce`: small buffers, all-gathered and reduced on every rank.

They reduce flat numpy buffers with the ufunc of an op (:data:`OPS`); the flattening
of nested data into those buffers is in :mod:`fiberlite.ring.buffers`.
"""
from __future__ import annotations

import struct
import zlib
from typing import Any, Protocol, Sequence

import numpy as np

OPS: dict[str, np.ufunc] = {"sum": np.add, "mean": np.add, "max": np.maximum, "min": np.minimum}
CHUNK_BYTES = 4 << 20        # the ring reduces at most this many bytes at a time, aiming at
MIN_CHUNK_BYTES = 1 << 20    # 4 chunks per segment (pipelining), and at least this many
RECEIVE_AHEAD = 2            # chunks a rank may have received before it reduced them
GATHER_BYTES = {2: 512 << 10, 3: 256 << 10, 4: 128 << 10}  # by world size: see gather_limit


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


def finish_mean(flat: np.ndarray, world_size: int) -> np.ndarray:
    """Turn a sum into a mean (integers give float64, as numpy.mean)."""
    if flat.dtype.kind == "b":
        raise TypeError("op='mean' is not defined for booleans")
    if flat.dtype.kind in "iu":
        return flat.astype(np.float64) / world_size
    np.divide(flat, world_size, out=flat)
    return flat


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
