"""Ring: rendezvous, collectives against numpy references, point-to-point, faults.

Each test starts one ring and runs a battery of operations inside it; the parent
computes the references from the same deterministic inputs.
"""
from __future__ import annotations

import collections
import importlib.util
import os
import re
import signal
import socket
import threading
import time

import numpy as np
import psutil
import pytest

import fiberlite
from fiberlite.ring import buffers, collectives
from fiberlite.errors import RingError
from fiberlite.ring import Ring, RingTimeoutError
from fiberlite.ring.job import _MemberMain
from fiberlite.ring import link as ringlink
from fiberlite.ring.link import NeighbourLink, NeighbourLinkLost
from fiberlite.wire import auth
from paths import ROOT
from raw_peer import say_hello
from interpreters import run_python

pytestmark = pytest.mark.timeout(60)

OPS = ("sum", "mean", "max", "min")
DTYPES = ("float32", "float64", "int64")
# sizes: empty, fewer elements than ranks, odd, and above collectives.gather_limit(2)
SIZES = (0, 1, 3, 1001, 70_003)
Point = collections.namedtuple("Point", "x y")


def data_of(rank: int, size: int, dtype: str, salt: int = 0) -> np.ndarray:
    rng = np.random.default_rng(1000 * rank + 7 * size + salt)
    if dtype == "int64":
        return rng.integers(-1000, 1000, size=size, dtype=np.int64)
    return rng.standard_normal(size).astype(dtype)


def reference(stack: list[np.ndarray], op: str) -> np.ndarray:
    arr = np.stack(stack)
    return {"sum": lambda: arr.sum(axis=0, dtype=arr.dtype), "mean": lambda: arr.mean(axis=0),
            "max": lambda: arr.max(axis=0, initial=None) if arr.shape[1] else arr[0],
            "min": lambda: arr.min(axis=0) if arr.shape[1] else arr[0]}[op]()


def assert_close(got: np.ndarray, want: np.ndarray) -> None:
    assert got.shape == want.shape
    assert got.dtype == want.dtype, (got.dtype, want.dtype)
    if got.dtype.kind == "f":
        tol = 1e-5 if got.dtype == np.float32 else 1e-12
        np.testing.assert_allclose(got, want, rtol=tol, atol=tol)
    else:
        np.testing.assert_array_equal(got, want)


def small_chunks() -> None:
    # several chunks per ring segment, so the pipelining is exercised at small sizes
    collectives.CHUNK_BYTES = 4096


# -- targets (run in the members) -------------------------------------------------------------
def reduce_battery(ring):
    out = {}
    for dtype in DTYPES:
        for size in SIZES:
            x = data_of(ring.rank, size, dtype)
            for op in OPS:
                for algorithm in (None, "ring", "gather"):
                    out[dtype, size, op, algorithm] = ring.all_reduce(x, op=op, algorithm=algorithm)
                    out["rs", dtype, size, op, algorithm] = ring.reduce_scatter(x, op=op, algorithm=algorithm)
    assert np.array_equal(x, data_of(ring.rank, SIZES[-1], DTYPES[-1]))  # inputs untouched
    return out


def nested_battery(ring):
    r = ring.rank
    data = {"w": np.full((2, 3), r, np.float32), "b": [r, 2.5 * r, True, None],
            "t": (np.int64(r), Point(np.float64(r), np.arange(5) + r)),
            "big": np.arange(40_000, dtype=np.float64) * (r + 1), "scalar": np.array(float(r))}
    out = {op: ring.all_reduce(data, op=op) for op in OPS}
    out["ring"] = ring.all_reduce(data, algorithm="ring")
    out["number"] = ring.all_reduce(r + 1)
    out["number_mean"] = ring.all_reduce(r + 1, op="mean")
    out["rs"] = ring.reduce_scatter({"a": np.arange(10.0) + r, "b": [np.arange(7) * r, 5]})
    errors = []
    for bad, kwargs in ((["text"], {}), (np.zeros(2), {"op": "prod"}), (np.zeros(2), {"algorithm": "x"}),
                        (np.zeros(2, bool), {"op": "mean"})):
        try:
            ring.all_reduce(bad, **kwargs)
        except (TypeError, ValueError) as exc:
            errors.append(type(exc).__name__)
    out["errors"] = errors
    out["after_errors"] = ring.all_reduce(1)   # argument errors do not break the ring
    out["identity"] = (ring.rank, ring.world_size, ring.local_rank, ring.local_world_size,
                       ring.is_global_zero)
    return out


