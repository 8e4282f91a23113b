"""The member side of a ring: :class:`Member`, the ``ring`` a member's target gets.

A member sends to peers directly, ``ref.cast("deliver", src, tag, obj)`` on the peer's
:class:`~fiberlite.ring.inbox.RingMember` servant, and waits on its own inbox.
Messages on one connection stay in order; every collective call gets the next
sequence number, so all ranks must call the same collectives in the same order (as
with MPI or torch.distributed). The bulk data of ring reductions travels instead on
byte streams between ring neighbours (:class:`~fiberlite.ring.link.NeighbourLink`,
connected during the rendezvous; :class:`~fiberlite.ring.stream.MessageStream` with
``tls`` on). Each collective call flattens its data into flat buffers
(:mod:`fiberlite.ring.buffers`) and hands the algorithms of
:mod:`fiberlite.ring.collectives` a ``_Transport`` onto this member. The job that
makes the member and runs the target is in :mod:`.job`.

Data: collectives that reduce take numpy arrays, torch tensors (CPU, or on a GPU:
moved through host memory and back) and Python numbers, nested in dicts, lists and
tuples; ``broadcast``, ``all_gather`` and ``send`` take any picklable object (sent as
a :class:`~fiberlite.wire.codec.Payload`). Array chunks travel as numpy arrays in the
message envelope, whose pickle protocol 5 out-of-band buffers keep them out of the
pickle stream.

Faults: a member that dies (or fails) is seen by its peers' connections and by the
parent, which tells every member; their pending and later operations raise
:class:`~fiberlite.errors.RingError` naming the rank. A collective that fails or times
out on a rank leaves that rank's ring unusable for further collectives (peers may be
anywhere in it); point-to-point ``recv`` timeouts do not.

Memory: results of ring reductions are made in blocks that the member reuses once no
array refers to them any more (:class:`~fiberlite.ring.buffers.Buffers`): first
touching fresh memory costs as much as reducing into it.
"""
from __future__ import annotations

import builtins
import contextlib
import operator
import os
import time
from typing import Any, Iterator

import numpy as np

from . import buffers
from . import collectives as coll
from .. import config
from ..errors import RingError
from ..runtime import identity
from ..runtime.dialed import connect
from ..runtime.hub import ObjectRef
from ..wire import tcp
from ..wire.codec import Payload
from .errors import RingTimeoutError
from .inbox import RingMember
from .link import NeighbourLink, NeighbourLinkLost
from .report import CollectiveCounter, payload_size
from .stream import MessageStream


def _story_seconds() -> float:
    """How long a member whose neighbour's link failed waits to hear why: twice what the
    ring's parent takes to give a silent rank up (``peer_timeout``; a tick that comes
    late on a loaded machine does not count, so it may take longer), and a second."""
    timeout = config.get("peer_timeout")
    return 2 * (10.0 if timeout is None else float(timeout)) + 1.0


