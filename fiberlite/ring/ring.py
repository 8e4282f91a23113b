"""``Ring``: N jobs that run one function as peers, with collectives between them.

    def train(ring, epochs):
        grads = ...
        grads = ring.all_reduce(grads, op="mean")     # same on every rank
        ring.print("loss", loss)                       # rank 0 only
        return loss

    losses = fiberlite.Ring(4, train, args=(10,)).run()   # one result per rank

Parent side: :class:`Ring` starts the members (each a job from ``context.Process``)
and holds the rendezvous servant where members register their inbox and learn
everyone's. Member side: :class:`Member` (the ``ring`` argument) sends to peers
directly, ``ref.cast("deliver", src, tag, obj)`` on the peer's :class:`RingMember`
servant, and waits on its own inbox. Messages on one connection stay in order; every
collective call gets the next sequence number, so all ranks must call the same
collectives in the same order (as with MPI or torch.distributed). The bulk data of
ring reductions travels instead on byte streams between ring neighbours
(:class:`~fiberlite.ring.link.NeighbourLink`, connected during the rendezvous).

Data: collectives that reduce take numpy arrays, torch tensors (CPU, or on a GPU:
moved through host memory and back) and Python numbers, nested in dicts, lists and
tuples; ``broadcast``, ``all_gather`` and ``send`` take any picklable object (sent as
a :class:`~fiberlite.wire.codec.Payload`). Array chunks travel as numpy arrays in the
message envelope, whose pickle protocol 5 out-of-band buffers keep them out of the
pickle stream. Algorithms are in :mod:`fiberlite.ring.collectives`.

Faults: a member that dies (or fails) is seen by its peers' connections and by the
parent, which tells every member; their pending and later operations raise
:class:`~fiberlite.errors.RingError` naming the rank. A collective that fails or times
out on a rank leaves that rank's ring unusable for further collectives (peers may be
anywhere in it); point-to-point ``recv`` timeouts do not. ``join()`` raises naming the
rank that failed first.

Memory: results of ring reductions are made in blocks that the member reuses once no
array refers to them any more (:class:`~fiberlite.ring.collectives.Buffers`): first touching
fresh memory costs as much as reducing into it.
"""
from __future__ import annotations

import builtins
import collections
import contextlib
import operator
import os
import signal
import socket
import threading
import time
import traceback
from typing import Any, Callable, Iterator

import pynng

try:
    import numpy as np
except ImportError:  # pragma: no cover - numpy is in every training environment
    raise ImportError("fiberlite.Ring needs numpy: pip install numpy") from None

from . import collectives as coll
from .link import NeighbourLink, NeighbourLinkLost
from ..runtime import identity
from .stream import MessageStream
from ..errors import RemoteTraceback, RingError
from ..errors import TimeoutError as _MPTimeoutError
from ..runtime.hub import LOCAL_PEER, ObjectRef, Servant, connect, flush, get_hub
from ..meta import ATTRIBUTE as META_ATTRIBUTE
from ..process import Process
from ..wire.codec import Payload
from ..wire.tls import host_port, is_tls

DEFAULT_TIMEOUT = 1800.0   # seconds a collective may wait (torch.distributed's default)
ABORT_GRACE = 10.0         # seconds members get to stop by themselves after a failure

__all__ = ["Ring", "Member", "RingError", "RingTimeoutError"]


class RingTimeoutError(_MPTimeoutError, builtins.TimeoutError):
    """A ring operation waited longer than its timeout (both ``multiprocessing`` and
    builtin ``TimeoutError``)."""