class Thing:
    def __init__(self, value):
        self.value = value

    def __eq__(self, other):
        return isinstance(other, Thing) and other.value == self.value


def objects_battery(ring):
    r, n = ring.rank, ring.world_size
    out = {}
    src = n - 1
    obj = {"thing": Thing(r), "fn": len, "array": np.arange(100_000) + r, "text": "x" * r}
    out["bcast"] = ring.broadcast(obj if r == src else None, src=src)
    out["bcast0"] = ring.broadcast(("zero", r))
    # objects of different sizes per rank, one large
    mine = list(range(r)) if r else np.ones(200_000, np.uint8)
    out["gather"] = ring.all_gather(mine)
    # point to point: many messages around the ring, in order, with two tags
    right, left = (r + 1) % n, (r - 1) % n
    for i in range(50):
        ring.send((r, i), right)
        ring.send(("other", r, i), right, tag="other")
    ring.send(np.full(300_000, r, np.int32), right, tag="big")
    out["p2p"] = [ring.recv(left) for _ in range(50)]
    out["p2p_other"] = [ring.recv(left, tag="other") for _ in range(50)]
    out["p2p_big"] = ring.recv(left, tag="big")
    ring.send("me", r)
    out["self"] = ring.recv(r)
    t0 = time.monotonic()
    try:
        ring.recv(left, tag="never", timeout=0.3)
    except TimeoutError as exc:
        out["recv_timeout"] = (type(exc).__name__, time.monotonic() - t0)
    ring.barrier("end")
    return out


def print_and_order(ring, path):
    ring.print("hello from rank", ring.rank)
    with ring.rank_zero_first():
        if ring.rank == 0:
            with open(path, "w") as f:
                f.write("made by rank 0")
            return_value = "made"
        else:
            with open(path) as f:   # rank 0 finished its block first
                return_value = f.read()
    return return_value


def barrier_timeout(ring):
    if ring.rank == 0:
        t0 = time.monotonic()
        with pytest.raises(RingTimeoutError) as info:
            ring.barrier("late", timeout=0.5)
        elapsed = time.monotonic() - t0
        message = str(info.value)
        with pytest.raises(RingError, match="earlier barrier 'late' failed"):
            ring.all_reduce(1)       # the ring cannot line up after a timed-out collective
        ring.send("go", 1)           # point to point still works
        return message, elapsed, isinstance(info.value, fiberlite.TimeoutError)
    return ring.recv(0)


def die_during_collective(ring, size, catch):
    if ring.rank == 2:
        os.kill(os.getpid(), signal.SIGKILL)
    t0 = time.monotonic()
    try:
        ring.all_reduce(np.ones(size, np.float32))
        ring.all_reduce(np.ones(size, np.float32))
    except RingError as exc:
        if not catch:
            raise
        return str(exc), exc.rank, time.monotonic() - t0
    return "no error"


def fail_in_target(ring):
    if ring.rank == 1:
        raise ValueError("boom on rank one")
    ring.barrier()


def torch_battery(ring):
    import torch
    dist = ring.init_torch_distributed("gloo", timeout=30)
    t = torch.arange(6, dtype=torch.float32) * (ring.rank + 1)
    dist.all_reduce(t)
    ours = ring.all_reduce({"f": torch.ones(3, 2) * ring.rank, "i": torch.tensor([ring.rank]),
                            "bf": torch.full((4,), 1.5, dtype=torch.bfloat16)}, op="sum")
    return (t.tolist(), {k: (str(v.dtype), tuple(v.shape), v.tolist()) for k, v in ours.items()},
            dist.get_rank(), dist.get_world_size(), os.environ["MASTER_ADDR"], os.environ["LOCAL_RANK"])


def fail_first_initializer(path):
    try:
        fd = os.open(path, os.O_CREAT | os.O_EXCL | os.O_WRONLY)
    except FileExistsError:
        return
    os.close(fd)
    raise RuntimeError("initializer failed in one member")


def square(ring, x):
    return x * x + ring.rank



