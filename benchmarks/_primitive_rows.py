"""The rows of ``bench_primitives.py``: for each, the objects and children one library's
side sets up (a *fixture*), what one unit of work is, and its target.

The children are module-level functions, imported by name by a ``multiprocessing``
spawn child and by a fiberlite job alike. Each waits for a count on its control pipe,
does that much work, answers when the parent needs to know it is done, and ends at None.
"""
from __future__ import annotations

import os
import socket
import time
from dataclasses import dataclass
from typing import Any, Callable

from bench_queue_latency import pipe_echo  # sends back what it gets, until None

NUMPY_ITEMS = 1000


def one_line(exc: BaseException) -> str:
    """``exc`` as one short line: its type and the first line of its message."""
    text = str(exc).strip().splitlines()
    line = f"{type(exc).__name__}: {text[0]}" if text else type(exc).__name__
    return line if len(line) <= 160 else line[:157] + "..."


# -- children ------------------------------------------------------------------------------
def increment(value: Any, control: Any) -> None:
    lock = value.get_lock()
    while (count := control.recv()) is not None:
        for _ in range(count):
            with lock:
                value.value += 1
        control.send(count)


def event_echo(ping: Any, pong: Any, control: Any) -> None:
    wait, clear, answer = ping.wait, ping.clear, pong.set
    while (count := control.recv()) is not None:
        for _ in range(count):
            wait()
            clear()
            answer()


def produce(items: Any, item: Any, control: Any) -> None:
    put = items.put
    while (count := control.recv()) is not None:
        for _ in range(count):
            put(item)


def barrier_party(barrier: Any, control: Any) -> None:
    wait = barrier.wait
    while (count := control.recv()) is not None:
        for _ in range(count):
            wait()
        control.send(count)


def condition_echo(condition: Any, control: Any) -> None:
    while (count := control.recv()) is not None:
        with condition:
            condition.notify()
            for _ in range(count):
                condition.wait()
                condition.notify()


def tcp_echo(port: int, control: Any) -> None:
    """Connect to the parent's TCP port and send back each message until it closes."""
    sock = socket.create_connection(("127.0.0.1", port))
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    while (data := sock.recv(64)):
        sock.sendall(data)
    sock.close()


def numpy_write(array: Any, control: Any) -> None:
    """Write 0, 1, 2, ... into ``array`` through a numpy view of its buffer; say how it went."""
    try:
        import numpy
        view = numpy.frombuffer(array.get_obj())
        view[:] = numpy.arange(len(view), dtype=view.dtype)
        control.send("works")
    except Exception as exc:  # the cell of the table says what went wrong
        control.send("fails: " + one_line(exc))


# -- placement: which CPU runs which process ------------------------------------------------
PLACES = {  # --place: what each says, in the help and in the table's note
    "apart": "each side on one CPU and its children on another, as two machines with a CPU each",
    "together": "each side and its children on one CPU",
    "free": "where the scheduler put them",
}


def each_thread(pid: int, act: Callable[[int], Any]) -> list[Any]:
    """``act(tid)`` for every thread of process ``pid`` (one that just ended is skipped)."""
    done = []
    for tid in os.listdir(f"/proc/{pid}/task"):
        try:
            done.append(act(int(tid)))
        except (ProcessLookupError, FileNotFoundError):
            pass
    return done


def pin(pid: int, cpus: set[int]) -> None:
    """Run every thread of process ``pid`` on ``cpus`` (threads it starts later inherit it)."""
    each_thread(pid, lambda tid: os.sched_setaffinity(tid, cpus))


def cpus_of(pid: int) -> list[int]:
    """The CPUs any thread of process ``pid`` may run on."""
    return sorted(set().union(*each_thread(pid, os.sched_getaffinity)))


def cpus_for(place: str, allowed: set[int]) -> tuple[set[int], set[int]]:
    """``(the side's CPUs, its children's)`` for ``place``, among the ``allowed`` ones."""
    if place == "free":
        return allowed, allowed
    if not hasattr(os, "sched_setaffinity"):
        raise RuntimeError(f"--place {place} needs os.sched_setaffinity (Linux); use --place free")
    first, *rest = sorted(allowed)
    if place == "together":
        return {first}, {first}
    if not rest:
        raise RuntimeError("--place apart needs two CPUs and this process may use one; use --place together")
    return {first}, {rest[0]}