# -- member side: the inbox servant -------------------------------------------------------
class RingMember(Servant):
    """A member's inbox: messages by ``(src, tag)``, plus what it knows of lost peers."""

    def __init__(self) -> None:
        self._cond = threading.Condition(threading.Lock())
        self._boxes: dict[tuple, collections.deque] = {}
        self._rank_of_peer: dict[int, int] = {}
        self.lost: dict[int, RingError] = {}   # rank -> why it cannot be heard from again
        self.error: RingError | None = None
        self.on_fail: Callable[[], None] | None = None   # also told when the ring is aborted

    def op_deliver(self, request: Any, src: int, tag: Any, obj: Any) -> None:
        key = (src, tag)
        with self._cond:
            box = self._boxes.get(key)
            if box is None:
                box = self._boxes[key] = collections.deque()
            box.append(obj)
            if request.peer != LOCAL_PEER:
                self._rank_of_peer[request.peer] = src
            self._cond.notify_all()
        request.reply()

    def op_abort(self, request: Any, message: str, rank: int | None, exitcode: int | None) -> None:
        self.fail(RingError(message, rank, exitcode))
        request.reply()

    def op_farewell(self, request: Any, src: int, why: str, culprit: int | None) -> None:
        """``src`` ended its target; ``culprit`` is the rank whose failure made it stop."""
        if culprit is None or culprit == src:
            self.mark_lost(src, RingError(f"rank {src} left the ring ({why})", src))
        else:  # it stopped because of another rank: pass that story on
            self.mark_lost(src, RingError(why, culprit))
        request.reply()

    def peer_lost(self, peer: int) -> None:
        rank = self._rank_of_peer.pop(peer, None)
        if rank is not None:
            self.mark_lost(rank, RingError(f"rank {rank} left the ring (connection lost)", rank))

    def mark_lost(self, rank: int, error: RingError) -> None:
        with self._cond:
            self.lost.setdefault(rank, error)
            self._cond.notify_all()

    def fail(self, error: RingError) -> None:
        with self._cond:
            if self.error is None:
                self.error = error
            self._cond.notify_all()
        if self.on_fail is not None:
            self.on_fail()

    def check(self, rank: int) -> None:
        """Raise if the ring is broken or ``rank`` is known to have left."""
        error = self.error
        if error is not None:
            raise RingError(str(error), error.rank, error.exitcode)
        lost = self.lost.get(rank)
        if lost is not None:
            raise RingError(str(lost), lost.rank)

    def take(self, src: int, tag: Any, deadline: float | None, on_timeout: Callable[[int], str]) -> Any:
        """The next message from ``src`` with ``tag``; waits until ``deadline``."""
        key = (src, tag)
        with self._cond:
            while True:
                box = self._boxes.get(key)
                if box:
                    obj = box.popleft()
                    if not box:
                        del self._boxes[key]
                    return obj
                self.check(src)
                if deadline is None:
                    self._cond.wait()
                    continue
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    raise RingTimeoutError(on_timeout(src))
                self._cond.wait(remaining)


# -- member side: the API ------------------------------------------------------------------
class Member:
    """A rank of a running :class:`Ring`: the first argument of the ring's target.

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
        self._buffers = coll.Buffers()   # memory of earlier results, reused
        self._link = link                 # byte streams to the ring neighbours
        # without links (tls: links are plain TCP) the streams are messages
        self._stream: NeighbourLink | MessageStream = link if link is not None else MessageStream(
            self._post, self._take, (rank - 1) % world_size, (rank + 1) % world_size)
        self._link_addresses: list[str | None] = table.get("links") or [None] * world_size
        self._hosts: list[str] = table.get("hosts") or [""] * world_size
        self._scratch: list[np.ndarray] = []
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
        self._post(dst, ("p2p", tag), Payload.pack(coll.to_host(obj)))

    def recv(self, src: int, tag: Any = 0, timeout: float | None = None) -> Any:
        """The next object rank ``src`` sent here with ``send(obj, dst, tag)``; waits up to
        ``timeout`` seconds (default: the ring's), then raises ``RingTimeoutError``."""
        src = self._check_rank(src, "src")
        wait = self.timeout if timeout is None else timeout
        deadline = None if wait is None else time.monotonic() + wait
        payload = self._inbox.take(src, ("p2p", tag), deadline,
                                   lambda s: f"recv from rank {s} timed out after {wait} s")
        return coll.from_host(payload.unpack())

    def _watch(self, dst: int) -> None:
        """Connect to ``dst`` and learn when that connection ends."""
        ref = self._refs[dst]
        if dst in self._watched or ref.is_local:
            return
        inbox = self._inbox
        client = connect(ref.address)
        client.on_lost(lambda: inbox.mark_lost(
            dst, RingError(f"rank {dst} left the ring (connection lost)", dst)))
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
            except (ConnectionError, pynng.NNGException) as exc:
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
            self._inbox.check(peer)   # the ring was aborted, or the peer told why it left
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
        except (ConnectionError, pynng.NNGException) as exc:
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
        if any(n != name for n in names):
            raise RuntimeError("ranks reached different barriers: "
                               + ", ".join(f"rank {i}: {n!r}" for i, n in enumerate(names)))

    def broadcast(self, obj: Any = None, src: int = 0) -> Any:
        """``obj`` of rank ``src`` on every rank (any picklable object; ``src`` gets its
        own ``obj`` back). Binomial tree: ceil(log2 N) rounds."""
        src = self._check_rank(src, "src")
        with self._op("broadcast") as t:
            payload = Payload.pack(coll.to_host(obj)) if self.rank == src else None
            payload = coll.tree_broadcast(t, payload, src, t.tag)
        return obj if self.rank == src else coll.from_host(payload.unpack())

    def all_gather(self, data: Any) -> list[Any]:
        """Every rank's ``data`` (any picklable object), as a list by rank (this rank's
        entry is ``data`` itself). Bruck's algorithm: ceil(log2 N) rounds."""
        with self._op("all_gather") as t:
            payloads = coll.bruck_allgather(t, Payload.pack(coll.to_host(data)), t.tag)
        return [data if i == self.rank else coll.from_host(p.unpack()) for i, p in enumerate(payloads)]

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
        leaves, rebuild = coll.flatten(data, "all_reduce")
        groups, where = coll.fuse(leaves)   # a single leaf is not copied: read only
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
                            t, flat, coll.split_bounds(flat.size, self.world_size), ufunc,
                            (t.tag, g), out=self._buffers.empty(flat.size, flat.dtype))
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
        leaves, rebuild = coll.flatten(data, "reduce_scatter")
        n, r = self.world_size, self.rank
        groups, segments, where = coll.fuse_sharded(leaves, n, r)
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
        port = self.broadcast(_free_port() if self.rank == 0 else None)
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


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("", 0))
        return sock.getsockname()[1]