def results_and_reuse(ring):
    """Results stay intact while later reductions run; dropped ones give their memory back."""
    r, n = ring.rank, ring.world_size
    x = np.arange(1_000_000, dtype=np.float32) + r
    want = n * np.arange(1_000_000, dtype=np.float32) + sum(range(n))
    kept = ring.all_reduce(x.reshape(1000, 1000))
    view = ring.all_reduce(x)[10:20]           # only a view of this result is kept
    loop_addresses = []
    for step in range(4):                        # the usual loop: each result dropped in turn
        y = ring.all_reduce(x * (step + 1))
        assert np.array_equal(y, want * (step + 1))
        loop_addresses.append(y.__array_interface__["data"][0])
        del y
    mean = ring.all_reduce({"a": x, "b": x[:300_000].astype(np.float64)}, op="mean")
    shard = ring.reduce_scatter(x)
    owner = shard
    while isinstance(owner.base, np.ndarray):
        owner = owner.base
    return {"kept": np.array_equal(kept, want.reshape(1000, 1000)), "view": np.array_equal(view, want[10:20]),
            "distinct": len(set(loop_addresses)), "x": np.array_equal(x, np.arange(1_000_000, dtype=np.float32) + r),
            "mean": np.allclose(mean["a"], want / n) and np.allclose(mean["b"], (want / n)[:300_000]),
            "shard": np.array_equal(shard, np.array_split(want, n)[r]),
            "shard_owner_bytes": owner.nbytes == shard.nbytes}


def mismatched_sizes(ring):
    x = np.ones(100_000 + 20_000 * ring.rank, np.float32)   # every rank a different size
    try:
        ring.all_reduce(x, algorithm="ring")
    except ValueError as exc:
        return str(exc)
    return "no error"


def ring_path_timeout(ring):
    if ring.rank == 0:
        t0 = time.monotonic()
        try:
            ring.all_reduce(np.ones(1_000_000, np.float32))
        except RingTimeoutError as exc:
            ring.send("done", 1)
            return str(exc), time.monotonic() - t0
        return "no timeout", 0.0
    return ring.recv(0, timeout=30)     # rank 1 never joins the all-reduce

# -- tests --------------------------------------------------------------------------------------
@pytest.mark.parametrize("n", [2, 3])
def test_all_reduce_and_reduce_scatter_match_numpy(n):
    results = Ring(n, reduce_battery, initializer=small_chunks, timeout=30).run()
    for key, got0 in results[0].items():
        rs = key[0] == "rs"
        dtype, size, op, _ = key[1:] if rs else key
        want = reference([data_of(r, size, dtype) for r in range(n)], op)
        if rs:
            bounds = buffers.split_bounds(size, n)
            for r in range(n):
                assert_close(results[r][key], want[bounds[r]:bounds[r + 1]])
        else:
            assert_close(got0, want)
            for r in range(1, n):   # bit-identical on every rank
                assert np.array_equal(results[r][key], got0, equal_nan=True)


def test_nested_structures_numbers_and_types_four_ranks():
    n = 4
    results = Ring(n, nested_battery, timeout=30).run()
    out = results[1]
    s = out["sum"]
    assert set(s) == {"w", "b", "t", "big", "scalar"}
    np.testing.assert_array_equal(s["w"], np.full((2, 3), 6, np.float32))
    assert s["w"].dtype == np.float32
    assert s["b"] == [6, 15.0, 4, None] and type(s["b"][0]) is int and type(s["b"][1]) is float
    assert isinstance(s["t"], tuple) and isinstance(s["t"][1], Point)
    assert s["t"][0] == 6 and isinstance(s["t"][0], np.int64)
    assert s["t"][1].x == 6.0 and isinstance(s["t"][1].x, np.float64)
    np.testing.assert_array_equal(s["t"][1].y, np.arange(5) * 4 + 6)
    np.testing.assert_array_equal(s["big"], np.arange(40_000, dtype=np.float64) * 10)
    assert s["scalar"].shape == () and s["scalar"] == 6.0
    assert out["max"]["b"] == [3, 7.5, True, None] and out["max"]["b"][2] is True
    assert out["min"]["b"][:2] == [0, 0.0]
    mean = out["mean"]
    assert mean["b"][:2] == [1.5, 3.75] and mean["w"].dtype == np.float32
    np.testing.assert_allclose(mean["t"][1].y, np.arange(5) + 1.5)
    np.testing.assert_array_equal(out["ring"]["big"], s["big"])
    assert out["number"] == 10 and type(out["number"]) is int
    assert out["number_mean"] == 2.5
    assert out["errors"] == ["TypeError", "ValueError", "ValueError", "TypeError"]
    assert out["after_errors"] == 4
    # reduce_scatter of a nested structure: each leaf's shard, numpy.array_split layout
    a = np.arange(10.0) * 4 + 6
    b = np.arange(7) * 6
    for r in range(n):
        got = results[r]["rs"]
        np.testing.assert_array_equal(got["a"], np.array_split(a, n)[r])
        np.testing.assert_array_equal(got["b"][0], np.array_split(b, n)[r])
        np.testing.assert_array_equal(got["b"][1], np.array([20]) if r == 0 else np.array([], np.int64))
    assert [r["identity"] for r in results] == [(r, 4, r, 4, r == 0) for r in range(4)]