class Member:
    """A rank of a running :class:`~fiberlite.ring.parent.Ring`: the first argument of the
    ring's target.

    ``rank``, ``world_size``, ``local_rank`` / ``local_world_size`` (rank and count among
    the members on the same host name), ``is_global_zero``, ``timeout`` (seconds a
    collective may wait; None waits forever).

    Collectives must be called by every rank, in the same order, from one thread.
    Results are new objects; inputs are not modified.
    """

    def __init__(self, rank: int, world_size: int, table: dict, inbox: RingMember,
                 rendezvous: ObjectRef, timeout: float | None,
                 link: NeighbourLink | None = None) -> None:
        self.rank = rank
        self.world_size = world_size
        self.local_rank: int = table["local_rank"][rank]
        self.local_world_size: int = table["local_world_size"][rank]
        self.timeout = timeout
        self._refs: list[ObjectRef] = table["refs"]
        self._inbox = inbox
        self._rendezvous = rendezvous
        self._seq = 0
        self._deadline: float | None = None
        self._what = "recv"
        self._wait: float | None = timeout
        self._watched: set[int] = set()
        self._torch_group = False
        self._broken: RingError | None = None
        self._broken_by: BaseException | None = None
        self._buffers = buffers.Buffers()   # memory of earlier results, reused
        self._link = link                 # byte streams to the ring neighbours
        # without links (tls: links are plain TCP) the streams are messages
        self._stream: NeighbourLink | MessageStream = link if link is not None else MessageStream(
            self._post, self._take, (rank - 1) % world_size, (rank + 1) % world_size)
        self._link_addresses: list[str | None] = table.get("links") or [None] * world_size
        self._hosts: list[str] = table.get("hosts") or [""] * world_size
        self._scratch: list[np.ndarray] = []
        self.counter: CollectiveCounter | None = None  # set when the run's page asks for reports
        if link is not None:
            inbox.on_fail = link.abort

    def __repr__(self) -> str:
        return f"<Ring member rank={self.rank} world_size={self.world_size}>"

    def __reduce__(self):
        raise TypeError("a Ring member belongs to its job and cannot be sent to another one")

    @property
    def is_global_zero(self) -> bool:
        return self.rank == 0

    # -- transport used by the algorithms ---------------------------------------------------
    def send(self, obj: Any, dst: int, tag: Any = 0) -> None:
        """Send ``obj`` (anything picklable) to rank ``dst``; ``recv(src, tag)`` there gets
        it. Messages to one rank with one tag arrive in order. Does not wait."""
        dst = self._check_rank(dst, "dst")
        self._post(dst, ("p2p", tag), Payload.pack(buffers.to_host(obj)))

    def recv(self, src: int, tag: Any = 0, timeout: float | None = None) -> Any:
        """The next object rank ``src`` sent here with ``send(obj, dst, tag)``; waits up to
        ``timeout`` seconds (default: the ring's), then raises ``RingTimeoutError``."""
        src = self._check_rank(src, "src")
        wait = self.timeout if timeout is None else timeout
        deadline = None if wait is None else time.monotonic() + wait
        payload = self._inbox.take(src, ("p2p", tag), deadline,
                                   lambda s: f"recv from rank {s} timed out after {wait} s")
        return buffers.from_host(payload.unpack())

    def _watch(self, dst: int) -> None:
        """Connect to ``dst`` and learn when that connection ends."""
        ref = self._refs[dst]
        if dst in self._watched or ref.is_local:
            return
        inbox = self._inbox
        client = connect(ref.address)

        def lost() -> None:
            why = "connection lost" if client.silent_for is None else client.lost_reason
            inbox.mark_lost(dst, RingError(f"rank {dst} left the ring ({why})", dst))
        client.on_lost(lost)
        self._watched.add(dst)

    def _connect_partners(self) -> None:
        """Connect, while every member is alive, to the ranks the collectives talk to:
        ``rank +- 2**k`` (ring neighbours, Bruck and binomial-tree partners)."""
        n, r = self.world_size, self.rank
        partners: set[int] = set()
        dist = 1
        while dist < n:
            partners.update(((r + dist) % n, (r - dist) % n))
            dist *= 2
        for dst in sorted(partners - {r}):
            try:
                self._watch(dst)
            except ConnectionError as exc:
                self._inbox.mark_lost(dst, RingError(f"rank {dst} left the ring ({exc})", dst))

    def _connect_link(self) -> None:
        """Dial the right neighbour's link and accept the left one (every member does
        this during the rendezvous)."""
        link = self._link
        if link is None:
            return
        deadline = None if self.timeout is None else time.monotonic() + self.timeout
        left, right = (self.rank - 1) % self.world_size, (self.rank + 1) % self.world_size
        here = self._hosts[self.rank]
        same_host = (self._hosts[left] == here, self._hosts[right] == here)
        try:
            link.connect(self.rank, self.world_size, self._link_addresses[right], identity.key(),
                         deadline, same_host)
        except OSError as exc:   # ConnectionError and TimeoutError among them
            error = self._inbox.error   # the ring was aborted meanwhile
            if error is not None:
                raise RingError(str(error), error.rank, error.exitcode) from None
            for rank in (right, link.left):   # or a neighbour is known to be gone
                self._inbox.check(rank)
            raise RingError(f"rank {self.rank} cannot connect its ring link: {exc}") from exc

    def _wait_stream(self, sent: bool, ticket: int) -> None:
        stream = self._stream
        peer = stream.right if sent else stream.left
        try:
            (stream.wait_sent if sent else stream.wait_received)(ticket, self._deadline)
        except RingTimeoutError:   # a message stream's own wait, already named
            raise
        except NeighbourLinkLost:
            # why, a moment later: the peer's farewell, the parent's abort (a rank given up
            # as silent: the link may fail first, as its machine's address vanishes)
            self._inbox.await_story(peer, _story_seconds())
            self._inbox.check(peer)
            raise RingError(f"rank {peer} left the ring (connection lost)", peer) from None
        except builtins.TimeoutError:
            raise RingTimeoutError(self._timed_out(peer)) from None

    def _scratch_buffers(self, count: int, nbytes: int) -> list[np.ndarray]:
        """``count`` receive buffers of at least ``nbytes``, kept between collectives."""
        scratch = self._scratch
        if len(scratch) < count or scratch[0].nbytes < nbytes:
            size = max(nbytes, scratch[0].nbytes if scratch else 0)
            self._scratch = scratch = [np.empty(size, np.uint8) for _ in range(max(count, len(scratch)))]
        return scratch[:count]

    def _post(self, dst: int, tag: Any, obj: Any) -> None:
        inbox = self._inbox
        inbox.check(dst)
        try:
            self._watch(dst)
            self._refs[dst].cast("deliver", self.rank, tag, obj)
        except ConnectionError as exc:
            inbox.mark_lost(dst, RingError(f"rank {dst} left the ring (connection lost: {exc})", dst))
            inbox.check(dst)
            raise  # not reached: check raised

    def _farewell(self, exc: BaseException | None) -> None:
        """Tell the connected peers that this rank's target ended, and why."""
        cause = exc if exc is not None else self._broken_by
        if isinstance(cause, RingError) and cause.rank is not None and cause.rank != self.rank:
            why, culprit = str(cause), cause.rank
        elif exc is not None:
            why, culprit = f"it failed: {type(exc).__name__}: {exc}", self.rank
        else:
            why, culprit = "it finished its target", self.rank
        for dst in sorted(self._watched):
            if dst in self._inbox.lost:
                continue
            try:
                self._refs[dst].cast("farewell", self.rank, why, culprit)
            except Exception:
                pass

    def _take(self, src: int, tag: Any) -> Any:
        return self._inbox.take(src, tag, self._deadline, self._timed_out)

    def _timed_out(self, src: int) -> str:
        return (f"{self._what} timed out on rank {self.rank} after {self._wait} s "
                f"(waiting for rank {src})")

    @contextlib.contextmanager
    def _op(self, what: str, timeout: float | None = None) -> Iterator["_Transport"]:
        if self._broken is not None:
            raise RingError(f"rank {self.rank} cannot run {what}: {self._broken}", self._broken.rank)
        self._seq += 1
        wait = self.timeout if timeout is None else timeout
        self._wait = wait
        self._what = what
        self._deadline = None if wait is None else time.monotonic() + wait
        try:
            yield _Transport(self, self._seq)
        except BaseException as exc:
            # peers may be anywhere in this collective now: later ones cannot line up
            if self._link is not None:
                self._link.abort()
            culprit = exc.rank if isinstance(exc, RingError) else None
            self._broken = RingError(f"an earlier {what} failed here ({type(exc).__name__}: {exc})",
                                     culprit)
            self._broken_by = exc
            raise
        finally:
            self._deadline = None

    def _count(self, nbytes: int) -> None:
        """One collective done here, with ``nbytes`` of data (counted only when asked)."""
        if self.counter is not None:
            self.counter.add(nbytes)

    def _check_rank(self, rank: Any, name: str) -> int:
        try:
            value = operator.index(rank)
        except TypeError:
            value = -1
        if not 0 <= value < self.world_size:
            raise ValueError(f"{name} must be a rank in 0..{self.world_size - 1}, not {rank!r}")
        return value

    # -- collectives -----------------------------------------------------------------------------
    def barrier(self, name: str | None = None, timeout: float | None = None) -> None:
        """Wait until every rank reached this barrier (``RingTimeoutError`` after
        ``timeout`` seconds). Ranks must pass the same ``name``."""
        what = "barrier" if name is None else f"barrier {name!r}"
        with self._op(what, timeout) as t:
            names = coll.bruck_allgather(t, name, t.tag)
        self._count(0)
        if any(n != name for n in names):
            raise RuntimeError("ranks reached different barriers: "
                               + ", ".join(f"rank {i}: {n!r}" for i, n in enumerate(names)))

    def broadcast(self, obj: Any = None, src: int = 0) -> Any:
        """``obj`` of rank ``src`` on every rank (any picklable object; ``src`` gets its
        own ``obj`` back). Binomial tree: ceil(log2 N) rounds."""
        src = self._check_rank(src, "src")
        with self._op("broadcast") as t:
            payload = Payload.pack(buffers.to_host(obj)) if self.rank == src else None
            payload = coll.tree_broadcast(t, payload, src, t.tag)
        self._count(payload_size(payload))
        return obj if self.rank == src else buffers.from_host(payload.unpack())

    def all_gather(self, data: Any) -> list[Any]:
        """Every rank's ``data`` (any picklable object), as a list by rank (this rank's
        entry is ``data`` itself). Bruck's algorithm: ceil(log2 N) rounds."""
        with self._op("all_gather") as t:
            payloads = coll.bruck_allgather(t, Payload.pack(buffers.to_host(data)), t.tag)
        self._count(payload_size(payloads[self.rank]))
        return [data if i == self.rank else buffers.from_host(p.unpack()) for i, p in enumerate(payloads)]

    def all_reduce(self, data: Any, op: str = "sum", algorithm: str | None = None) -> Any:
        """``data`` reduced element-wise over all ranks, on every rank.

        ``data``: a numpy array, torch tensor, Python number, or dicts/lists/tuples of
        them; the result has the same structure, shapes and types (``op="mean"`` of
        integers gives float64, as numpy). Leaves are fused into one buffer per dtype;
        buffers up to ``collectives.gather_limit(world_size)`` bytes (512 KiB on 2
        ranks, 128 KiB on 4 or more) are all-gathered and reduced locally (``algorithm="gather"``),
        larger ones go round the ring (``"ring"``). Every rank gets bit-identical results.
        """
        ufunc = coll.ufunc_of(op)
        leaves, rebuild = buffers.flatten(data, "all_reduce")
        groups, where = buffers.fuse(leaves)   # a single leaf is not copied: read only
        small = self._plan(groups, op, algorithm)
        if self.world_size == 1:
            groups = [np.array(flat, copy=True) for flat in groups]
        else:
            with self._op("all_reduce") as t:
                if small:
                    reduced = coll.gather_reduce(t, [groups[g] for g in small], ufunc, (t.tag, -1))
                    for g, flat in zip(small, reduced, strict=True):
                        groups[g] = flat
                for g, flat in enumerate(groups):
                    if g not in small:
                        groups[g] = coll.ring_reduce(
                            t, flat, buffers.split_bounds(flat.size, self.world_size), ufunc,
                            (t.tag, g), out=self._buffers.empty(flat.size, flat.dtype))
        self._count(sum(flat.nbytes for flat in groups))
        if op == "mean":
            groups = [coll.finish_mean(flat, self.world_size) for flat in groups]
        return rebuild([groups[g][a:b] for g, a, b in where], op)

    def reduce_scatter(self, data: Any, op: str = "sum", algorithm: str | None = None) -> Any:
        """This rank's shard of ``data`` reduced over all ranks.

        Every leaf (array, tensor or number, as in :meth:`all_reduce`) is flattened in
        C order and cut into ``world_size`` shards as ``numpy.array_split`` does: with
        ``n`` elements, rank ``r`` gets elements ``[r*q + min(r, m), (r+1)*q + min(r+1, m))``
        where ``q, m = divmod(n, world_size)`` (the first ``m`` ranks get one more). The
        result has ``data``'s structure with each leaf replaced by its 1-D shard (a numpy
        array for arrays and numbers, a tensor for tensors).
        """
        ufunc = coll.ufunc_of(op)
        leaves, rebuild = buffers.flatten(data, "reduce_scatter")
        n, r = self.world_size, self.rank
        groups, segments, where = buffers.fuse_sharded(leaves, n, r)
        shards: list = [np.array(flat[seg[r]:seg[r + 1]], copy=True)
                        for flat, seg in zip(groups, segments, strict=True)] if n == 1 else []
        small = self._plan(groups, op, algorithm)
        if n > 1:
            shards = [None] * len(groups)
            with self._op("reduce_scatter") as t:
                if small:
                    reduced = coll.gather_reduce(
                        t, [groups[g] for g in small], ufunc, (t.tag, -1), "reduce_scatter",
                        [(segments[g][r], segments[g][r + 1]) for g in small])
                    for g, shard in zip(small, reduced, strict=True):
                        shards[g] = shard
                for g, flat in enumerate(groups):
                    if g not in small:
                        full = coll.ring_reduce(t, flat, segments[g], ufunc, (t.tag, g),
                                                allgather=False, what="reduce_scatter",
                                                out=self._buffers.empty(flat.size, flat.dtype))
                        # a copy: the rest of ``full`` (partial sums) goes back to the pool
                        shards[g] = np.array(full[segments[g][r]:segments[g][r + 1]])
                        del full
        self._count(sum(flat.nbytes for flat in groups))
        if op == "mean":
            shards = [coll.finish_mean(s, n) for s in shards]
        offsets = [seg[r] for seg in segments]
        return rebuild([shards[g][a - offsets[g]:b - offsets[g]] for g, a, b in where], op, True)

    def _plan(self, groups: list, op: str, algorithm: str | None) -> list[int]:
        """The groups that take the gather path (checked before anything is sent)."""
        if algorithm not in (None, "ring", "gather"):
            raise ValueError(f"algorithm must be 'ring', 'gather' or None, not {algorithm!r}")
        if op == "mean" and any(flat.dtype.kind == "b" for flat in groups):
            raise TypeError("op='mean' is not defined for booleans")
        if algorithm is None:
            limit = coll.gather_limit(self.world_size)
            return [g for g, flat in enumerate(groups) if flat.nbytes <= limit]
        return list(range(len(groups))) if algorithm == "gather" else []

    # -- conveniences -----------------------------------------------------------------------------
    def print(self, *args: Any, **kwargs: Any) -> None:
        """``print`` on rank 0 only."""
        if self.rank == 0:
            kwargs.setdefault("flush", True)
            builtins.print(*args, **kwargs)

    @contextlib.contextmanager
    def rank_zero_first(self) -> Iterator[None]:
        """Run the block on rank 0 first, then on the other ranks (e.g. download once)."""
        if self.rank != 0:
            self.barrier("rank_zero_first")
        yield
        if self.rank == 0:
            self.barrier("rank_zero_first")

    def init_torch_distributed(self, backend: str = "gloo", timeout: float | None = None,
                               **kwargs: Any) -> Any:
        """Start ``torch.distributed`` over this ring's members; returns the module.

        Rank 0 picks a free port on its listen address; every rank sets ``MASTER_ADDR``,
        ``MASTER_PORT``, ``RANK``, ``WORLD_SIZE``, ``LOCAL_RANK``, ``LOCAL_WORLD_SIZE`` and
        calls ``torch.distributed.init_process_group(backend, ...)``. The group is
        destroyed when the target returns.
        """
        try:
            import torch.distributed as dist
        except ImportError as exc:
            raise ImportError(f"init_torch_distributed needs PyTorch in every member's "
                              f"environment ({exc})") from None
        host = self._refs[0].address.rsplit(":", 1)[0].split("://", 1)[-1]
        port = self.broadcast(tcp.free_port() if self.rank == 0 else None)
        os.environ.update(MASTER_ADDR=host, MASTER_PORT=str(port), RANK=str(self.rank),
                          WORLD_SIZE=str(self.world_size), LOCAL_RANK=str(self.local_rank),
                          LOCAL_WORLD_SIZE=str(self.local_world_size))
        import datetime
        wait = timeout if timeout is not None else self.timeout
        if wait is not None:
            kwargs.setdefault("timeout", datetime.timedelta(seconds=wait))
        dist.init_process_group(backend=backend, rank=self.rank, world_size=self.world_size, **kwargs)
        self._torch_group = True
        return dist

    def _close(self) -> None:
        if self._torch_group:
            self._torch_group = False
            try:
                import torch.distributed as dist
                if dist.is_initialized():
                    dist.destroy_process_group()
            except Exception:
                pass


class _Transport:
    """What the algorithms see: one collective call's tag space on a member, and its
    link to the ring neighbours."""

    __slots__ = ("rank", "world_size", "tag", "send", "recv", "_member")

    def __init__(self, member: Member, seq: int) -> None:
        self.rank = member.rank
        self.world_size = member.world_size
        self.tag = seq
        self.send = member._post
        self.recv = member._take
        self._member = member

    def stream_send(self, data: np.ndarray) -> int:
        return self._member._stream.send(data)

    def stream_receive(self, into: np.ndarray) -> int:
        return self._member._stream.receive(into)

    def wait_sent(self, ticket: int) -> None:
        self._member._wait_stream(True, ticket)

    def wait_received(self, ticket: int) -> None:
        self._member._wait_stream(False, ticket)

    def scratch(self, count: int, nbytes: int) -> list[np.ndarray]:
        return self._member._scratch_buffers(count, nbytes)