# -- member side: what the job runs ---------------------------------------------------------
class _MemberMain:
    """The target of a member's job: rendezvous, run ``target(ring, ...)``, report back."""

    def __init__(self, rendezvous: ObjectRef, rank: int, world_size: int, target: Callable,
                 args: tuple, kwargs: dict, initializer: Callable | None, initargs: tuple,
                 timeout: float | None) -> None:
        self.rendezvous = rendezvous
        self.rank = rank
        self.world_size = world_size
        self.target = target
        self.args = args
        self.kwargs = kwargs
        self.initializer = initializer
        self.initargs = initargs
        self.timeout = timeout
        wants = getattr(target, META_ATTRIBUTE, None)
        if wants:  # @fiberlite.meta on the target applies to every member's job
            setattr(self, META_ATTRIBUTE, dict(wants))

    def __call__(self) -> None:
        member = None
        link = None
        try:
            if self.initializer is not None:
                self.initializer(*self.initargs)
            inbox = RingMember()
            hub = get_hub()
            ref = hub.register(inbox)
            if self.world_size > 1 and not is_tls(hub.address):  # listens where the hub does
                link = NeighbourLink(host_port(hub.address)[0])
            table = self.rendezvous.call("join", self.rank, ref, socket.gethostname(),
                                         link.address if link is not None else None)
            member = Member(self.rank, self.world_size, table, inbox, self.rendezvous, self.timeout, link)
            member._connect_partners()
            member._connect_link()
            self.rendezvous.call("ready", self.rank)  # nobody starts before all are connected
            result = self.target(member, *self.args, **self.kwargs)
            member._close()
            try:
                payload = Payload.pack(result)
            except Exception as exc:
                raise TypeError(f"the return value of rank {self.rank} cannot be pickled: {exc}") from exc
        except SystemExit as exc:
            ok = exc.code in (None, 0)
            self._end(member, link, None if ok else exc)
            if ok:
                self._report(True, Payload.pack(None))
            else:
                self._report(False, _describe(exc, self.rank))
            raise
        except BaseException as exc:
            self._end(member, link, exc)
            self._report(False, _describe(exc, self.rank))
            raise
        self._end(member, link, None)
        self._report(True, payload)

    @staticmethod
    def _end(member: "Member | None", link: NeighbourLink | None, exc: BaseException | None) -> None:
        if member is not None:
            member._close()
            member._farewell(exc)
        if link is not None:
            try:
                # neighbours hear why this rank left before its streams end
                flush()
            except Exception:
                pass
            link.close()

    def _report(self, ok: bool, info: Any) -> None:
        try:
            flush()  # what this member sent has landed before it reports how it ended
        except Exception:
            pass
        try:
            self.rendezvous.call("leave", self.rank, ok, info)
        except Exception:
            pass  # the parent is gone: this job is about to end anyway