@pytest.mark.parametrize("n", [2, 4])
def test_broadcast_all_gather_and_point_to_point(n):
    results = Ring(n, objects_battery, timeout=30).run()
    for r, out in enumerate(results):
        b = out["bcast"]
        assert b["thing"] == Thing(n - 1) and b["fn"] is len and b["text"] == "x" * (n - 1)
        np.testing.assert_array_equal(b["array"], np.arange(100_000) + n - 1)
        assert out["bcast0"] == ("zero", 0)
        gathered = out["gather"]
        np.testing.assert_array_equal(gathered[0], np.ones(200_000, np.uint8))
        assert gathered[1:] == [list(range(k)) for k in range(1, n)]
        left = (r - 1) % n
        assert out["p2p"] == [(left, i) for i in range(50)]
        assert out["p2p_other"] == [("other", left, i) for i in range(50)]
        np.testing.assert_array_equal(out["p2p_big"], np.full(300_000, left, np.int32))
        assert out["self"] == "me"
        name, elapsed = out["recv_timeout"]
        assert name == "RingTimeoutError" and 0.25 <= elapsed < 5


def test_print_on_rank_zero_and_rank_zero_first(capfd, tmp_path):
    path = str(tmp_path / "made")
    results = Ring(3, print_and_order, args=(path,), timeout=30).run()
    assert results == ["made", "made by rank 0", "made by rank 0"]
    printed = capfd.readouterr().out
    assert "hello from rank 0" in printed
    assert "hello from rank 1" not in printed and "hello from rank 2" not in printed


def test_barrier_timeout_raises_timeout_error():
    (message, elapsed, is_mp_timeout), go = Ring(2, barrier_timeout, timeout=30).run()
    assert "barrier 'late' timed out" in message and "waiting for rank 1" in message
    assert 0.4 <= elapsed < 5
    assert is_mp_timeout and go == "go"


@pytest.mark.parametrize("size", [10, 3_000_000])   # the gather path and the ring path
def test_member_death_makes_others_raise_and_join_names_it(size):
    ring = Ring(4, die_during_collective, args=(size, True), timeout=40)
    ring.start()
    with pytest.raises(RingError) as info:
        ring.join()
    assert info.value.rank == 2 and info.value.exitcode == -signal.SIGKILL
    assert "rank 2 died" in str(info.value) and "SIGKILL" in str(info.value)
    reports = {r: ring._reports.get(r) for r in (0, 1, 3)}
    assert all(report and report[0] for report in reports.values()), (reports, ring.exitcodes)
    for message, culprit, elapsed in (report[1].unpack() for report in reports.values()):
        assert culprit == 2 and "rank 2 left the ring" in message
        assert elapsed < 10   # detected by a lost connection, far before the timeout


def test_member_death_uncaught_names_first_failure():
    ring = Ring(3, die_during_collective, args=(10, False), timeout=40)
    with pytest.raises(RingError, match=r"rank 2 died .*; ranks 0, 1 stopped because of it") as info:
        ring.run()
    assert info.value.rank == 2
    assert ring.exitcodes[:2] == [1, 1]