class Fixture:
    """A row set up on one side; ``run(count)`` returns the seconds ``count`` units took."""

    per = 1  # units of work in one count (two children each increment once)

    def __init__(self, ctx: Any) -> None:
        self.ctx = ctx
        self.children: list[tuple[Any, Any]] = []  # (process, the parent's end of its pipe)

    def start(self, target: Callable, *args: Any) -> Any:
        """Start a child running ``target(*args, control)``; return the parent's end of
        ``control``, a ``Pipe`` (``close()`` sends None on it, then joins the child)."""
        mine, theirs = self.ctx.Pipe()
        child = self.ctx.Process(target=target, args=(*args, theirs), daemon=True)
        child.start()
        self.children.append((child, mine))
        return mine

    def run(self, count: int) -> float:
        raise NotImplementedError

    def place(self, place: str, allowed: set[int]) -> tuple[list[int], list[int]]:
        """Put this process and its children on the CPUs ``place`` says (:func:`cpus_for`);
        return the CPUs their threads may run on now: ``(this process's, its children's)``."""
        if place != "free":  # (free: nothing pinned, which works where there is no affinity)
            mine, theirs = cpus_for(place, allowed)
            pin(os.getpid(), mine)
            for child, _ in self.children:
                pin(child.pid, theirs)
        if not os.path.isdir(f"/proc/{os.getpid()}/task"):
            return [], []
        return cpus_of(os.getpid()), sorted({cpu for child, _ in self.children for cpu in cpus_of(child.pid)})

    def close(self) -> None:
        for _, control in self.children:
            try:
                control.send(None)
            except Exception:
                pass
        for child, _ in self.children:
            child.join(10)
            if child.is_alive():
                child.terminate()
                child.join(10)


class Contended(Fixture):
    """``with lock: value.value += 1`` in two children at once; every increment counted."""

    per = 2

    def __init__(self, ctx: Any) -> None:
        super().__init__(ctx)
        self.value = ctx.Value("i", 0)
        self.controls = [self.start(increment, self.value) for _ in range(2)]

    def run(self, count: int) -> float:
        before = self.value.value
        start = time.perf_counter()
        for control in self.controls:
            control.send(count)
        for control in self.controls:
            control.recv()
        elapsed = time.perf_counter() - start
        total = self.value.value - before
        if total != 2 * count:
            raise RuntimeError(f"the value grew by {total}, not by the {2 * count} increments made")
        return elapsed


class LockPairs(Fixture):
    """``acquire(); release()`` in the process that created the lock."""

    def __init__(self, ctx: Any, kind: str = "Lock") -> None:
        super().__init__(ctx)
        self.lock = getattr(ctx, kind)()

    def run(self, count: int) -> float:
        acquire, release = self.lock.acquire, self.lock.release
        start = time.perf_counter()
        for _ in range(count):
            acquire()
            release()
        return time.perf_counter() - start


class Reads(Fixture):
    """``obj.value`` or ``obj[5]`` read in the creating process."""

    def __init__(self, ctx: Any, what: str) -> None:
        super().__init__(ctx)
        self.what = what
        if what == "value":
            self.obj = ctx.Value("i", 7)
        else:
            self.obj = ctx.Array("i", range(10), lock=(what == "locked"))

    def run(self, count: int) -> float:
        obj = self.obj
        start = time.perf_counter()
        if self.what == "value":
            for _ in range(count):
                obj.value
        else:
            for _ in range(count):
                obj[5]
        return time.perf_counter() - start


class EventPingPong(Fixture):
    """The parent sets ``ping`` and waits for ``pong``; the child the other way round."""

    def __init__(self, ctx: Any) -> None:
        super().__init__(ctx)
        self.ping, self.pong = ctx.Event(), ctx.Event()
        self.control = self.start(event_echo, self.ping, self.pong)

    def run(self, count: int) -> float:
        ping, wait, clear = self.ping.set, self.pong.wait, self.pong.clear
        self.control.send(count)
        start = time.perf_counter()
        for _ in range(count):
            ping()
            wait()
            clear()
        return time.perf_counter() - start


class PipeRoundTrip(Fixture):
    """A small object sent to the child on a ``Pipe`` and sent back."""

    def __init__(self, ctx: Any) -> None:
        super().__init__(ctx)
        self.conn = self.start(pipe_echo)  # the echo ends at None, as every child does

    def run(self, count: int) -> float:
        send, recv, item = self.conn.send, self.conn.recv, ("ping", 1)
        start = time.perf_counter()
        for _ in range(count):
            send(item)
            recv()
        return time.perf_counter() - start


class TcpRoundTrip(Fixture):
    """The network's floor: 16 bytes sent to a child on a plain TCP connection (loopback,
    ``TCP_NODELAY``) and sent back, by the same kind of processes as the other rows."""

    def __init__(self, ctx: Any) -> None:
        super().__init__(ctx)
        listening = socket.create_server(("127.0.0.1", 0))
        self.start(tcp_echo, listening.getsockname()[1])
        listening.settimeout(60)
        self.sock, _ = listening.accept()
        listening.close()
        self.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)

    def run(self, count: int) -> float:
        send, recv, item = self.sock.sendall, self.sock.recv, b"x" * 16
        start = time.perf_counter()
        for _ in range(count):
            send(item)
            recv(64)
        return time.perf_counter() - start

    def close(self) -> None:
        self.sock.close()
        super().close()