def _describe(exc: BaseException, rank: int) -> dict:
    info: dict[str, Any] = {
        "type": type(exc).__name__, "message": str(exc),
        "traceback": "".join(traceback.format_exception(type(exc), exc, exc.__traceback__)),
        "culprit": None, "exception": None}
    if isinstance(exc, RingError) and exc.rank is not None and exc.rank != rank:
        info["culprit"] = exc.rank  # failed because another rank did
    try:
        info["exception"] = Payload.pack(exc)
    except Exception:
        pass
    return info


# -- parent side ------------------------------------------------------------------------------
class Rendezvous(Servant):
    """Where members register their inbox, learn everyone's, and report how they ended."""

    def __init__(self, ring: "Ring") -> None:
        self._ring = ring
        self._lock = threading.Lock()
        self._joined: dict[int, tuple[ObjectRef, str, str | None]] = {}
        self._waiting: dict[str, dict[int, Any]] = {"join": {}, "ready": {}}
        self._rank_of_peer: dict[int, int] = {}
        self.error: RingError | None = None

    def _gather(self, phase: str, request: Any, rank: int) -> list[Any] | None:
        """Keep ``request`` until every rank reached ``phase``; then return all of them."""
        with self._lock:
            error = self.error
            if error is None:
                waiting = self._waiting[phase]
                waiting[rank] = request
                if len(waiting) < self._ring.world_size:
                    return None
                self._waiting[phase] = {}
                return list(waiting.values())
        request.fail(RingError(str(error), error.rank, error.exitcode))
        return None

    def op_join(self, request: Any, rank: int, ref: ObjectRef, hostname: str,
                link: str | None = None) -> None:
        with self._lock:
            self._joined[rank] = (ref, hostname, link)
            self._rank_of_peer[request.peer] = rank
        everyone = self._gather("join", request, rank)
        if everyone:
            table = self._table()
            for waiter in everyone:
                waiter.reply(table)

    def op_ready(self, request: Any, rank: int) -> None:
        for waiter in self._gather("ready", request, rank) or ():
            waiter.reply()

    def _table(self) -> dict:
        n = self._ring.world_size
        refs = [self._joined[r][0] for r in range(n)]
        hosts = [self._joined[r][1] for r in range(n)]
        links = [self._joined[r][2] for r in range(n)]
        counter: dict[str, int] = collections.Counter()
        local_rank = []
        for host in hosts:
            local_rank.append(counter[host])
            counter[host] += 1
        return {"refs": refs, "local_rank": local_rank,
                "local_world_size": [counter[h] for h in hosts], "links": links, "hosts": hosts}

    def refs(self) -> dict[int, ObjectRef]:
        with self._lock:
            return {rank: entry[0] for rank, entry in self._joined.items()}

    def op_leave(self, request: Any, rank: int, ok: bool, info: Any) -> None:
        request.reply()
        self._ring._on_leave(rank, ok, info)

    def abort(self, error: RingError) -> None:
        with self._lock:
            if self.error is None:
                self.error = error
            waiting = [w for phase in self._waiting.values() for w in phase.values()]
            self._waiting = {"join": {}, "ready": {}}
        for waiter in waiting:
            waiter.fail(RingError(str(error), error.rank, error.exitcode))

    def peer_lost(self, peer: int) -> None:
        rank = self._rank_of_peer.pop(peer, None)
        if rank is not None:
            self._ring._on_lost(rank)