def test_exception_in_target_is_reported_with_its_cause():
    ring = Ring(3, fail_in_target, timeout=40)
    with pytest.raises(RingError, match="rank 1 failed with ValueError: boom on rank one") as info:
        ring.run()
    assert info.value.rank == 1 and info.value.exitcode == 1
    assert isinstance(info.value.__cause__, ValueError)
    assert "boom on rank one" in str(info.value.__cause__.__cause__)   # the remote traceback


def test_failure_before_rendezvous_releases_the_others(tmp_path):
    ring = Ring(3, square, args=(1,), initializer=fail_first_initializer,
                initargs=(str(tmp_path / "once"),), timeout=40)
    t0 = time.monotonic()
    with pytest.raises(RingError, match="failed with RuntimeError: initializer failed in one member") as info:
        ring.run()
    assert time.monotonic() - t0 < 20
    others = [r for r in range(3) if r != info.value.rank]
    assert [ring.exitcodes[r] for r in others] == [1, 1]   # released from the rendezvous with an error


def test_run_returns_results_by_rank_and_single_member_ring():
    assert fiberlite.Ring(3, square, args=(5,)).run() == [25, 26, 27]
    assert fiberlite.get_context().Ring(1, nested_battery).run()[0]["number"] == 1


def test_meta_on_target_is_carried_to_member_jobs():
    from fiberlite.meta import requests_of

    @fiberlite.meta(cpu=2, memory="1Gi")
    def target(ring):
        pass
    main = _MemberMain(None, 0, 1, target, (), {}, None, (), None)
    assert requests_of(main) == {"cpu": 2.0, "memory": 1 << 30}


def test_bad_arguments():
    with pytest.raises(ValueError, match="positive number of members"):
        Ring(0, square)
    with pytest.raises(TypeError, match="callable"):
        Ring(2, "not a function")


@pytest.mark.skipif(importlib.util.find_spec("torch") is None,
                    reason="torch is not installed (pip install torch==2.13.0)")
def test_init_torch_distributed_and_tensors():
    results = Ring(2, torch_battery, timeout=60).run()
    for r, (gloo, ours, rank, world, addr, local_rank) in enumerate(results):
        assert gloo == [0.0, 3.0, 6.0, 9.0, 12.0, 15.0]
        assert (rank, world, addr, local_rank) == (r, 2, "127.0.0.1", str(r))
        assert ours["f"] == ("torch.float32", (3, 2), [[1.0, 1.0]] * 3)
        assert ours["i"] == ("torch.int64", (1,), [1])
        assert ours["bf"] == ("torch.bfloat16", (4,), [3.0] * 4)


def test_training_example_matches_single_process():
    script = os.path.join(ROOT, "examples", "ring_training.py")
    proc = run_python(script, "--steps", "60", timeout=50, cwd=ROOT)
    assert proc.returncode == 0, proc.stderr
    ring_loss = float(re.search(r"final loss \(ring, 4 ranks\): (\S+)", proc.stdout).group(1))
    single = float(re.search(r"final loss \(single process\): +(\S+)", proc.stdout).group(1))
    assert abs(ring_loss - single) <= 1e-6 * abs(single)
    assert ring_loss < 0.69   # it trained


def test_results_are_not_overwritten_and_memory_is_reused():
    for r, out in enumerate(Ring(3, results_and_reuse, timeout=60).run()):
        assert out["kept"] and out["view"] and out["x"] and out["mean"] and out["shard"], (r, out)
        assert out["distinct"] == 1    # each dropped result's block came back for the next one
        assert out["shard_owner_bytes"]   # a shard does not keep the whole reduced buffer alive


def test_mismatched_sizes_on_the_ring_path_raise_on_every_rank():
    messages = Ring(3, mismatched_sizes, timeout=30).run()
    for r, message in enumerate(messages):
        left = (r - 1) % 3
        assert f"rank {left} passed {100_000 + 20_000 * left} values of float32" in message, message
        assert f"where {100_000 + 20_000 * r} values of float32 were expected" in message


def test_ring_path_collective_times_out():
    (message, elapsed), done = Ring(2, ring_path_timeout, timeout=1).run()
    assert "all_reduce timed out on rank 0 after 1 s (waiting for rank 1)" in message
    assert 0.9 <= elapsed < 10
    assert done == "done"


# -- the ring link on its own ----------------------------------------------------------------------
KEY = b"k" * 32