class QueueThroughput(Fixture):
    """The child puts ``count`` items into a ``Queue``; the parent gets them all."""

    def __init__(self, ctx: Any, item: Any) -> None:
        super().__init__(ctx)
        self.items = ctx.Queue()
        self.control = self.start(produce, self.items, item)

    def run(self, count: int) -> float:
        get = self.items.get
        start = time.perf_counter()
        self.control.send(count)
        for _ in range(count):
            get()
        return time.perf_counter() - start


class ConditionPingPong(Fixture):
    """``notify(); wait()`` in turn with a child, as mp_benchmarks.py's condition test."""

    def __init__(self, ctx: Any) -> None:
        super().__init__(ctx)
        self.condition = ctx.Condition()
        self.control = self.start(condition_echo, self.condition)

    def run(self, count: int) -> float:
        condition = self.condition
        notify, wait = condition.notify, condition.wait
        with condition:
            self.control.send(count)
            wait()  # the child holds the condition's lock now and then
            start = time.perf_counter()
            for _ in range(count):
                notify()
                wait()
            return time.perf_counter() - start


class BarrierRounds(Fixture):
    """Rounds of a ``Barrier`` of four: the parent and three children, each waiting once a
    round (the round ends when its last party has passed it)."""

    def __init__(self, ctx: Any, children: int = 3) -> None:
        super().__init__(ctx)
        self.barrier = ctx.Barrier(children + 1)
        self.controls = [self.start(barrier_party, self.barrier) for _ in range(children)]

    def run(self, count: int) -> float:
        wait = self.barrier.wait
        for control in self.controls:
            control.send(count)
        start = time.perf_counter()
        for _ in range(count):
            wait()
        for control in self.controls:
            control.recv()
        return time.perf_counter() - start


class NumpyView(Fixture):
    """A child writes into an ``Array('d')`` through ``numpy.frombuffer(arr.get_obj())``."""

    def __init__(self, ctx: Any) -> None:
        super().__init__(ctx)
        self.array = ctx.Array("d", NUMPY_ITEMS)
        self.control = self.start(numpy_write, self.array)

    def status(self) -> str:
        told = self.control.recv()
        if told != "works":
            return told
        seen = list(self.array[:])
        if seen != [float(i) for i in range(NUMPY_ITEMS)]:
            wrong = next(i for i, x in enumerate(seen) if x != i)
            return f"fails: the parent reads {seen[wrong]} at [{wrong}], the child wrote {float(wrong)}"
        return "works"


# -- the rows ------------------------------------------------------------------------------
@dataclass
class Spec:
    """One row of the table: how to set it up, what one unit is, its target (if any)."""

    key: str
    title: str
    unit: str
    make: Callable[[Any], Fixture]
    target: str = "-"  # on the ratio fiberlite / stdlib
    limit: float | None = None  # the target's bound
    rate: bool = False  # shown as units per second: higher is better
    check: bool = False  # works or fails, not timed
    # across machines (share_machine off): at most this many TCP round trips, or for a
    # rate row at least this many units per second
    remote: float | None = None


SPECS = [
    Spec("tcp", "raw TCP round trip parent <-> child (the floor)", "round trip", TcpRoundTrip),
    Spec("value_increment", "Value += 1 under its lock, 2 children", "increment", Contended,
         "<= 2x", 2.0, remote=5.0),
    Spec("lock", "Lock acquire+release, creating process", "pair", LockPairs, "<= 3x", 3.0),
    Spec("rlock", "RLock acquire+release, creating process", "pair", lambda c: LockPairs(c, "RLock")),
    Spec("value_read", "Value.value read, creating process", "read", lambda c: Reads(c, "value")),
    Spec("event", "Event ping-pong parent <-> child", "round trip", EventPingPong, "<= 1.5x", 1.5,
         remote=2.5),
    Spec("pipe", "Pipe round trip, small object", "round trip", PipeRoundTrip, "<= 1.0x", 1.0,
         remote=1.5),
    Spec("queue_small", "Queue child -> parent, small items", "item",
         lambda c: QueueThroughput(c, 1), ">= 1.0x", 1.0, rate=True, remote=100_000),
    Spec("queue_256", "Queue child -> parent, 256-byte str", "item",
         lambda c: QueueThroughput(c, "0" * 256), ">= 1.0x", 1.0, rate=True),
    Spec("numpy", "numpy.frombuffer(arr.get_obj()) in a child", "check", NumpyView, "works",
         check=True),
    Spec("array_nolock", "Array('i', lock=False)[5] read", "read", lambda c: Reads(c, "unlocked")),
    Spec("array_lock", "Array('i', lock=True)[5] read", "read", lambda c: Reads(c, "locked")),
    Spec("condition", "Condition notify/wait parent <-> child", "round trip", ConditionPingPong),
    Spec("barrier", "Barrier of 4 (parent + 3 children), one round", "round", BarrierRounds),
]
BY_KEY = {spec.key: spec for spec in SPECS}