class Ring:
    """``processes`` jobs running ``target(ring, *args, **kwargs)`` as the ranks of a ring.

    ``initializer(*initargs)`` runs in each member first. ``timeout`` (seconds, None for
    no limit) bounds every collective; after a member fails, the others get
    ``abort_grace`` seconds to stop before they are terminated. ``@fiberlite.meta`` on
    ``target`` sets each member's resources.

    ``start()``, ``join(timeout)`` (raises :class:`RingError` if a member failed),
    ``run()`` (start + join, returns the results by rank), ``results``, ``exitcodes``,
    ``is_alive()``, ``terminate()``; as a context manager, members still running at
    exit are terminated.
    """

    def __init__(self, processes: int, target: Callable[..., Any], args: tuple = (),
                 kwargs: dict | None = None, initializer: Callable[..., Any] | None = None, *,
                 context: Any = None, timeout: float | None = DEFAULT_TIMEOUT, initargs: tuple = (),
                 abort_grace: float = ABORT_GRACE, name: str = "Ring") -> None:
        if isinstance(processes, bool) or not isinstance(processes, int) or processes < 1:
            raise ValueError(f"processes must be a positive number of members, not {processes!r}")
        if not callable(target):
            raise TypeError(f"target must be callable, not {target!r}")
        if initializer is not None and not callable(initializer):
            raise TypeError(f"initializer must be callable, not {initializer!r}")
        if timeout is not None and timeout <= 0:
            raise ValueError("timeout must be a positive number of seconds or None")
        self.world_size = processes
        self._context = context
        self._target = target
        self._args = tuple(args)
        self._kwargs = dict(kwargs or {})
        self._initializer = initializer
        self._initargs = tuple(initargs)
        self.timeout = timeout
        self.abort_grace = abort_grace
        self.name = name
        self.processes: list[Any] = []
        self._lock = threading.Lock()
        self._reports: dict[int, tuple[bool, Any]] = {}
        self._events: list[int] = []          # ranks in the order they failed or were lost
        self._error: RingError | None = None  # what the members were told
        self._rendezvous: Rendezvous | None = None
        self._ref: ObjectRef | None = None
        self._results: list[Any] | None = None
        self._closed = False
        self._grace_timer: threading.Timer | None = None

    def __repr__(self) -> str:
        state = "initial" if not self.processes else ("running" if self.is_alive() else "stopped")
        return f"<{self.name} world_size={self.world_size} {state}>"

    # -- control ---------------------------------------------------------------------------------
    def start(self) -> None:
        """Start the members' jobs."""
        if self.processes or self._closed:
            raise ValueError("a Ring can be started once")
        self._rendezvous = Rendezvous(self)
        self._ref = get_hub().register(self._rendezvous)
        try:
            for rank in range(self.world_size):
                main = _MemberMain(self._ref, rank, self.world_size, self._target, self._args,
                                   self._kwargs, self._initializer, self._initargs, self.timeout)
                process = (Process if self._context is None else self._context.Process)(target=main, name=f"{self.name}-{rank}")
                process.start()
                self.processes.append(process)
        except BaseException:
            for process in self.processes:
                process.kill()
                process.join()
            get_hub().unregister(self._ref.oid)
            raise
        threading.Thread(target=self._watch, name=f"fiberlite-{self.name}-watch", daemon=True).start()

    def join(self, timeout: float | None = None) -> None:
        """Wait until every member ended (or ``timeout`` passed: check :meth:`is_alive`);
        raise :class:`RingError` naming the rank that failed first if any failed."""
        if not self.processes:
            raise ValueError("the Ring was not started")
        deadline = None if timeout is None else time.monotonic() + timeout
        for process in self.processes:
            process.join(None if deadline is None else max(0.0, deadline - time.monotonic()))
            if process.exitcode is None:
                return
        self._finish()
        error = self._failure()
        if error is not None:
            raise error

    def run(self) -> list[Any]:
        """Start, join and return each rank's return value, by rank."""
        self.start()
        self.join()
        return self.results

    @property
    def results(self) -> list[Any]:
        """Each rank's return value, by rank (after a successful :meth:`join`)."""
        if self._results is None:
            raise ValueError("results are available once every member finished successfully")
        return list(self._results)

    def is_alive(self) -> bool:
        return any(p.is_alive() for p in self.processes)

    @property
    def exitcodes(self) -> list[int | None]:
        return [p.exitcode for p in self.processes]

    def terminate(self) -> None:
        """Stop every member now (SIGTERM) and wait for them."""
        self._abort(RingError("the ring was terminated by its parent"))
        for process in self.processes:
            if process.is_alive():
                process.terminate()
        for process in self.processes:
            process.join()
        self._finish()

    def __enter__(self) -> "Ring":
        return self

    def __exit__(self, *exc: Any) -> None:
        if self.processes and self.is_alive():
            self.terminate()
        self._finish()

    # -- what members report ---------------------------------------------------------------------
    def _on_leave(self, rank: int, ok: bool, info: Any) -> None:
        with self._lock:
            self._reports[rank] = (ok, info)
            if not ok:
                self._events.append(rank)
        if not ok:
            culprit = info.get("culprit")
            if culprit is not None:
                # it stopped because of another rank: pass that rank's story on
                self._abort(RingError(info["message"], culprit))
            else:
                self._abort(RingError(f"rank {rank} failed: {info['type']}: {info['message']}", rank))

    def _on_lost(self, rank: int) -> None:
        with self._lock:
            if rank in self._reports:
                return
            self._events.append(rank)
        self._abort(RingError(f"rank {rank} left the ring (connection lost)", rank))

    def _on_exit(self, rank: int, code: int | None) -> None:
        with self._lock:
            report = self._reports.get(rank)
            if report is not None and report[0]:
                return
            if report is None:
                self._events.append(rank)
        if report is None:
            self._abort(RingError(f"rank {rank} left the ring (exit code {_code_name(code)})", rank, code))

    def _abort(self, error: RingError) -> None:
        """Tell every member still running that the ring is broken (once)."""
        with self._lock:
            if self._error is not None:
                return
            self._error = error
        if self._rendezvous is not None:
            self._rendezvous.abort(error)
            refs = self._rendezvous.refs()
        else:
            refs = {}
        targets = [ref for rank, ref in refs.items()
                   if rank not in self._reports and rank != error.rank]

        def tell() -> None:
            for ref in targets:
                try:  # a call, not a cast: nothing is left in flight if the member ends
                    ref.call("abort", str(error), error.rank, error.exitcode)
                except Exception:
                    pass  # it ended meanwhile
        threading.Thread(target=tell, name="fiberlite-ring-abort", daemon=True).start()
        if self.abort_grace is not None and self.processes:
            timer = threading.Timer(self.abort_grace, self._stop_stragglers)
            timer.daemon = True
            self._grace_timer = timer
            timer.start()

    def _stop_stragglers(self) -> None:
        for process in self.processes:
            try:
                if process.exitcode is None:
                    process.terminate()
            except Exception:
                pass

    def _watch(self) -> None:
        """Notice members that end (by their sentinels) and report those that failed."""
        from multiprocessing.connection import wait
        pending = {}
        for rank, process in enumerate(self.processes):
            try:
                pending[process.sentinel] = rank
            except Exception:
                pass
        while pending:
            for sentinel in wait(list(pending), timeout=1.0):
                rank = pending.pop(sentinel)
                process = self.processes[rank]
                code = process.exitcode
                while code is None:  # the sentinel fired: the exit code is a moment away
                    time.sleep(0.01)
                    code = process.exitcode
                self._on_exit(rank, code)
            if self._closed:
                return

    # -- outcome ---------------------------------------------------------------------------------
    def _finish(self) -> None:
        if self._closed:
            return
        self._closed = True
        if self._grace_timer is not None:
            self._grace_timer.cancel()
        if self._ref is not None:
            get_hub().unregister(self._ref.oid)
        if all(self._reports.get(r, (False,))[0] for r in range(self.world_size)):
            results = []
            for rank in range(self.world_size):
                try:
                    results.append(self._reports[rank][1].unpack())
                except Exception as exc:
                    self._reports[rank] = (False, _describe(exc, rank))
                    self._events.append(rank)
                    return
            self._results = results

    def _failure(self) -> RingError | None:
        # members that did not finish their target
        failed = [r for r in range(len(self.processes)) if not self._reports.get(r, (False,))[0]]
        if not failed:
            return None
        codes = self.exitcodes
        primary = [r for r in failed if (self._reports.get(r, (False, None))[1] or {}).get("culprit") is None]
        order = {rank: i for i, rank in reversed(list(enumerate(self._events)))}
        candidates = primary or failed
        first = min(candidates, key=lambda r: (order.get(r, len(order)), r))
        info = self._reports.get(first, (False, None))[1]
        code = codes[first]
        if info is None:
            message = f"{self.name} rank {first} died (exit code {_code_name(code)})"
        else:
            message = (f"{self.name} rank {first} failed with {info['type']}: {info['message']} "
                       f"(exit code {_code_name(code)})")
        others = [r for r in failed if r != first]
        if others:
            message += (f"; rank{'s' if len(others) > 1 else ''} "
                        f"{', '.join(map(str, others))} stopped because of it")
        error = RingError(message, first, code)
        if info is not None:
            cause = None
            if info.get("exception") is not None:
                try:
                    cause = info["exception"].unpack()
                except Exception:
                    cause = None
            remote = RemoteTraceback(f"\n\"\"\"\n{info['traceback']}\"\"\"")
            if isinstance(cause, BaseException):
                cause.__cause__ = remote
                error.__cause__ = cause
            else:
                error.__cause__ = remote
        return error


def _code_name(code: int | None) -> str:
    if code is not None and code < 0:
        try:
            return f"{code}, {signal.Signals(-code).name}"
        except ValueError:
            pass
    return str(code)