def connected_pair(key_of_1: bytes = KEY) -> tuple[NeighbourLink, NeighbourLink]:
    """Rank 0 and rank 1 of a two-member ring, both in this process."""
    a, b = NeighbourLink("127.0.0.1"), NeighbourLink("127.0.0.1")
    errors = []

    def connect(link, rank, other, key):
        try:
            link.connect(rank, 2, other.address, key, time.monotonic() + 20)
        except BaseException as exc:
            errors.append(exc)
            link.abort()
    threads = [threading.Thread(target=connect, args=(a, 0, b, KEY)),
               threading.Thread(target=connect, args=(b, 1, a, key_of_1))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    if errors:
        a.close()
        b.close()
        raise errors[0]
    return a, b


def test_link_moves_bytes_in_order_whatever_the_cut():
    a, b = connected_pair()
    try:
        parts = [np.arange(5, dtype=np.int64), np.arange(7, dtype=np.float32), np.zeros(0, np.uint8),
                 np.arange(300_000, dtype=np.float64)]
        sent = b"".join(p.tobytes() for p in parts)
        for p in parts:
            ticket = a.send(p)
        # the receiver cuts the stream its own way
        targets = [np.empty(3, np.uint8), np.empty(61, np.uint8), np.empty(len(sent) - 64, np.uint8)]
        tickets = [b.receive(t) for t in targets]
        b.wait_received(tickets[-1], time.monotonic() + 20)
        a.wait_sent(ticket, time.monotonic() + 20)
        assert b"".join(t.tobytes() for t in targets) == sent
        # and the other way round
        back = np.empty(4, np.int32)
        b.wait_sent(b.send(np.array([1, 2, 3, 4], np.int32)), time.monotonic() + 20)
        a.wait_received(a.receive(back), time.monotonic() + 20)
        assert back.tolist() == [1, 2, 3, 4]
    finally:
        a.close()
        b.close()


def _connect_both(a: NeighbourLink, b: NeighbourLink, seconds: float) -> tuple[list, list]:
    """Connect ``a`` (rank 0) and ``b`` (rank 1) on two threads: (the threads, errors)."""
    errors: list = []

    def connect(link, rank, other):
        try:
            link.connect(rank, 2, other.address, KEY, time.monotonic() + seconds)
        except BaseException as exc:
            errors.append(exc)
    threads = [threading.Thread(target=connect, args=(a, 0, b)), threading.Thread(target=connect, args=(b, 1, a))]
    for t in threads:
        t.start()
    return threads, errors


def test_link_rejects_a_peer_without_the_key_and_still_connects_the_neighbour():
    b = NeighbourLink("127.0.0.1")
    intruder = socket.create_connection(("127.0.0.1", int(b.address.rsplit(":", 1)[1])))
    intruder.settimeout(20)
    a = NeighbourLink("127.0.0.1")
    threads, errors = _connect_both(a, b, 20)
    try:
        # the intruder is first in b's queue: it gets a challenge, fails the proof, is closed
        nonce, challenge = say_hello(intruder)
        assert auth.check_challenge(b"wrong key" * 4, challenge, nonce) is None
        intruder.sendall(auth.PROOF + b"\0" * auth.DIGEST_SIZE)
        assert intruder.recv(4096) == b""      # closed without a welcome
        for t in threads:
            t.join()
        assert not errors, errors
        a.wait_sent(a.send(np.arange(10)), time.monotonic() + 20)
        got = np.empty(10, np.int64)
        b.wait_received(b.receive(got), time.monotonic() + 20)
        assert got.tolist() == list(range(10))
    finally:
        intruder.close()
        for t in threads:
            t.join()
        a.close()
        b.close()


def test_link_connects_the_neighbour_while_another_connection_stays_silent(monkeypatch):
    # a connection that never speaks must not hold up the one behind it until the
    # handshake's timeout (made far longer than this test may take)
    monkeypatch.setattr(ringlink, "HANDSHAKE_SECONDS", 600.0)
    b = NeighbourLink("127.0.0.1")
    silent = socket.create_connection(("127.0.0.1", int(b.address.rsplit(":", 1)[1])))
    a = NeighbourLink("127.0.0.1")
    threads, errors = _connect_both(a, b, 600)
    try:
        for t in threads:
            t.join(60)
        assert not any(t.is_alive() for t in threads), "the silent connection held up the ring link"
        assert not errors, errors
        b.wait_sent(b.send(np.arange(3)), time.monotonic() + 20)
        got = np.empty(3, np.int64)
        a.wait_received(a.receive(got), time.monotonic() + 20)
        assert got.tolist() == [0, 1, 2]
    finally:
        a.close()
        b.close()      # also ends the silent connection's handshake
        assert silent.recv(16) == b""
        silent.close()


def test_link_connects_the_neighbour_through_a_flood_of_silent_connections(monkeypatch):
    # more silent connections than are checked at once: the least advanced are cut off,
    # so the flood holds a bounded number of descriptors and the neighbour still gets in
    monkeypatch.setattr(ringlink, "HANDSHAKE_SECONDS", 600.0)
    b = NeighbourLink("127.0.0.1")
    port = int(b.address.rsplit(":", 1)[1])
    flood = []
    a = NeighbourLink("127.0.0.1")
    try:
        for _ in range(300):
            s = socket.socket()
            s.setblocking(False)
            s.connect_ex(("127.0.0.1", port))
            flood.append(s)
        joining, errors = _connect_both(a, b, 60)
        for t in joining:
            t.join(90)
        assert not errors, errors
        b.wait_sent(b.send(np.arange(3)), time.monotonic() + 20)
        got = np.empty(3, np.int64)
        a.wait_received(a.receive(got), time.monotonic() + 20)
        assert got.tolist() == [0, 1, 2]
        # connections b holds (the left neighbour's among them), by the descriptors of this process
        held = [c for c in psutil.Process().net_connections(kind="tcp")
                if c.laddr and c.laddr.port == port and c.status != psutil.CONN_LISTEN]
        assert len(held) <= ringlink.HANDSHAKES_AT_ONCE + 1
    finally:
        for s in flood:
            s.close()
        a.close()
        b.close()


def test_link_with_another_key_does_not_connect():
    with pytest.raises(ConnectionError):
        connected_pair(key_of_1=b"x" * 32)


def test_link_abort_timeout_and_a_closed_neighbour():
    a, b = connected_pair()
    try:
        with pytest.raises(TimeoutError):
            a.wait_received(a.receive(np.empty(8, np.uint8)), time.monotonic() + 0.2)
        outcome = []

        def waiter():
            try:
                b.wait_received(b.receive(np.empty(8, np.uint8)))
            except NeighbourLinkLost as exc:
                outcome.append(exc)
        thread = threading.Thread(target=waiter)
        thread.start()
        b.abort()                               # wakes the waiting thread
        thread.join(20)
        assert not thread.is_alive() and isinstance(outcome[0], NeighbourLinkLost) and outcome[0].rank == 0
        with pytest.raises(NeighbourLinkLost):  # and fails what comes later
            b.wait_sent(b.send(np.ones(4)))
        b.close()                               # a sees its neighbour's connection end
        with pytest.raises(NeighbourLinkLost) as info:
            a.wait_received(a.receive(np.empty(1 << 20, np.uint8)), time.monotonic() + 20)
        assert info.value.rank == 1
    finally:
        a.close()
        b.close()


def test_buffers_reuse_only_blocks_nobody_refers_to():
    pool = buffers.Buffers(max_blocks=2)
    first = pool.empty(1 << 20, np.float32)
    address = first.__array_interface__["data"][0]
    view = first[5:10].reshape(5, 1)
    del first
    second = pool.empty(1 << 20, np.float32)     # the view keeps the first block in use
    assert not np.shares_memory(second, view)
    del view
    third = pool.empty(1 << 20, np.int32)        # the first block is free again
    assert third.__array_interface__["data"][0] == address and third.dtype == np.int32
    held = memoryview(third)
    del third
    fourth = pool.empty(1 << 20, np.float32)     # a memoryview holds the block too
    assert fourth.__array_interface__["data"][0] != address
    del held, second, fourth
    assert len(pool._blocks) == 2
    pool.empty(4 << 20, np.float32)              # a size no block fits: the pool stays at 2
    assert len(pool._blocks) == 2
    small = pool.empty(10, np.float32)           # small arrays are not pooled
    assert small.base is None and len(pool._blocks) == 2
